"""What a backtest found, folded from its audit rows and its paper fills (sans-I/O).

The report answers the question hooks exist for: how often would this agent
have woken the LLM, what would that have cost, and how does it compare with
an agent woken by a timer every N minutes over the same stretch of market
time. Costs are estimates: runs x tokens per run x price per million tokens.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from daemon.audit.render import price_text
from daemon.errors import NOT_JSON
from daemon.events import parse_iso_ms
from daemon.trading.matching import FillCosts, apply_fill
from daemon.trading.paper_store import FillRow


class CostModel(msgspec.Struct, frozen=True, kw_only=True):
    """How a run is priced: tokens in and out per run at prices per million tokens,
    or the mean cost of the agent's real runs (``measured_per_run``, from ``source``)."""

    tokens_in_per_run: int = 6000
    tokens_out_per_run: int = 800
    price_input_per_mtok: float = 3.0
    price_output_per_mtok: float = 15.0
    measured_per_run: float | None = None
    measured_runs: int = 0
    source: str = "estimate"
    # Priced by the backtest's own LLM runs at what they cost (--run-llm): not an estimate.
    actual: bool = False

    @property
    def label(self) -> str:
        """How the report names the cost."""
        return "LLM cost" if self.actual else "estimated LLM cost"

    def cost(self, runs: int) -> float:
        """The cost of ``runs`` runs."""
        per_run = self.measured_per_run
        if per_run is None:
            per_run = (
                self.tokens_in_per_run * self.price_input_per_mtok
                + self.tokens_out_per_run * self.price_output_per_mtok
            ) / 1e6
        return round(runs * per_run, 6)


def run_spends(rows: Iterable[dict[str, Any]], agent: str) -> list[RunSpend]:
    """What each of ``agent``'s finished LLM runs in ``rows`` (audit records) spent
    (a damaged ``llm`` part is skipped)."""
    spends = []
    for r in rows:
        llm = r.get("llm")
        if r.get("type") != "run" or r.get("agentId") != agent or r.get("status") != "finished":
            continue
        try:
            spends.append(msgspec.convert(llm, RunSpend))
        except msgspec.ValidationError:
            continue  # not an LLM run (null), or not one this version can read
    return spends


def measured(model: CostModel, costs: Sequence[float], where: str) -> CostModel:
    """``model`` priced by the mean of ``costs`` (real runs' costs, found in
    ``where``); unchanged when there are none."""
    if not costs:
        return model
    return msgspec.structs.replace(
        model,
        measured_per_run=round(sum(costs) / len(costs), 8),
        measured_runs=len(costs),
        source=f"mean of {len(costs)} LLM runs in {where}",
    )


def priced_by_runs(
    model: CostModel, runs: Sequence[RunSpend], where: str, *, actual: bool = True
) -> CostModel:
    """``model`` priced by real LLM runs: their mean cost (``actual``: this backtest's
    own runs, the report's cost is not an estimate); runs that cost nothing (a runner
    without prices, e.g. a local model) give their mean tokens instead, at
    ``model``'s prices, so the comparison with a timer agent still says something."""
    if not runs:
        return model
    costs = [r.cost or 0.0 for r in runs]
    if sum(costs) > 0:
        return msgspec.structs.replace(measured(model, costs, where), actual=actual)
    n = len(runs)
    return msgspec.structs.replace(
        model,
        tokens_in_per_run=round(sum(r.tokens_in for r in runs) / n),
        tokens_out_per_run=round(sum(r.tokens_out for r in runs) / n),
        source=(
            f"mean tokens of {n} LLM runs in {where} (priced at 0 there), at "
            f"{model.price_input_per_mtok:g} / {model.price_output_per_mtok:g} per million"
        ),
    )


