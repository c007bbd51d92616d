"""Lookahead on event time: an agent's queued events evaluated ahead of their turn.

On a replay the agent's subscription holds the events that come next, so its
sandbox worker can evaluate them while the dispatcher settles the current one:
the worker then runs on the second core instead of the dispatcher waiting for
it (see ``Batch.ahead`` in :mod:`hooks_runtime.protocol`). Their market state is
exact (each event's own candles, applied in order); what an earlier event's
decisions may still change is assumed: the account (positions, working orders)
as it is when the request goes out, and ``lastOutputs`` as the results before
it make them. The worker reports which state keys each hook read, so a result
is used in its event's turn only if what it read is what the real state holds;
otherwise the event is evaluated again. Decisions never differ from a run
without lookahead (``bench/lookahead_bench.py`` checks it row by row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from daemon.trading.portfolio import Order, Position
from hooks_runtime.decisions import to_builtins
from hooks_runtime.hookfile import HookSpec
from hooks_runtime.pool import HookResult
from hooks_runtime.protocol import LAST_OUTPUTS, READ_ALL

# An account as a lookahead request assumed it: positions by symbol, working orders.
Portfolio = tuple[dict[str, Position], tuple[Order, ...]]
FIRST_PAUSE = 16  # events without lookahead after a result that did not hold...
MAX_PAUSE = 4096  # ...doubling, up to this, while lookahead keeps missing


@dataclass(slots=True)
class Lookahead:
    """A queued event evaluated ahead of its turn, and what its results assumed."""

    market: dict[str, Any]  # its state's market part: exact, from its own candles
    results: list[HookResult] | None = None  # None: not (or no longer) evaluated
    revisions: tuple[str, ...] = ()
    portfolio: Portfolio = ({}, ())
    outputs: dict[str, Any] | None = None  # its lastOutputs (None: no hook read them)
    paused: frozenset[str] = frozenset()  # the hooks that stood paused in it

    def holds(
        self,
        hooks: list[HookSpec],
        account: Portfolio,
        outputs: dict[str, Any],
        paused: frozenset[str] = frozenset(),
    ) -> bool:
        """Whether the results stand for the real state: the same hook revisions, the
        same hooks ``paused`` (a pause lifted since: they run now), and every part of
        the state a hook read is as assumed."""
        if self.results is None or self.revisions != tuple(h.revision for h in hooks):
            return False
        if paused != self.paused:
            return False
        reads = {key for r in self.results for key in r.reads}
        if not reads:
            return True
        every = READ_ALL in reads
        positions, orders = self.portfolio
        return (
            (not (every or "positions" in reads) or account[0] == positions)
            and (not (every or "orders" in reads) or account[1] == orders)
            and (not (every or LAST_OUTPUTS in reads) or outputs == self.outputs)
        )


def keep(
    entries: list[Lookahead],
    steps: list[list[HookResult]],
    hooks: list[HookSpec],
    portfolio: Portfolio,
    outputs: dict[str, Any],
) -> None:
    """Give each entry its step's results and what they assumed: the portfolio, and
    (if a hook read them) ``lastOutputs``, which start as ``outputs`` (updated)."""
    revisions = tuple(h.revision for h in hooks)
    tracked = any(READ_ALL in r.reads or LAST_OUTPUTS in r.reads for s in steps for r in s)
    for entry, step in zip(entries, steps, strict=False):
        paused = stood_paused(step)
        if paused is None:
            break  # the hooks' failure history changes here: nothing after it holds
        entry.results, entry.revisions, entry.portfolio = step, revisions, portfolio
        entry.paused = paused
        if tracked:
            entry.outputs = dict(outputs)
            carry(outputs, step)


NONE_PAUSED: frozenset[str] = frozenset()


def stood_paused(results: list[HookResult]) -> frozenset[str] | None:
    """The hooks that stood paused in ``results``; None unless the results leave the
    hooks' failure history as it was (every other hook ran well: a failure starts a
    backoff or a pause, which changes what the events after it would get)."""
    paused = NONE_PAUSED
    for r in results:
        if r.error_kind is None:
            continue
        if r.error_kind != "paused":
            return None
        paused = paused | {r.hook_id}
    return paused


def carry(outputs: dict[str, Any], results: list[HookResult]) -> None:
    """Update ``lastOutputs`` with ``results`` as the dispatcher does when it settles them."""
    for r in results:
        if r.ok and r.decision is not None:
            outputs[r.hook_id] = to_builtins(r.decision)


@dataclass(slots=True)
class Pacing:
    """When an agent looks ahead. Hooks that read the account see every order and
    fill invalidate what was evaluated after it; after such a miss lookahead
    pauses, for twice as long after each miss until a whole lookahead's worth of
    results in a row held."""

    pause: int = 0  # events left without lookahead
    next_pause: int = FIRST_PAUSE
    streak: int = 0  # results in a row that held

    @property
    def on(self) -> bool:
        return self.pause == 0

    def step(self) -> None:
        """An event was evaluated (either way)."""
        if self.pause:
            self.pause -= 1

    def held(self, lookahead: int) -> None:
        self.streak += 1
        if self.streak >= lookahead:
            self.next_pause = FIRST_PAUSE

    def missed(self) -> None:
        self.streak = 0
        self.pause = self.next_pause
        self.next_pause = min(MAX_PAUSE, self.next_pause * 2)
