"""``report.html``: the backtest as one self-contained page (inline SVG, no scripts).

The plots: the price of each symbol (up to six) with its WAKE, ALERT and fill
markers, the realized equity curve, and wakes per day; then the report's
tables. Long series are thinned to what a page can draw: the price keeps each
bucket's low and high, markers are sampled evenly (the page says how many of
how many are shown).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from html import escape

import msgspec

from daemon.backtest.report import Comparison, Report, counted, figure, figures
from daemon.events import iso_ms
from daemon.trading.paper_store import FillRow

W, H, PAD = 1000, 260, 40
MAX_POINTS = 1500
MAX_MARKERS = 1500
MAX_PRICE_PLOTS = 6  # one per symbol, in the order the hooks first met them


class Series(msgspec.Struct, frozen=True, kw_only=True):
    """What the plots draw, in event time (ms): per symbol its prices (candle closes,
    or tick prices for a recording of ticks); the markers of every symbol."""

    prices: dict[str, list[tuple[int, float]]]  # thinned (see ``envelope``)
    # Per symbol, its price at each of its markers' times (where the markers are drawn).
    marked: dict[str, dict[int, float]]
    wakes: list[tuple[int, str]]  # (time, symbol) of WAKEs that ran (not suppressed)
    alerts: list[tuple[int, str]]
    fills: list[FillRow]
    # Equity marked to market at every close (thinned), beside the realized curve.
    equity: list[tuple[int, float]] = []


def thin(points: Sequence[tuple[int, float]], limit: int = MAX_POINTS) -> list[tuple[int, float]]:
    """At most ``limit`` points: per bucket its low and its high, in time order, and
    the first and last points (the line spans the whole period, as its axis says)."""
    if len(points) <= limit:
        return list(points)
    size = -(-len(points) // (limit // 2 - 1))
    out: list[tuple[int, float]] = []
    for i in range(0, len(points), size):
        bucket = points[i : i + size]
        lo, hi = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        out += sorted({lo, hi})
    return sorted({points[0], *out, points[-1]})


class Envelope:
    """What :func:`thin` makes of a series, taken one point at a time in bounded
    memory (a price series need not be held whole: five years of 1m candles are
    2.6 M points): each bucket's low and high, and the first and last points. When
    more than ``limit // 2 - 1`` buckets fill, neighbours merge, so every bucket
    spans the same number of points, doubled each time."""

    def __init__(self, limit: int = MAX_POINTS) -> None:
        self._cap = max(limit // 2 - 1, 1)
        self._size = 1  # points per bucket
        self._filled = 0  # points in the last bucket
        self._lows: list[tuple[int, float]] = []
        self._highs: list[tuple[int, float]] = []
        self._first: tuple[int, float] | None = None
        self._last: tuple[int, float] | None = None

    def add(self, p: tuple[int, float]) -> None:
        """Take the next point (in time order)."""
        if self._first is None:
            self._first = p
        self._last = p
        lows, highs, cap = self._lows, self._highs, self._cap
        if self._filled == self._size and len(lows) == cap:  # half the buckets, twice the size
            self._lows = lows = [min(lows[i : i + 2], key=_value) for i in range(0, cap, 2)]
            self._highs = highs = [max(highs[i : i + 2], key=_value) for i in range(0, cap, 2)]
            self._size *= 2
            self._filled = self._size // 2 if cap % 2 else self._size  # odd: a half bucket
        if lows and self._filled < self._size:
            # (as min and max with a key: the earlier point on a tie; ~5x faster)
            if p[1] < lows[-1][1]:
                lows[-1] = p
            if p[1] > highs[-1][1]:
                highs[-1] = p
            self._filled += 1
        else:
            lows.append(p)
            highs.append(p)
            self._filled = 1

    def points(self) -> list[tuple[int, float]]:
        """The kept points, in time order."""
        if self._first is None or self._last is None:
            return []
        return sorted({self._first, *self._lows, *self._highs, self._last})


def _value(p: tuple[int, float]) -> float:
    return p[1]


def sample(items: Sequence[int], limit: int = MAX_MARKERS) -> list[int]:
    """At most ``limit`` items, evenly spread."""
    if len(items) <= limit:
        return list(items)
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


class _Scale:
    def __init__(self, t0: int, t1: int, lo: float, hi: float) -> None:
        self.t0, self.span = t0, max(1, t1 - t0)
        self.lo, self.range = lo, (hi - lo) or 1.0

    def x(self, t: int) -> float:
        return round(PAD + (t - self.t0) / self.span * (W - 2 * PAD), 1)

    def y(self, v: float) -> float:
        return round(H - PAD - (v - self.lo) / self.range * (H - 2 * PAD), 1)


def _frame(title: str, s: _Scale) -> list[str]:
    return [
        f'<svg viewBox="0 0 {W} {H}" width="100%" role="img" aria-label="{escape(title)}">',
        f'<rect x="{PAD}" y="{PAD}" width="{W - 2 * PAD}" height="{H - 2 * PAD}" class="frame"/>',
        f'<text x="{PAD}" y="{PAD - 8}" class="title">{escape(title)}</text>',
        f'<text x="{PAD}" y="{H - 12}" class="axis">{iso_ms(s.t0)[:16]}</text>',
        f'<text x="{W - PAD}" y="{H - 12}" class="axis end">{iso_ms(s.t0 + s.span)[:16]}</text>',
    ]


def _closed(s: _Scale) -> list[str]:
    """The low and high value labels, drawn last (over the lines, with a halo, so a
    series that starts at its low does not strike its label through), then the end."""
    return [
        f'<text x="{PAD + 4}" y="{H - PAD - 4}" class="axis value">{s.lo:,.2f}</text>',
        f'<text x="{PAD + 4}" y="{PAD + 14}" class="axis value">{s.lo + s.range:,.2f}</text>',
        "</svg>",
    ]


def _price_plots(series: Series) -> str:
    """One price plot per symbol, each with that symbol's markers only."""
    if not any(series.prices.values()):
        return "<p>No prices in the data (candles, or ticks).</p>"
    plots = [_price_plot(series, symbol) for symbol in list(series.prices)[:MAX_PRICE_PLOTS]]
    if len(series.prices) > MAX_PRICE_PLOTS:
        plots.append(f"<p>{len(series.prices) - MAX_PRICE_PLOTS} more symbols not drawn.</p>")
    return "\n".join(plots)


