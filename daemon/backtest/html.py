"""``report.html``: the backtest as one self-contained page (inline SVG, no scripts).

Three plots: the price with WAKE, ALERT and fill markers, the realized equity
curve, and wakes per day; then the report's tables. Long series are thinned
to what a page can draw: the price keeps each bucket's low and high, markers
are sampled evenly (the page says how many of how many are shown).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from html import escape

import msgspec

from daemon.backtest.report import Report
from daemon.events import iso_ms

W, H, PAD = 1000, 260, 40
MAX_POINTS = 1500
MAX_MARKERS = 1500


class Series(msgspec.Struct, frozen=True, kw_only=True):
    """What the plots draw, in event time (ms)."""

    prices: list[tuple[int, float]]  # candle closes (tick prices for a recording of ticks)
    wakes: list[int]  # times of WAKEs that ran (not suppressed)
    alerts: list[int]
    fills: list[tuple[int, float, float, float, float]]  # ts, price, signed qty, realized, fee


def thin(points: Sequence[tuple[int, float]], limit: int = MAX_POINTS) -> list[tuple[int, float]]:
    """At most ``limit`` points: per bucket its low and its high, in time order."""
    if len(points) <= limit:
        return list(points)
    size = -(-len(points) // (limit // 2))
    out: list[tuple[int, float]] = []
    for i in range(0, len(points), size):
        bucket = points[i : i + size]
        lo, hi = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        out += sorted({lo, hi})
    return out


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


def _frame(title: str, s: _Scale, lo_label: str, hi_label: str) -> list[str]:
    return [
        f'<svg viewBox="0 0 {W} {H}" width="100%" role="img" aria-label="{escape(title)}">',
        f'<rect x="{PAD}" y="{PAD}" width="{W - 2 * PAD}" height="{H - 2 * PAD}" class="frame"/>',
        f'<text x="{PAD}" y="{PAD - 8}" class="title">{escape(title)}</text>',
        f'<text x="{PAD + 4}" y="{H - PAD - 4}" class="axis">{escape(lo_label)}</text>',
        f'<text x="{PAD + 4}" y="{PAD + 14}" class="axis">{escape(hi_label)}</text>',
        f'<text x="{PAD}" y="{H - 12}" class="axis">{iso_ms(s.t0)[:16]}</text>',
        f'<text x="{W - PAD}" y="{H - 12}" class="axis end">{iso_ms(s.t0 + s.span)[:16]}</text>',
    ]


def _price_plot(series: Series) -> str:
    pts = thin(series.prices)
    if not pts:
        return "<p>No prices of the symbol in the data (candles, or ticks).</p>"
    s = _Scale(pts[0][0], pts[-1][0], min(p for _, p in pts), max(p for _, p in pts))
    out = _frame("Price, with wakes (blue), alerts (orange) and fills (green buy, red sell)",
                 s, f"{s.lo:,.2f}", f"{s.lo + s.range:,.2f}")  # fmt: skip
    line = " ".join(f"{s.x(t)},{s.y(p)}" for t, p in pts)
    out.append(f'<polyline points="{line}" class="price"/>')
    closes = dict(series.prices)
    for cls, times in (("wake", series.wakes), ("alert", series.alerts)):
        for t in sample(times):
            if t in closes:
                out.append(f'<circle cx="{s.x(t)}" cy="{s.y(closes[t])}" r="2" class="{cls}"/>')
    for t, price, qty, *_ in (series.fills[int(i)] for i in _sample_index(len(series.fills))):
        cls = "buy" if qty > 0 else "sell"
        out.append(
            f'<rect x="{s.x(t) - 2}" y="{s.y(price) - 2}" width="4" height="4" class="{cls}"/>'
        )
    out.append("</svg>")
    return "\n".join(out)


def _sample_index(n: int) -> list[int]:
    return sample(list(range(n)))


def _equity_plot(series: Series) -> str:
    curve: list[tuple[int, float]] = []
    equity = 0.0
    for t, _, _, realized, fee in series.fills:
        if realized or fee:
            equity += realized - fee
            curve.append((t, equity))
    if not curve:
        return "<p>No closed trades: no equity curve.</p>"
    pts = thin(curve)
    s = _Scale(
        pts[0][0], pts[-1][0], min(0.0, *(v for _, v in pts)), max(0.0, *(v for _, v in pts))
    )
    out = _frame(
        "Realized equity, net of fees (quote currency)", s, f"{s.lo:,.2f}", f"{s.lo + s.range:,.2f}"
    )
    out.append(f'<line x1="{PAD}" x2="{W - PAD}" y1="{s.y(0)}" y2="{s.y(0)}" class="zero"/>')
    line = " ".join(f"{s.x(t)},{s.y(v)}" for t, v in pts)
    out.append(f'<polyline points="{line}" class="equity"/>')
    out.append("</svg>")
    return "\n".join(out)


def _wakes_plot(series: Series) -> str:
    per_day = Counter(iso_ms(t)[:10] for t in series.wakes)
    if not per_day:
        return "<p>No wakes ran.</p>"
    days = sorted(per_day)
    top = max(per_day.values())
    out = [
        f'<svg viewBox="0 0 {W} {H}" width="100%" role="img" aria-label="Wakes per day">',
        f'<text x="{PAD}" y="{PAD - 8}" class="title">Agent runs per day (max {top})</text>',
    ]
    width = (W - 2 * PAD) / len(days)
    for i, day in enumerate(days):
        h = per_day[day] / top * (H - 2 * PAD)
        x = PAD + i * width
        out.append(
            f'<rect x="{x:.1f}" y="{H - PAD - h:.1f}" width="{max(width - 1, 0.5):.1f}" '
            f'height="{h:.1f}" class="bar"><title>{day}: {per_day[day]}</title></rect>'
        )
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
.price{fill:none;stroke:#444;stroke-width:1}.equity{fill:none;stroke:#2a7;stroke-width:1.5}
.zero{stroke:#bbb;stroke-dasharray:4 3}.wake{fill:#36c;opacity:.6}.alert{fill:#e80}
.buy{fill:#2a7}.sell{fill:#c33}.bar{fill:#36c}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ddd;padding:4px 8px;text-align:left}
"""


