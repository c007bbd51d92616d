"""Feed settings, mounted by the daemon as the ``[feeds.*]`` config sections.

They live with the feeds (as the sandbox's live in ``hooks_runtime/config.py``)
so that a feed never imports the daemon's configuration module. Unknown keys
are rejected: a typo fails at startup with its key path.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Final, Literal
from urllib.parse import urlsplit

import msgspec

from daemon.errors import ConfigError
from daemon.events import TIMEFRAMES
from daemon.secret import Secret


def check_http_url(url: str, key: str, schemes: tuple[str, str] = ("http", "https")) -> None:
    """``url`` (after ``${VAR}`` expansion) must be an absolute URL of one of ``schemes``
    with a host; else ValueError naming ``key`` (msgspec reports it at the section's
    path)."""
    try:
        parts = urlsplit(url)
        ok = parts.scheme in schemes and bool(parts.hostname)
    except ValueError:  # an unbalanced "[" in the host, say
        ok = False
    if not ok:
        article = "an" if schemes[0].startswith("h") else "a"
        spelled = " or ".join(f"{s}://" for s in schemes)
        raise ValueError(f"{key} must be {article} {spelled} URL with a host (got {url!r})")


# A Coinbase product id: upper case, dash-separated (BTC-USD, ETH-USDC, BTC-PERP-INTX).
COINBASE_PRODUCT: Final = re.compile(r"^[A-Z0-9]{1,20}(-[A-Z0-9]{1,20}){1,3}$")


def product_problem(product: str) -> str | None:
    """Why ``product`` is not a Coinbase product id (None when it is), with the id
    meant when only the case is wrong: events carry Coinbase's own spelling, so a
    lower-case id would match none of them."""
    if COINBASE_PRODUCT.match(product):
        return None
    upper = product.upper()
    hint = f" (did you mean {upper!r}?)" if COINBASE_PRODUCT.match(upper) else ""
    return f"{product!r} is not a Coinbase product id like 'BTC-USD'{hint}"


def _check_products(products: list[str]) -> None:
    for i, product in enumerate(products):
        why = product_problem(product)
        if why is not None:
            raise ValueError(f"products[{i}]: {why}")


# A copy-trade leader's name: it is a URL path segment and part of event ids.
LEADER_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Shared settings of the feed sections."""


class CoinbaseWsSection(_Section, frozen=True):
    enabled: bool = False
    url: str = "wss://advanced-trade-ws.coinbase.com"
    products: list[str] = msgspec.field(default_factory=list)
    # Reconnect when nothing (not even a heartbeat) arrived for this long.
    # Checked (with the URL) by ``check``, when the feed runs.
    idle_timeout_seconds: float = 10.0
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 60.0
    max_message_bytes: int = 10 * 1024 * 1024

    def __post_init__(self) -> None:
        _check_products(self.products)

    def check(self) -> None:
        """Reject values the pool cannot run with, naming the key (ConfigError). Not
        at load: a disabled feed's settings are not held against the config."""
        key = "feeds.coinbase_ws."
        try:
            check_http_url(self.url, f"{key}url", schemes=("ws", "wss"))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if not self.idle_timeout_seconds > 0:
            raise ConfigError(f"{key}idle_timeout_seconds: must be > 0")
        if not 0 < self.backoff_initial_seconds <= self.backoff_max_seconds:
            raise ConfigError(
                f"{key}backoff_initial_seconds/backoff_max_seconds: need 0 < initial <= max "
                f"(found {self.backoff_initial_seconds}, {self.backoff_max_seconds})"
            )
        if self.max_message_bytes < 1024:
            raise ConfigError(f"{key}max_message_bytes: must be >= 1024")


class CandlesSection(_Section, frozen=True):
    enabled: bool = False
    base_url: str = "https://api.coinbase.com/api/v3/brokerage"
    products: list[str] = msgspec.field(default_factory=list)
    timeframes: list[str] = msgspec.field(default_factory=lambda: ["5m"])
    # 0 = derive from the timeframe (a tenth of it, clamped to 10..300 s).
    poll_seconds: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    emit_updated: bool = False
    # How far back to backfill after downtime, in candles per timeframe.
    max_backfill: Annotated[int, msgspec.Meta(ge=0)] = 1000
    request_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 10.0

    def __post_init__(self) -> None:
        check_http_url(self.base_url, "base_url")
        _check_products(self.products)
        for tf in self.timeframes:
            if tf not in TIMEFRAMES:
                raise ValueError(
                    f"unknown timeframe {tf!r} (expected one of {', '.join(TIMEFRAMES)})"
                )


# jsonl: FeedEvents (marketwake run --record); csv: OHLCV candles; coinbase: raw
# Coinbase Advanced Trade messages (ticks, and 5m candles from the candles channel);
# auto: by name, then content.
ReplayFormat = Literal["auto", "jsonl", "csv", "coinbase"]


class ReplayFileSection(_Section, frozen=True):
    """One more file of a replay: its path, format, and (CSV) symbol and timeframe
    (empty: the replay's)."""

    path: str
    format: ReplayFormat = "auto"
    symbol: str = ""
    timeframe: str = ""


class ReplaySection(_Section, frozen=True):
    enabled: bool = False
    path: str = ""
    format: ReplayFormat = "auto"
    # For CSV candles: which symbol/timeframe they are.
    symbol: str = ""
    timeframe: str = "1m"
    # 0 = as fast as possible; 1 = real time; 60 = a minute per second.
    speed: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    source: str = "replay"
    # Only events with from_ms <= time < to_ms (epoch ms; 0 = no bound).
    from_ms: Annotated[int, msgspec.Meta(ge=0)] = 0
    to_ms: Annotated[int, msgspec.Meta(ge=0)] = 0
    # More files, merged with ``path`` by event time (ties: in file order).
    files: list[ReplayFileSection] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.from_ms and self.to_ms and self.from_ms >= self.to_ms:
            raise ValueError("from_ms must be before to_ms: no event lies between them")