def _price_plot(series: Series, symbol: str) -> str:
    pts = thin(series.prices[symbol])
    if not pts:
        return f"<p>No prices of {escape(symbol)} in the data (candles, or ticks).</p>"
    s = _Scale(pts[0][0], pts[-1][0], min(p for _, p in pts), max(p for _, p in pts))
    title = f"{symbol}: price, with wakes (blue), alerts (orange) and fills (green buy, red sell)"
    out = _frame(title, s)
    line = " ".join(f"{s.x(t)},{s.y(p)}" for t, p in pts)
    out.append(f'<polyline points="{line}" class="price"/>')
    closes = series.marked.get(symbol, {})
    for cls, marks in (("wake", series.wakes), ("alert", series.alerts)):
        for t in sample([t for t, sym in marks if sym == symbol]):
            if t in closes:
                out.append(f'<circle cx="{s.x(t)}" cy="{s.y(closes[t])}" r="2" class="{cls}"/>')
    fills = [f for f in series.fills if f.symbol == symbol]
    for f in (fills[i] for i in sample(range(len(fills)))):
        cls = "buy" if f.qty > 0 else "sell"
        out.append(
            f'<rect x="{s.x(f.ts_ms) - 2}" y="{s.y(f.price) - 2}" width="4" height="4" '
            f'class="{cls}"/>'
        )
    out += _closed(s)
    return "\n".join(out)


def _realized(fills: Sequence[FillRow]) -> list[tuple[int, float]]:
    """Realized equity net of fees after each fill that moved it."""
    curve: list[tuple[int, float]] = []
    equity = 0.0
    for f in fills:
        if f.realized or f.fee:
            equity += f.realized - f.fee
            curve.append((f.ts_ms, equity))
    return curve


