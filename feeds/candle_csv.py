"""CSV candle files: which layout a file has, and its rows as Candles (sans-I/O:
lines in, candles out; the replay feed does the reading).

Two layouts, told apart by the first line:

* **marketwake's own**: the header ``open_time_ms,open,high,low,close,volume``,
  then one row per candle (what :mod:`feeds.synthetic` writes; the schema of the
  shared normalized data).
* **Binance klines**, as data.binance.vision serves them (and the ``klines`` REST
  endpoint returns them): 12 columns, ``open_time,open,high,low,close,volume,
  close_time,quote_volume,count,taker_buy_volume,taker_buy_quote_volume,ignore``,
  with no header (the usual) or that one. Times are milliseconds, or microseconds
  (Binance's spot files from 2025 on): each row's unit is told by its size, so
  monthly files joined across the change read right. ``close_time`` must be
  ``open_time`` plus the timeframe (less one unit): a file of 1m candles replayed
  as 5m is an error, not a quietly wrong backtest.

In either layout a row follows the one before it (:func:`follows`): the same
candle again is a repeated row (skipped), another candle at the same open time
an error; otherwise it opens a timeframe or more later (a longer gap is data
missing). Rows closer than that are not candles of the timeframe they are
replayed as (1m rows in marketwake's own layout, which has no close time, or
open times written in seconds); nor are rows whose first :data:`FIRST_GAPS`
gaps are all one longer spacing (5m rows replayed as 1m, which real data's gaps
never look like).

A bad row is a :class:`~daemon.errors.ReplayError` naming ``where`` (file:line).
"""

from __future__ import annotations

import math
from typing import Final, NamedTuple

from daemon.errors import ReplayError
from daemon.events import MAX_MS, TIMEFRAMES, Candle, iso_ms

HEADER: Final = "open_time_ms,open,high,low,close,volume"
BINANCE_HEADER: Final = (
    "open_time,open,high,low,close,volume,close_time,quote_volume,count,"
    "taker_buy_volume,taker_buy_quote_volume,ignore"
)
MICROSECONDS: Final = 10**14  # a time this large is in microseconds (ms reach it in 5138)
FIRST_GAPS: Final = 3  # gaps between a file's first rows that tell its timeframe


class Layout(NamedTuple):
    """How a file's rows read: its name, whether its first line is a header, and how
    many fields a row has."""

    name: str
    header: bool
    fields: int


OWN: Final = Layout("marketwake", True, 6)
BINANCE: Final = Layout("binance", False, 12)
BINANCE_WITH_HEADER: Final = Layout("binance", True, 12)


def layout_of(first_line: str, where: str) -> Layout:
    """The layout the file whose first line is ``first_line`` has; ReplayError naming
    ``where`` when it is neither."""
    line = first_line.strip().lstrip("\ufeff")
    if line == HEADER:
        return OWN
    binance = binance_layout(line)
    if binance is not None:
        return binance
    raise ReplayError(
        f"{where}: expected the header {HEADER!r}, or Binance kline rows "
        f"({BINANCE.fields} columns, open time first), found {line[:200]!r}"
    )


def binance_layout(first_line: str) -> Layout | None:
    """Binance's layout, with or without its header, if ``first_line`` starts one."""
    line = first_line.strip().lstrip("\ufeff")
    if line == BINANCE_HEADER:
        return BINANCE_WITH_HEADER
    fields = line.split(",")
    if len(fields) == BINANCE.fields and fields[0].isdigit():
        return BINANCE
    return None


def to_ms(value: int) -> int:
    """A Binance time in milliseconds, from milliseconds or microseconds."""
    return value // 1000 if value >= MICROSECONDS else value


def row_time(line: str) -> int:
    """A row's open time in milliseconds (ValueError if it has none)."""
    return to_ms(int(line.split(",", 1)[0]))


def row_close(line: str) -> tuple[int, float]:
    """A row's open time in milliseconds and its close (ValueError or IndexError if
    the row has none): all the report's price plot reads."""
    fields = line.split(",", 5)
    return to_ms(int(fields[0])), float(fields[4])