class MoversSection(_Section, frozen=True):
    """The scanner: Coinbase products that moved at least ``min_change_pct`` % in 24 h."""

    enabled: bool = False
    base_url: str = "https://api.coinbase.com/api/v3/brokerage"
    poll_seconds: Annotated[float, msgspec.Meta(ge=5)] = 60.0
    min_change_pct: Annotated[float, msgspec.Meta(gt=0, le=1000)] = 5.0
    # Only products quoted in these currencies (empty = any).
    quote_currencies: list[str] = msgspec.field(default_factory=lambda: ["USD", "USDC"])
    # Ignore products that traded less than this (base units) in 24 h.
    min_volume_24h: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    request_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 10.0

    def __post_init__(self) -> None:
        check_http_url(self.base_url, "base_url")


# Where TradingView sends webhooks from (its support page "How to configure webhook
# alerts"); the default allowlist of [feeds.tradingview].
TRADINGVIEW_IPS: Final = ("52.89.214.238", "34.212.75.30", "54.218.53.128", "52.32.178.7")


class TradingViewHookSection(_Section, frozen=True):
    """One TradingView alert source: its secret URL id, optional passphrase, symbols."""

    # The URL is /tv/<id>: a long random secret (use ${VAR}); it names the leader.
    id: Secret = msgspec.field(default_factory=Secret)
    # If set, the alert body's "passphrase" member must equal it.
    passphrase: Secret = msgspec.field(default_factory=Secret)
    # TradingView ticker ("BINANCE:BTCUSDT" or "BTCUSDT") -> the agents' symbol.
    symbols: dict[str, str] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        hook_id = self.id.reveal()
        if len(hook_id) < 24 or not re.fullmatch(r"[A-Za-z0-9_-]+", hook_id):
            raise ValueError(
                "id must be at least 24 of A-Z a-z 0-9 _ - (a random secret, e.g. "
                "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'; use ${VAR})"
            )


class TradingViewSection(_Section, frozen=True):
    """TradingView strategy alerts: ``POST /tv/<hook id>`` (docs/copytrade.md)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 7882
    max_body_bytes: Annotated[int, msgspec.Meta(ge=256, le=1024 * 1024)] = 16 * 1024
    # Only these source addresses (or networks) are answered; [] = any. A request
    # from a trusted proxy is judged by the address it forwards (X-Forwarded-For).
    allowed_ips: list[str] = msgspec.field(default_factory=lambda: list(TRADINGVIEW_IPS))
    trusted_proxies: list[str] = msgspec.field(default_factory=list)
    keep_days: Annotated[int, msgspec.Meta(ge=1, le=3650)] = 30
    redeliver_seconds: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 600.0
    # leader name -> its alert source
    hooks: dict[str, TradingViewHookSection] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.hooks:
            if not LEADER_NAME.match(name):
                raise ValueError(f"leader name {name!r}: use 1-64 of A-Z a-z 0-9 _ -")
        for key, values in (
            ("allowed_ips", self.allowed_ips),
            ("trusted_proxies", self.trusted_proxies),
        ):
            for value in values:
                try:
                    ipaddress.ip_network(value, strict=False)
                except ValueError:
                    raise ValueError(f"{key}: {value!r} is not an IP address or network") from None
        ids = [hook.id.reveal() for hook in self.hooks.values()]
        if len(set(ids)) != len(ids):
            raise ValueError("two [feeds.tradingview.hooks.*] share an id")
        if self.enabled and not self.hooks:
            raise ValueError("no [feeds.tradingview.hooks.<leader>] configured")


class CopytradeLeaderSection(_Section, frozen=True):
    """One leader allowed to post signals: its HMAC secret (use ``${VAR}``)."""

    secret: Secret = msgspec.field(default_factory=Secret)

    def __post_init__(self) -> None:
        if len(self.secret.reveal()) < 16:
            raise ValueError("secret must be at least 16 characters (use ${VAR})")


class CopytradeWebhookSection(_Section, frozen=True):
    """Signed leader signals over HTTP: ``POST /copytrade/<leader>`` (docs/copytrade.md)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 7881
    max_body_bytes: Annotated[int, msgspec.Meta(ge=256, le=1024 * 1024)] = 64 * 1024
    # A request whose timestamp is further than this from our clock is refused.
    skew_seconds: Annotated[float, msgspec.Meta(ge=5, le=3600)] = 300.0
    # Published signals are remembered this long (a redelivery within it is a no-op).
    keep_days: Annotated[int, msgspec.Meta(ge=1, le=3650)] = 30
    # At start, signals received this recently are delivered again (agents skip
    # what they evaluated): a stop cannot lose one an agent had not finished.
    redeliver_seconds: Annotated[float, msgspec.Meta(ge=0, le=86400)] = 600.0
    leaders: dict[str, CopytradeLeaderSection] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.leaders:
            if not LEADER_NAME.match(name):
                raise ValueError(
                    f"leader name {name!r}: use 1-64 of A-Z a-z 0-9 _ - (it is the URL path)"
                )
        if self.enabled and not self.leaders:
            raise ValueError("no [feeds.copytrade_webhook.leaders.<name>] configured")