def counted(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless one: "1 run", "3 runs"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class HookSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One hook revision's evaluations and decisions."""

    hook: str
    revision: str
    evaluations: int
    decisions: dict[str, int]
    errors: int
    suppressed: dict[str, int]
    first_error: str = ""  # the first failed evaluation's error, as audited
    # Evaluations the breaker skipped (backing off after a failure, or paused: in a
    # backtest nobody resumes a hook, so a pause lasts to the end of the data).
    skipped: dict[str, int] = {}
    paused_from: str = ""  # event time of the first evaluation skipped as paused
    # Errors that were the sandbox's wall-clock timeout: the one outcome of a replay
    # that depends on how busy the machine was, so a rerun may decide differently.
    timeouts: int = 0

    def failed(self) -> str:
        """The errors, how many were timeouts, and the first error ("" when none)."""
        if not self.errors:
            return ""
        text = counted(self.errors, "error")
        if self.timeouts:
            share = (
                "a timeout" if self.errors == 1
                else "all timeouts" if self.timeouts == self.errors
                else f"{self.timeouts} of them timeouts"
            )  # fmt: skip
            text += (
                f", {share} (wall clock: a busier machine can change "
                "this run's decisions; give the hook more time: backtest --hook-timeout-ms, or [hooks.sandbox] "
                "timeout_ms live)"
            )
        return text + (f" (first: {self.first_error})" if self.first_error else "")

    def not_run(self) -> str:
        """The evaluations the breaker skipped, and since when a paused hook stayed off."""
        text = "not run: " + ", ".join(f"{k} {v}" for k, v in self.skipped.items())
        if self.paused_from:
            text += f" (paused from {self.paused_from} to the end: fix the hook and run again)"
        return text


class BrokenHook(msgspec.Struct, frozen=True, kw_only=True):
    """A hook revision that never ran: it did not compile."""

    hook: str
    revision: str
    error: str


class Trades(msgspec.Struct, frozen=True, kw_only=True):
    """The agent's paper account over the backtest (realized PnL of closing fills)."""

    fills: int = 0
    closing_fills: int = 0
    wins: int = 0
    realized_pnl: float = 0.0
    max_drawdown: float = 0.0
    win_rate: float = 0.0
    exposure: float = 0.0
    fees: float = 0.0
    # Marked to market at every candle close (open positions at that close): the
    # deepest fall from a peak, and the open positions' PnL at the end.
    max_drawdown_marked: float = 0.0
    unrealized_at_end: float = 0.0
    # Of the closing fills (net of their fees): the mean win and loss, the largest
    # loss, and gross wins over gross losses (None: no loss to divide by).
    avg_win: float = 0.0
    avg_loss: float = 0.0
    largest_loss: float = 0.0
    profit_factor: float | None = None


class WorkingOrder(msgspec.Struct, frozen=True, kw_only=True):
    """An entry order still working when the run ended: never filled, it may have
    held the agent's later entries back (a hook that waits for no open orders)."""

    symbol: str
    side: str
    order_type: str
    volume: float
    price: float | None
    since: str  # when it was placed (market time)

    def text(self) -> str:
        at = f" @ {price_text(self.price)}" if self.price is not None else ""
        return (
            f"{self.side} {self.order_type} {price_text(self.volume)} {self.symbol}{at}, "
            f"working since {self.since[:16].replace('T', ' ')}"
        )


class Baseline(msgspec.Struct, frozen=True, kw_only=True):
    """A timer agent woken every ``minutes`` over the same market time."""

    minutes: float
    runs: int
    cost: float


COVERS = "these figures cover only the events up to the last one shown"
RUNS_FAILED = "runs failed: "  # ``stopped_by`` of a --run-llm backtest whose runs all failed


class Report(msgspec.Struct, frozen=True, kw_only=True):
    """The backtest's findings (``report.json``)."""

    agent: str
    data: str
    events: int
    first_event: str
    last_event: str
    hooks: list[HookSummary]
    wakes: int
    runs: int
    wakes_suppressed: dict[str, int]
    cost_model: CostModel
    cost: float
    baseline: Baseline
    cost_ratio: float | None
    trades: Trades
    # The paper fills' costs the trades were simulated with (fees, slippage).
    fill_costs: FillCosts = FillCosts()
    broken: list[BrokenHook] = []  # hook revisions that did not compile (never ran)
    # Entry orders still working at the end, oldest first.
    working_at_end: list[WorkingOrder] = []
    seconds: float = 0.0
    events_per_second: float = 0.0
    # False: the replay ended before the data's end, for ``stopped_by``: "signal"
    # (Ctrl-C, SIGTERM) or the data's error; the figures cover first .. last_event.
    complete: bool = True
    stopped_by: str = ""
    # Recorded lines not replayed: a recording's account events (this run's broker
    # makes its own) and Coinbase messages with no ticks or candles (heartbeats, acks...).
    left_out: int = 0
    # CSV rows that repeated the row before them exactly (one candle: one event).
    duplicate_rows: int = 0
    # Events published again under an id already evaluated (files that overlap): the
    # agent skipped them, so ``events`` counts them and the hooks do not.
    repeated_events: int = 0
    # Runs that ended failed or timed out (a model that did not answer, a bad key).
    runs_failed: int = 0
    first_run_error: str = ""  # what the first of them said (an unreachable model...)
    # The risk engine's verdicts on the intents that reached it: approved, and the
    # rejected ones by reason code (an intent refused for two reasons counts twice).
    intents_approved: int = 0
    intents_rejected: int = 0
    rejected_by: dict[str, int] = {}
    # Nothing fell within --from/--to: when the data's events do run ("first .. last").
    data_span: str = ""
    # WAKE decisions collect mode merged into a run another one started: a run
    # answers them all at once (``runs`` counts it once).
    wakes_merged: int = 0

    def wake_fates(self) -> str:
        """Why the WAKE decisions outnumber the runs ("" when they do not): those
        merged into another's run, and those not run, by what stopped them."""
        fates = []
        if self.wakes_merged:
            fates.append(f"{self.wakes_merged} merged into another's run by collect mode")
        if self.wakes_suppressed:
            why = ", ".join(f"{k} {v}" for k, v in self.wakes_suppressed.items())
            fates.append(f"not run: {why}")
        return "; ".join(fates)

    def still_working(self) -> str:
        """The entry orders the run ended with, the oldest named ("" for none)."""
        held = self.working_at_end
        if not held:
            return ""
        return (
            f"{counted(len(held), 'entry order')}, the oldest a {held[0].text()} (never "
            "filled; it counts against max_open_orders and holds back a hook that waits "
            "for no working order)"
        )

    def verdicts(self) -> str:
        """The risk engine's verdicts in one line ("" when no intent reached it)."""
        if not self.intents_approved and not self.intents_rejected:
            return ""
        why = ", ".join(f"{k} {v}" for k, v in self.rejected_by.items())
        approved = counted(self.intents_approved, "intent")
        return f"{approved} approved, {self.intents_rejected} rejected" + (
            f" ({why})" if why else ""
        )

    def incomplete(self) -> tuple[str, str] | None:
        """(heading, explanation) of a report that covers part of the data only."""
        if self.complete:
            return None
        if self.stopped_by == "signal":
            return "INTERRUPTED", f"the replay was stopped before the end of the data; {COVERS}"
        if self.stopped_by.startswith(RUNS_FAILED):
            why = self.stopped_by.removeprefix(RUNS_FAILED)
            return "RUNS FAILING", f"{why}; stopped, as every run would; {COVERS}"
        return "DATA ERROR", f"the replay failed: {self.stopped_by}; {COVERS}"


class AuditRow(msgspec.Struct, frozen=True, rename="camel"):
    """What a report reads of an audit line: decoding only these (a year of 5m
    candles is ~300,000 hook rows) takes a fraction of decoding every row whole."""

    type: str = ""
    agent_id: str = ""
    hook_id: str | None = None
    revision: str | None = None
    decision: str | None = None
    suppressed_by: str | None = None
    error: str | None = None
    status: str | None = None
    event_ts: str | None = None
    event_id: str | None = None
    symbol: str | None = None
    llm: RunSpend | None = None
    wakes: int = 0  # run rows: the WAKE decisions the run answered
    dropped: int = 0  # wake rows: queued WAKE decisions dropped before their run started
    run_id: str | None = None  # wake rows: the run a wake was queued into; run rows
    outcome: str | None = None  # wake rows: woke, queued, suppressed
    approved: bool | None = None  # risk rows
    # A risk row's reasons are objects, a wake row's strings: decoded for risk rows only.
    reasons: msgspec.Raw = msgspec.Raw(b"[]")


class Reason(msgspec.Struct, frozen=True):
    """What a report reads of a risk row's reason: its code."""

    code: str = ""


class RunSpend(msgspec.Struct, frozen=True, rename="camel"):
    """What a report reads of a run's ``llm`` part."""

    cost: float | None = None
    tokens_in: int = 0
    tokens_out: int = 0


_row = msgspec.json.Decoder(AuditRow)
_reasons = msgspec.json.Decoder(list[Reason])

#: Audited errors that are not failures: the breaker's gates (hooks_runtime/breaker.py).
SKIPPED = ("backoff", "paused")


class Tally:
    """One pass over the audit: what the report needs of ``agent``'s rows, held in
    memory bounded by its hooks, symbols and acted-on decisions, not by its rows (a
    year of 5m candles is ~300,000 hook rows; a list of them was ~130 MB)."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self._evals: Counter[tuple[str, str]] = Counter()
        self._decisions: defaultdict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self._errors: Counter[tuple[str, str]] = Counter()
        self._first_errors: dict[tuple[str, str], str] = {}
        self._timeouts: Counter[tuple[str, str]] = Counter()
        self._skipped: defaultdict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self._paused_from: dict[tuple[str, str], str] = {}
        self._suppressed: defaultdict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        self.wakes = self.runs = self.runs_failed = 0
        self.first_run_error = ""
        self.merged = 0  # WAKE decisions that joined another's run (collect mode)
        self.approved = self.rejected = 0
        self._rejected_by: Counter[str] = Counter()
        self.llm_runs: list[RunSpend] = []  # the finished runs that ran a model
        self._wakes_suppressed: Counter[str] = Counter()
        self._first_ms: int | None = None  # the hook rows' first and last event times
        self._last_ms = 0
        # The last hook row's event time, parsed: an event's rows come together.
        self._ts: str | None = None
        self._ts_ms: int | None = None
        self.symbols: dict[str, None] = {}  # in the order the hooks first met them
        # (event time, symbol) of the WAKE and ALERT decisions that acted.
        self.acted: dict[str, list[tuple[int, str]]] = {"WAKE": [], "ALERT": []}
        # Where each event's WAKEs are in acted["WAKE"]: a wake dropped before its run
        # is taken out again, by the event its wake row names, or, summarized with
        # others on one row, by the run they were queued into (``_queued``: the events
        # of each run not started yet).
        self._woke: dict[str, list[int]] = {}
        self._unwoke: set[int] = set()
        self._queued: dict[str, list[str]] = {}

    def read(self, lines: Iterable[bytes]) -> Tally:
        """Add every line that is one of the agent's audit rows (others are skipped)."""
        for line in lines:
            try:
                row = _row.decode(line)
            except (*NOT_JSON, msgspec.ValidationError):
                continue
            if row.agent_id == self.agent:
                self.add(row)
        return self

    def add(self, rec: AuditRow) -> None:
        """Count one row: a hook row per hook revision (a WAKE's row says what the
        scheduler made of it as it was decided, its budget included); a wake row
        that dropped queued wakes; a finished run, and the wakes merged into it."""
        if rec.type == "run":
            self._queued.pop(rec.run_id or "", None)  # started: none of its wakes drops
            if rec.status != "started":
                self.runs += 1
                self.merged += max(0, rec.wakes - 1)
                if rec.status in ("failed", "timeout"):
                    self.runs_failed += 1
                    self.first_run_error = self.first_run_error or (rec.error or rec.status)
            if rec.status == "finished" and rec.llm is not None:
                self.llm_runs.append(rec.llm)
            return
        if rec.type == "risk":
            if rec.approved:
                self.approved += 1
            else:
                self.rejected += 1
                try:
                    reasons = _reasons.decode(rec.reasons)
                except msgspec.ValidationError:
                    reasons = []
                self._rejected_by.update(r.code for r in reasons)
            return
        if rec.type == "wake":
            # Queued as decided (so their hook rows say), not run after all: the agent
            # paused, the day's cost cap reached, or the agent removed, before their
            # run started.
            if rec.dropped > 0:
                self._wakes_suppressed[rec.suppressed_by or "none"] += rec.dropped
                self._undraw(rec)
            elif rec.outcome in ("woke", "queued") and rec.run_id and rec.event_id:
                self._queued.setdefault(rec.run_id, []).append(rec.event_id)
            return
        if rec.type != "hook":
            return
        key = (str(rec.hook_id), str(rec.revision))
        self._evals[key] += 1
        at = self._ts_ms
        if rec.event_ts != self._ts:
            self._ts, self._ts_ms = rec.event_ts, (at := _event_ms(rec.event_ts))
            if at is not None:
                self._first_ms = at if self._first_ms is None else min(self._first_ms, at)
                self._last_ms = max(self._last_ms, at)
        if rec.symbol:
            self.symbols.setdefault(rec.symbol)
        decision = rec.decision
        if decision is None:
            gate = (rec.error or "").partition(":")[0]
            if gate in SKIPPED:
                self._skipped[key][gate] += 1
                if gate == "paused":
                    self._paused_from.setdefault(key, rec.event_ts or "")
                return
            self._errors[key] += 1
            self._timeouts[key] += gate == "timeout"
            self._first_errors.setdefault(key, rec.error or "")
            return
        self._decisions[key][decision] += 1
        by = rec.suppressed_by or "none"
        if by != "none":
            self._suppressed[key][by] += 1
        if decision == "WAKE":
            self.wakes += 1
            if by != "none":
                self._wakes_suppressed[by] += 1
        if by == "none" and at is not None and decision in self.acted:
            if decision == "WAKE" and rec.event_id:
                self._woke.setdefault(rec.event_id, []).append(len(self.acted["WAKE"]))
            self.acted[decision].append((at, rec.symbol or ""))

    def _undraw(self, rec: AuditRow) -> None:
        """Take the wakes a wake row dropped off the page: the one it names, or, on a
        run's summary row (written after its detailed ones), the run's others."""
        queued = self._queued.get(rec.run_id or "", [])
        if rec.event_id:
            events = [rec.event_id]
            if rec.event_id in queued:
                queued.remove(rec.event_id)
        else:
            events = self._queued.pop(rec.run_id or "", [])[: rec.dropped]
        for event_id in events:
            drawn = self._woke.get(event_id)
            if drawn:
                self._unwoke.add(drawn.pop())

    def period(self) -> tuple[int, int] | None:
        """(first, last) event time of the hook rows: what the figures cover (None:
        no hook row had one)."""
        return None if self._first_ms is None else (self._first_ms, self._last_ms)

    def hooks(self) -> list[HookSummary]:
        """Per hook revision: evaluations, decisions by kind, errors, suppressions."""
        return [
            HookSummary(
                hook=hook,
                revision=revision,
                evaluations=n,
                decisions=dict(sorted(self._decisions.get((hook, revision), Counter()).items())),
                errors=self._errors[(hook, revision)],
                suppressed=dict(sorted(self._suppressed.get((hook, revision), Counter()).items())),
                first_error=self._first_errors.get((hook, revision), ""),
                skipped=dict(sorted(self._skipped.get((hook, revision), Counter()).items())),
                paused_from=self._paused_from.get((hook, revision), ""),
                timeouts=self._timeouts[(hook, revision)],
            )
            for (hook, revision), n in sorted(self._evals.items())
        ]

    def rejected_by(self) -> dict[str, int]:
        """Rejected intents by the risk engine's reason code, most frequent first."""
        return dict(self._rejected_by.most_common())

    def wakes_suppressed(self) -> dict[str, int]:
        """WAKE decisions that did not run, by why."""
        return dict(sorted(self._wakes_suppressed.items()))

    def markers(self, decision: str) -> list[tuple[int, str]]:
        """(event time, symbol) of the ``decision``s (WAKE, ALERT) that acted, in time
        order: a WAKE dropped before its run did not."""
        marks = self.acted[decision]
        if decision == "WAKE" and self._unwoke:
            marks = [m for i, m in enumerate(marks) if i not in self._unwoke]
        return sorted(marks)


def _event_ms(ts: str | None) -> int | None:
    if not ts:
        return None
    try:
        return parse_iso_ms(ts)
    except ValueError:
        return None


def trades_of(fills: Sequence[FillRow], first_ms: int = 0, last_ms: int = 0) -> Trades:
    """Fill statistics, in fill order; ``exposure`` is the share of [first, last]
    with a position open in any symbol (each symbol's quantity on its own: a long
    in one and a short in another are two positions, not none). PnL, drawdown and
    wins are net of the fills' fees (an opening fill's fee is a loss of its own)."""
    closing = wins = 0
    equity = peak = drawdown = fees = won = lost = worst = 0.0
    positions: dict[str, float] = {}
    opened_at: int | None = None
    exposed = 0
    for fill in fills:
        ts, pnl, fee = fill.ts_ms, fill.realized, fill.fee
        fees += fee
        was_open = bool(positions)
        held = positions.get(fill.symbol, 0.0) + fill.qty
        if abs(held) > 1e-12:
            positions[fill.symbol] = held
        else:
            positions.pop(fill.symbol, None)
        now_open = bool(positions)
        if now_open and not was_open:
            opened_at = ts
        elif was_open and not now_open and opened_at is not None:
            exposed += ts - opened_at
            opened_at = None
        equity += pnl - fee
        if pnl != 0:
            closing += 1
            net = pnl - fee
            if net > 0:
                wins += 1
                won += net
            else:
                lost -= net
                worst = min(worst, net)
        peak = max(peak, equity)
        drawdown = max(drawdown, peak - equity)
    if opened_at is not None:
        exposed += max(0, last_ms - opened_at)
    period = last_ms - first_ms
    return Trades(
        fills=len(fills),
        closing_fills=closing,
        wins=wins,
        realized_pnl=round(equity, 8),
        max_drawdown=round(drawdown, 8),
        win_rate=round(wins / closing, 4) if closing else 0.0,
        exposure=round(min(1.0, exposed / period), 4) if period > 0 else 0.0,
        fees=round(fees, 8),
        avg_win=round(won / wins, 8) if wins else 0.0,
        avg_loss=round(-lost / (closing - wins), 8) if closing > wins else 0.0,
        largest_loss=round(worst, 8),
        profit_factor=round(won / lost, 4) if lost > 0 else None,
    )


class MarkToMarket:
    """Equity marked to market at every close: realized PnL net of fees, plus each
    open position at its symbol's last close. Fills are taken in time order, those
    of a close's time before it (a decision on a candle fills at its close). The
    realized curve alone hides a position that goes deep under water and recovers
    before it closes."""

    def __init__(self, fills: Sequence[FillRow]) -> None:
        self._fills = sorted(fills, key=lambda f: f.ts_ms)  # stable: fill order within a time
        self._next = 0
        self._realized = 0.0
        self._held: dict[str, tuple[float, float]] = {}  # symbol -> (quantity, average price)
        self._marks: dict[str, float] = {}
        self._peak = 0.0
        self.max_drawdown = 0.0

    def close(self, ts_ms: int, symbol: str, price: float) -> float:
        """Take the fills up to ``ts_ms`` and ``symbol``'s close; the equity then."""
        fills = self._fills
        while self._next < len(fills) and fills[self._next].ts_ms <= ts_ms:
            f = fills[self._next]
            self._next += 1
            qty, avg = self._held.get(f.symbol, (0.0, 0.0))
            applied = apply_fill(qty, avg, f.qty, f.price)
            self._realized += f.realized - f.fee
            if abs(applied.quantity) > 1e-12:
                self._held[f.symbol] = (applied.quantity, applied.avg_price)
            else:
                self._held.pop(f.symbol, None)
        self._marks[symbol] = price
        equity = self._realized + self.unrealized()
        self._peak = max(self._peak, equity)
        self.max_drawdown = max(self.max_drawdown, self._peak - equity)
        return equity

    def unrealized(self) -> float:
        """The open positions at their last closes (at their average price before one)."""
        return sum((self._marks.get(s, avg) - avg) * qty for s, (qty, avg) in self._held.items())


def timer_baseline(first_ms: int, last_ms: int, minutes: float, model: CostModel) -> Baseline:
    """A timer agent's runs over [first, last]: one every ``minutes``, the first at
    ``first`` (so an hour at 3 minutes is 21 runs, 0 to 60 inclusive)."""
    period = max(0, last_ms - first_ms)
    runs = int(period // (minutes * 60_000)) + 1 if last_ms >= first_ms else 0
    return Baseline(minutes=minutes, runs=runs, cost=model.cost(runs))


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    """Two backtests over the same data (``report.json`` of ``--compare``): both
    reports, and B minus A for the figures that decide between them."""

    a: Report
    b: Report
    diff: dict[str, float]


COUNTS = frozenset({"wakes", "runs", "intents_rejected", "fills"})


def figure(name: str, value: float, sign: str = "") -> str:
    """A compared figure as a trader reads it: counts whole, money to the cent, the
    win rate in percent (its difference, ``sign`` "+", in percentage points)."""
    if name in COUNTS:
        return f"{value:{sign},.0f}"
    if name == "win_rate":
        return f"{value * 100:+.1f} pp" if sign else f"{value:.1%}"
    return f"{value:{sign},.2f}"


def figures(a: Report, b: Report) -> dict[str, tuple[float, float]]:
    """The figures a comparison puts side by side: name -> (A, B)."""
    return {
        "wakes": (a.wakes, b.wakes),
        "runs": (a.runs, b.runs),
        "cost": (a.cost, b.cost),
        "intents_rejected": (a.intents_rejected, b.intents_rejected),
        "fills": (a.trades.fills, b.trades.fills),
        "realized_pnl": (a.trades.realized_pnl, b.trades.realized_pnl),
        "max_drawdown": (a.trades.max_drawdown, b.trades.max_drawdown),
        "max_drawdown_marked": (a.trades.max_drawdown_marked, b.trades.max_drawdown_marked),
        "win_rate": (a.trades.win_rate, b.trades.win_rate),
    }


def compare(a: Report, b: Report) -> Comparison:
    """Both reports and their differences (B - A)."""
    diff = {k: round(vb - va, 8) for k, (va, vb) in figures(a, b).items()}
    return Comparison(a=a, b=b, diff=diff)