def _equity_plot(series: Series) -> str:
    if not series.fills:
        return "<p>No trades: no equity curve.</p>"
    marked = series.equity
    span = [t for t, _ in marked] or [f.ts_ms for f in series.fills]
    pts = _steps(thin(_realized(series.fills)), min(span), max(span))
    title = (
        "Equity, net of fees (quote currency): realized (green), "
        "marked to market at each close (gray)"
    )
    return _curves(title, [("marked", marked), ("equity", pts)])


def _curves(title: str, curves: Sequence[tuple[str, list[tuple[int, float]]]]) -> str:
    """Equity curves (CSS class, points) on one scale that shows zero, with its line."""
    points = [p for _, line in curves for p in line]
    values = [0.0, *(v for _, v in points)]
    s = _Scale(min(t for t, _ in points), max(t for t, _ in points), min(values), max(values))
    out = _frame(title, s)
    out.append(f'<line x1="{PAD}" x2="{W - PAD}" y1="{s.y(0)}" y2="{s.y(0)}" class="zero"/>')
    for cls, line in curves:
        if line:
            drawn = " ".join(f"{s.x(t)},{s.y(v)}" for t, v in line)
            out.append(f'<polyline points="{drawn}" class="{cls}"/>')
    out += _closed(s)
    return "\n".join(out)


def _steps(pts: list[tuple[int, float]], start: int, end: int) -> list[tuple[int, float]]:
    """Realized equity as it moves: flat from ``start`` (at 0) until a fill changes it,
    then flat again to ``end``; a line straight from one closing fill to the next
    would draw months without a trade as a gain or loss made day by day."""
    out: list[tuple[int, float]] = [(min(start, pts[0][0]), 0.0)] if pts else []
    for t, v in pts:
        out += [(t, out[-1][1]), (t, v)]
    if out and end > out[-1][0]:
        out.append((end, out[-1][1]))
    return out


def _wakes_plot(series: Series) -> str:
    return _wakes_bars("WAKEs that ran per day", series.wakes)