def render_html(report: Report, series: Series) -> str:
    """The whole page."""
    b, t = report.baseline, report.trades
    summary = [
        ("agent", report.agent),
        *([] if (note := report.incomplete()) is None else [note]),
        (
            "data",
            f"{report.data}: {report.events} events, {report.first_event} .. {report.last_event}",
        ),
        ("wakes", f"{report.wakes} WAKE decisions -> {report.runs} runs"),
        ("not run", ", ".join(f"{k} {v}" for k, v in report.wakes_suppressed.items()) or "-"),
        ("estimated LLM cost", f"{report.cost:.2f} ({report.cost_model.source})"),
        (f"timer agent every {b.minutes:g} min", f"{b.runs} runs, {b.cost:.2f}"),
        ("cost ratio", f"{report.cost_ratio:.1%}" if report.cost_ratio is not None else "n/a"),
        ("trades", f"{t.fills} fills, {t.closing_fills} closing, win rate {t.win_rate:.0%}"),
        ("realized PnL / max drawdown", f"{t.realized_pnl:.2f} / {t.max_drawdown:.2f}"),
        ("exposure / fees", f"{t.exposure:.0%} / {t.fees:.2f}"),
    ]
    hooks = "".join(
        f"<tr><td>{escape(h.hook)}</td><td>{escape(h.revision)}</td><td>{h.evaluations}</td>"
        f"<td>{escape(', '.join(f'{k} {v}' for k, v in h.decisions.items()))}</td>"
        f"<td>{h.errors}{escape(f' (first: {h.first_error})' if h.first_error else '')}</td>"
        f"<td>{escape(', '.join(f'{k} {v}' for k, v in h.suppressed.items()))}</td></tr>"
        for h in report.hooks
    ) + "".join(
        f"<tr><td>{escape(b.hook)}</td><td>{escape(b.revision)}</td><td>0</td>"
        f"<td>did not compile, never ran</td><td>{escape(b.error)}</td><td></td></tr>"
        for b in report.broken
    )
    shown = min(len(series.wakes), MAX_MARKERS)
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>Backtest: {escape(report.agent)}</title><style>{STYLE}</style></head><body>",
            f"<h1>Backtest of {escape(report.agent)}</h1>",
            _table(summary),
            _price_plot(series),
            (
                f"<p>{shown} of {len(series.wakes)} wakes and "
                f"{min(len(series.fills), MAX_MARKERS)} of {len(series.fills)} fills drawn.</p>"
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