def candle(line: str, layout: Layout, tf_ms: int, where: str) -> Candle:
    """One row as a Candle; ReplayError naming ``where`` if it is not one."""
    fields = line.strip().split(",")
    if len(fields) != layout.fields:
        raise ReplayError(f"{where}: expected {layout.fields} fields, found {len(fields)}")
    try:
        start = int(fields[0])
        o, h, lo, c, v = (float(f) for f in fields[1:6])
        end = int(fields[6]) if layout.fields > 6 else None
    except ValueError as exc:
        raise ReplayError(f"{where}: {exc}") from None
    if not (all(math.isfinite(x) and x > 0 for x in (o, h, lo, c)) and 0 <= v < math.inf):
        # A price of 0 is a gap in the data, not a price: the broker would fill at it.
        raise ReplayError(f"{where}: prices must be finite and above 0, the volume not negative")
    if start < 0:
        raise ReplayError(f"{where}: the open time must not be negative")
    if lo > min(o, c) or h < max(o, c, lo):
        raise ReplayError(f"{where}: high/low do not contain open and close")
    unit = 1000 if end is not None and start >= MICROSECONDS else 1  # per millisecond
    if start // unit + tf_ms > MAX_MS:
        units = "milliseconds" if end is None else "milliseconds or microseconds"
        raise ReplayError(f"{where}: the open time {start} is past the year 9999 ({units}?)")
    if end is not None:
        if end - start + 1 != tf_ms * unit:
            raise ReplayError(f"{where}: {_span(start, end, unit, tf_ms)}")
        start //= unit
    return Candle(
        open_time_ms=start, close_time_ms=start + tf_ms, open=o, high=h, low=lo, close=c, volume=v
    )


def follows(
    previous: Candle | None, candle: Candle, tf_ms: int, gaps: list[int], where: str
) -> bool:
    """Whether ``candle`` is a new one after ``previous`` (the row before it; None for
    the first): False for the same candle again (a repeated row, to skip); a
    ReplayError naming ``where`` when it cannot follow it (see the module's doc).
    ``gaps`` collects the file's first gaps, which tell its timeframe."""
    if previous is None:
        return True
    start, last = candle.open_time_ms, previous.open_time_ms
    if start == last:
        if candle == previous:
            return False
        raise ReplayError(
            f"{where}: a second candle opening at {iso_ms(last)} with other values than "
            "the row before it"
        )
    if start < last:
        raise ReplayError(f"{where}: open times not increasing")
    _check_spacing(last, start, tf_ms, where)
    if len(gaps) < FIRST_GAPS:
        gaps.append(start - last)
        _check_first_gaps(gaps, tf_ms, where)
    return True


def _check_spacing(previous: int, start: int, tf_ms: int, where: str) -> None:
    """ReplayError naming ``where`` unless a candle opening at ``start`` (ms) may follow
    one opening at ``previous``, which it is after: by a timeframe, or more (a gap)."""
    gap = start - previous
    if gap >= tf_ms:
        return
    if gap * 1000 == tf_ms:
        what = "open times in seconds? The column is milliseconds"
    else:
        what = (
            f"{_named(gap / 1000)} candles? Name the file's own timeframe: "
            "FILE=SYMBOL:TIMEFRAME, or [feeds.replay] timeframe"
        )
    raise ReplayError(
        f"{where}: this candle opens {_named(gap / 1000)} after the one before it, less "
        f"than the {_named(tf_ms / 1000)} timeframe it is replayed as ({what})"
    )


def _check_first_gaps(gaps: list[int], tf_ms: int, where: str) -> None:
    """ReplayError naming ``where`` when a file's first gaps (ms) are all one spacing
    longer than the timeframe: candles of that spacing, not of this timeframe."""
    if len(gaps) < FIRST_GAPS or len(set(gaps)) != 1 or gaps[0] <= tf_ms:
        return
    raise ReplayError(
        f"{where}: the first rows are {_named(gaps[0] / 1000)} apart, not "
        f"{_named(tf_ms / 1000)}: {_named(gaps[0] / 1000)} candles? Name the file's own "
        "timeframe: FILE=SYMBOL:TIMEFRAME, or [feeds.replay] timeframe"
    )


def _named(seconds: float) -> str:
    """A length as the timeframe it is (``5m``), else in seconds or milliseconds."""
    names = [tf for tf, s in TIMEFRAMES.items() if s == seconds]
    if names:
        return names[0]
    return f"{seconds:g} s" if seconds >= 1 else f"{seconds * 1000:g} ms"


def _span(start: int, end: int, unit: int, tf_ms: int) -> str:
    """Why a Binance row's close_time does not fit the timeframe it is replayed as."""
    span = end - start + 1
    if not 0 < span <= MAX_MS * unit:  # not a length any candle has
        return f"close_time {end} is not after open_time {start}, by a candle's length"
    return (
        f"close_time - open_time makes this a {_named(span / (1000 * unit))} "
        f"candle, replayed as {_named(tf_ms / 1000)} (name the file's own: "
        "FILE=SYMBOL:TIMEFRAME, or [feeds.replay] timeframe)"
    )