def _wakes_bars(
    title: str, wakes: Sequence[tuple[int, str]], other: Sequence[tuple[int, str]] | None = None
) -> str:
    """Each day's WAKEs that ran (``wakes``' markers) as bars; a comparison's ``other``
    run as a step line over them, on the same scale (bars side by side would be under
    a pixel wide over a year)."""
    per_day = Counter(iso_ms(t)[:10] for t, _ in wakes)
    line = Counter(iso_ms(t)[:10] for t, _ in other or ())
    days = sorted({*per_day, *line})
    if not days:
        return "<p>No wakes ran.</p>"
    top = max([*per_day.values(), *line.values()])
    out = [
        f'<svg viewBox="0 0 {W} {H}" width="100%" role="img" aria-label="Wakes per day">',
        (
            f'<text x="{PAD}" y="{PAD - 8}" class="title">{escape(title)} (max {top}; '
            "collected ones share a run)</text>"
        ),
    ]
    width = (W - 2 * PAD) / len(days)

    def y(n: int) -> float:
        return H - PAD - n / top * (H - 2 * PAD)

    w = max(width - 1, 0.5)
    for i, day in enumerate(days):
        x, n = PAD + i * width, per_day[day]
        if n:
            title = "" if other is not None else f"<title>{day}: {n}</title>"
            out.append(
                f'<rect x="{x:.1f}" y="{y(n):.1f}" width="{w:.1f}" '
                f'height="{n / top * (H - 2 * PAD):.1f}" class="bar">{title}</rect>'
            )
        if other is not None:  # both figures of the day on hover, over its whole height
            out.append(
                f'<rect x="{x:.1f}" y="{PAD}" width="{w:.1f}" height="{H - 2 * PAD}" '
                f'class="hover"><title>{day}: A {n}, B {line[day]}</title></rect>'
            )
    if other is not None:
        steps = " ".join(
            f"{PAD + (i + k) * width:.1f},{y(line[day]):.1f}"
            for i, day in enumerate(days)
            for k in (0, 1)
        )
        out.append(f'<polyline points="{steps}" class="bar-b"/>')
    out.append(f'<text x="{PAD}" y="{H - 12}" class="axis">{days[0]}</text>')
    out.append(f'<text x="{W - PAD}" y="{H - 12}" class="axis end">{days[-1]}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


STYLE = """
body{font:14px system-ui,sans-serif;margin:2em auto;max-width:1040px;color:#222}
.frame{fill:none;stroke:#ccc}.title{font-size:14px;font-weight:600}
.axis{font-size:11px;fill:#666}.end{text-anchor:end}
.value{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
.price{fill:none;stroke:#444;stroke-width:1}.equity{fill:none;stroke:#2a7;stroke-width:1.5}
.marked{fill:none;stroke:#999;stroke-width:1}
.zero{stroke:#bbb;stroke-dasharray:4 3}.wake{fill:#36c;opacity:.6}.alert{fill:#e80}
.buy{fill:#2a7}.sell{fill:#c33}.bar{fill:#36c}.bar-b{fill:none;stroke:#e80;stroke-width:1.2}.hover{fill:transparent}.other{fill:none;stroke:#36c;stroke-width:1.5;stroke-dasharray:5 3}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ddd;padding:4px 8px;text-align:left}
"""


def render_html(report: Report, series: Series) -> str:
    """The whole page."""
    b, t, c = report.baseline, report.trades, report.fill_costs
    summary = [
        ("agent", report.agent),
        *([] if (note := report.incomplete()) is None else [note]),
        (
            "data",
            f"{report.data}: {report.events} events, {report.first_event} .. {report.last_event}",
        ),
        *(
            [("duplicate rows skipped", f"{report.duplicate_rows} (the candle before, again)")]
            if report.duplicate_rows
            else []
        ),
        *(
            [("events that came twice", f"{report.repeated_events} (evaluated once)")]
            if report.repeated_events
            else []
        ),
        ("wakes", f"{counted(report.wakes, 'WAKE decision')} -> {counted(report.runs, 'run')}"),
        ("merged into another's run", f"{report.wakes_merged}"),
        *(
            [("runs failed", f"{report.runs_failed} (the first: {report.first_run_error})")]
            if report.runs_failed
            else []
        ),
        ("not run", ", ".join(f"{k} {v}" for k, v in report.wakes_suppressed.items()) or "-"),
        (report.cost_model.label, f"{report.cost:.2f} ({report.cost_model.source})"),
        (f"timer agent every {b.minutes:g} min", f"{counted(b.runs, 'run')}, {b.cost:.2f}"),
        ("cost ratio", f"{report.cost_ratio:.1%}" if report.cost_ratio is not None else "n/a"),
        ("risk", report.verdicts() or "no trade intents"),
        (
            "trades",
            f"{counted(t.fills, 'fill')}, {t.closing_fills} closing, win rate {t.win_rate:.0%}",
        ),
        ("realized PnL / max drawdown", f"{t.realized_pnl:.2f} / {t.max_drawdown:.2f}"),
        (
            "marked to market: max drawdown / open at the end",
            f"{t.max_drawdown_marked:.2f} / {t.unrealized_at_end:+.2f}",
        ),
        ("exposure / fees", f"{t.exposure:.0%} / {t.fees:.2f}"),
        ("entry orders working at the end", report.still_working() or "none"),
        (
            "average win / loss, largest loss, profit factor",
            f"{t.avg_win:.2f} / {t.avg_loss:.2f}, {t.largest_loss:.2f}, "
            + (f"{t.profit_factor:.2f}" if t.profit_factor is not None else "n/a"),
        ),
        (
            "simulated fill costs (bps)",
            (
                f"maker fee {c.maker_fee_bps:g}, taker fee {c.taker_fee_bps:g}, "
                f"taker slippage {c.slippage_bps:g}"
            ),
        ),
    ]
    hooks = "".join(
        f"<tr><td>{escape(h.hook)}</td><td>{escape(h.revision)}</td><td>{h.evaluations}</td>"
        f"<td>{escape(', '.join(f'{k} {v}' for k, v in h.decisions.items()))}</td>"
        f"<td>{escape(h.failed() or '0')}{escape(f'; {h.not_run()}' if h.skipped else '')}</td>"
        f"<td>{escape(', '.join(f'{k} {v}' for k, v in h.suppressed.items()))}</td></tr>"
        for h in report.hooks
    ) + "".join(
        f"<tr><td>{escape(b.hook)}</td><td>{escape(b.revision)}</td><td>0</td>"
        f"<td>did not compile, never ran</td><td>{escape(b.error)}</td><td></td></tr>"
        for b in report.broken
    )
    plotted = list(series.prices)[:MAX_PRICE_PLOTS]
    wakes = Counter(sym for _, sym in series.wakes)
    fills = Counter(f.symbol for f in series.fills)
    shown = sum(min(wakes[sym], MAX_MARKERS) for sym in plotted)
    shown_fills = sum(min(fills[sym], MAX_MARKERS) for sym in plotted)
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>Backtest: {escape(report.agent)}</title><style>{STYLE}</style></head><body>",
            f"<h1>Backtest of {escape(report.agent)}</h1>",
            _table(summary),
            _price_plots(series),
            (
                f"<p>{shown} of {len(series.wakes)} wakes and "
                f"{shown_fills} of {len(series.fills)} fills drawn.</p>"
            ),
            _equity_plot(series),
            _wakes_plot(series),
            "<h2>Hooks</h2>",
            (
                "<table><tr><th>hook</th><th>revision</th><th>evaluations</th>"
                "<th>decisions</th><th>errors</th><th>suppressed</th></tr>"
                f"{hooks}</table>"
            ),
            "</body></html>",
        ]
    )


def _equities_plot(series: tuple[Series, Series]) -> str:
    """A's and B's realized equity on one scale, over the period either covers."""
    if not any(s.fills for s in series):
        return "<p>No trades in either run: no equity curves.</p>"
    marks = [t for s in series for t, _ in s.equity] or [f.ts_ms for s in series for f in s.fills]
    start, end = min(marks), max(marks)
    a, b = (_steps(thin(_realized(s.fills)), start, end) for s in series)
    return _curves(
        "Realized equity, net of fees: A (green), B (blue, dashed)", [("equity", a), ("other", b)]
    )


def _decided(report: Report) -> dict[str, str]:
    """Per hook: its revision and decisions, as one cell."""
    cells = {
        h.hook: f"@{h.revision[:8]}: "
        + (", ".join(f"{k} {v}" for k, v in h.decisions.items()) or "none")
        for h in report.hooks
    }
    for bad in report.broken:
        cells.setdefault(bad.hook, f"@{bad.revision[:8]}: did not compile")
    return cells


def render_comparison_html(
    result: Comparison, labels: tuple[str, str], series: tuple[Series, Series]
) -> str:
    """The page of ``--compare``: the figures of A and B and their differences, each
    hook's decisions side by side, both equity curves on one plot; each run's own page
    beside it (a/report.html, b/report.html)."""
    a, b = result.a, result.b
    rows = "".join(
        f"<tr><th>{escape(name)}</th><td>{escape(figure(name, va))}</td>"
        f"<td>{escape(figure(name, vb))}</td>"
        f"<td>{escape(figure(name, result.diff[name], '+'))}</td></tr>"
        for name, (va, vb) in figures(a, b).items()
    )
    da, db = _decided(a), _decided(b)
    hooks = "".join(
        f"<tr><td>{escape(h)}</td><td>{escape(da.get(h, '-'))}</td><td>{escape(db.get(h, '-'))}</td></tr>"
        for h in sorted({*da, *db})
    )
    span = f"{a.events} events, {a.first_event} .. {a.last_event}"
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>Backtest comparison: {escape(a.agent)}</title><style>{STYLE}</style></head>",
            "<body>",
            "<h1>Backtest comparison</h1>",
            _table(
                [
                    ("A", labels[0]),
                    ("B", labels[1]),
                    ("data", f"{a.data}: {span}"),
                ]
            ),
            '<p><a href="a/report.html">A\'s report</a> · <a href="b/report.html">B\'s report</a></p>',
            f"<table><tr><th></th><th>A</th><th>B</th><th>B - A</th></tr>{rows}</table>",
            _equities_plot(series),
            _wakes_bars(
                "WAKEs that ran per day: A (blue bars), B (orange line)",
                series[0].wakes,
                series[1].wakes,
            ),
            "<h2>Hooks</h2>",
            f"<table><tr><th>hook</th><th>A</th><th>B</th></tr>{hooks}</table>",
            "</body></html>",
        ]
    )
