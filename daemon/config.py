"""Typed configuration, decoded from TOML.

Every section is a frozen Struct that rejects unknown keys, so a typo fails at
startup with the key path instead of being ignored. ``${VAR}`` in a string is
replaced from the environment before decoding; values of secret-looking keys
are wrapped in :class:`Secret` so they never reach a log line or a repr.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import msgspec.inspect

from daemon.errors import ConfigError
from daemon.inputfile import read_input
from daemon.rag.config import RagConfig
from daemon.secret import Secret
from feeds.config import (
    CandlesSection,
    CoinbaseWsSection,
    CopytradeWebhookSection,
    MoversSection,
    ReplaySection,
    TradingViewSection,
    check_http_url,
)
from hooks_runtime.config import SandboxConfig

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "Config",
    "Secret",
    "decode_hook",
    "describe_error",
    "expand_env",
    "load",
    "parse",
]

DEFAULT_CONFIG_PATH = Path("config.toml")
MAX_CONFIG_BYTES = 1024 * 1024  # a commented config is ~20 KB
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Base(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Shared settings for config sections."""


class DaemonSection(Base, frozen=True):
    state_dir: str = "state"
    log_format: Literal["auto", "console", "json"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Append every bus event to this JSONL file ("" = off).
    record: str = ""
    # Past this size the recording moves to <record>.1 (replacing the one there) and a
    # new file starts: at most twice this on disk (0 = no bound).
    record_max_mb: Annotated[float, msgspec.Meta(ge=0)] = 1024.0
    # A feed that has produced nothing for this long is considered stalled and
    # the systemd watchdog stops being pinged.
    stall_seconds: Annotated[float, msgspec.Meta(gt=0)] = 120.0
    # status.json and the status log line this often (0 would spin).
    status_interval_seconds: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    # Which time the agents live on (docs/daemon.md): "wall" (live), "event" (the
    # time of the last event applied: replays and backtests give the same wakes,
    # runs, orders and fills at any speed), "auto" = event unless a live feed
    # (coinbase_ws or candles) is enabled.
    clock: Literal["auto", "wall", "event"] = "auto"
    # A stop (SIGTERM) lets agents finish their queued events for at most this long;
    # the rest is re-delivered after the restart. Keep it below systemd's TimeoutStopSec.
    stop_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=600)] = 8.0
    # false: the paper broker's, hook and wake stores skip fsync, commit every 256
    # statements and are locked for the daemon alone while it runs (a backtest's
    # scratch state dir; a crash may lose their last writes, and `hooks resume`
    # cannot reach them). Keep true for anything that trades on.
    durable: bool = True


class BusSection(Base, frozen=True):
    queue_size: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 4096
    # What a slow agent's full queue cannot hold waits on disk
    # (<state_dir>/backlog/<agent>.jsonl; on event time its account's too) instead
    # of holding back the feeds, up to this many MB each; past it the feeds wait.
    agent_backlog_mb: Annotated[int, msgspec.Meta(ge=1, le=65536)] = 256


class FeedsSection(Base, frozen=True):
    coinbase_ws: CoinbaseWsSection = msgspec.field(default_factory=CoinbaseWsSection)
    candles: CandlesSection = msgspec.field(default_factory=CandlesSection)
    replay: ReplaySection = msgspec.field(default_factory=ReplaySection)
    movers: MoversSection = msgspec.field(default_factory=MoversSection)
    copytrade_webhook: CopytradeWebhookSection = msgspec.field(
        default_factory=CopytradeWebhookSection
    )
    tradingview: TradingViewSection = msgspec.field(default_factory=TradingViewSection)


class CopytradeSection(Base, frozen=True):
    # Agents of this daemon others may follow: their paper accounts' trades become
    # copytrade.signal.* from leader "<agent id>" (docs/copytrade.md).
    leader_agents: list[str] = msgspec.field(default_factory=list)
    # Followers are compared with their leaders at start and this often (0 = at
    # start only); what a drift does is each follower's [copytrade] reconcile.
    reconcile_seconds: Annotated[float, msgspec.Meta(ge=0)] = 60.0


class StateSection(Base, frozen=True):
    # Closed candles kept per series (each cache; ~1 KB each): bounded memory.
    max_candles: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 500
    # The daemon's own market state, beside each agent's: what the agents' tools and
    # MCP read, what an agent that starts mid-run (hot reload) is warmed up from, and
    # the snapshot the next start warms up from. false spares every candle one more
    # indicator update where none of that is wanted (a backtest that counts wakes):
    # needs [hooks] run_agents = false and [mcp] enabled = false; agents that start
    # mid-run start cold, and the next start too.
    shared: bool = True


class HooksSection(Base, frozen=True):
    enabled: bool = True
    # agents/<id>/agent.toml + agents/<id>/hooks/*.py; relative to the working directory.
    agents_dir: str = "agents"
    # How often the agents directory is rescanned for edits (hot reload). 0: the
    # agents are loaded once, at start (no hot reload; `hooks resume` applies at the
    # next start).
    reload_seconds: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    # POST every live ALERT as JSON here too ("" = log only; a replay's are not posted).
    alert_webhook: str = ""
    # With a durable state dir: an alert the webhook has not taken yet (a stop, a kill,
    # an outage past its retries) is kept and posted again, marked "redelivered", at
    # the next start or once the endpoint is back, if raised at most this long ago
    # (0 = not kept: such an alert is in the log and the audit only).
    alert_webhook_keep_seconds: Annotated[float, msgspec.Meta(ge=0)] = 3600.0
    # Dedupe keys kept per agent (the oldest go first; keys are also dropped after
    # 30 days of event time). Bounds hooks.sqlite3 whatever keys hooks invent.
    dedupe_max_keys: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    # Live: each agent's hooks may use this share of one core, averaged over the
    # window (0 = no budget); an agent over it waits, its events queue (then spill
    # to disk) and the other agents go on. Not applied on event time (replays).
    cpu_budget_share: Annotated[float, msgspec.Meta(ge=0, le=64)] = 0.5
    cpu_budget_window_seconds: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 60.0
    # false: WAKEs are scheduled, budgeted and audited as usual, but each run only
    # logs (no LLM, no command): what `marketwake backtest` counts by default.
    run_agents: bool = True
    # true: agents whose agent.toml says enabled = false run too (`marketwake
    # backtest` of an agent not enabled live yet).
    include_disabled: bool = False
    # Event time only (replays, backtests): an agent evaluates up to this many of its
    # queued events in the same sandbox request as the current one, ahead of their
    # turn. A result is used only if every part of the state its hook read (the
    # portfolio, lastOutputs) is what that event's real state holds; otherwise the
    # event is evaluated again in its turn. Results do not change; 0 = off.
    lookahead_events: Annotated[int, msgspec.Meta(ge=0, le=256)] = 16
    # Event time only: once an agent's first this many runs have all failed (a model
    # that is not running, a key refused), it starts no more and the replay stops;
    # every later run would fail the same way. 0 = never (`backtest --run-llm`: 3).
    stop_after_failed_runs: Annotated[int, msgspec.Meta(ge=0)] = 0
    sandbox: SandboxConfig = msgspec.field(default_factory=SandboxConfig)

    def __post_init__(self) -> None:
        if self.alert_webhook:
            check_http_url(self.alert_webhook, "alert_webhook")


class AuditSection(Base, frozen=True):
    # "" = <daemon.state_dir>/audit
    dir: str = ""
    max_total_mb: Annotated[int, msgspec.Meta(ge=1)] = 512
    max_days: Annotated[int, msgspec.Meta(ge=1)] = 30
    flush_interval_seconds: Annotated[float, msgspec.Meta(gt=0)] = 0.2


class TradingSection(Base, frozen=True):
    # ACTIVE; REDUCING (only orders that shrink a position); HALTED (no orders).
    state: Literal["ACTIVE", "REDUCING", "HALTED"] = "ACTIVE"
    # The share of a closed candle's volume one paper order may fill in that candle
    # (0 = orders fill whole); the rest keeps working and fills in parts.
    paper_max_participation: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    # Paper fees in basis points of each fill's notional: a resting limit the market
    # reached pays the maker rate; market, stop and marketable orders the taker rate.
    paper_maker_fee_bps: Annotated[float, msgspec.Meta(ge=0, le=1000)] = 0.0
    paper_taker_fee_bps: Annotated[float, msgspec.Meta(ge=0, le=1000)] = 0.0
    # Taker fills (market, stop and marketable orders) execute this many basis points
    # worse than the price they fill at (a limit never past its limit); makers do not.
    paper_slippage_bps: Annotated[float, msgspec.Meta(ge=0, le=1000)] = 0.0


class McpSection(Base, frozen=True):
    # Serve the agent tools over MCP streamable HTTP (http://host:port/mcp) from the
    # daemon, sharing its Coinbase connection. `marketwake mcp` serves stdio instead.
    enabled: bool = False
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 7880
    # Required when host is not loopback: clients send "Authorization: Bearer <token>".
    token: Secret = msgspec.field(default_factory=Secret)
    max_request_bytes: Annotated[int, msgspec.Meta(ge=1024, le=64 * 1024 * 1024)] = 1024 * 1024
    # The agent that submit_trading_signal / get_positions / get_orders act for over
    # MCP: its paper account, risk limits and [wake.runner] signal settings. Empty:
    # those tools answer "unavailable" (the market tools work either way).
    agent: str = ""

    def __post_init__(self) -> None:
        if self.host not in ("127.0.0.1", "::1", "localhost") and not self.token:
            raise ValueError(f"host {self.host!r} is not loopback: set a token")


class SentimentSection(Base, frozen=True):
    """Sources of ``fetch_sentiment_data`` (docs/tools.md); each is optional."""

    # RSS or Atom feeds; their items that name the symbol are scored.
    rss_feeds: list[str] = msgspec.field(default_factory=list)
    # A Tavily-compatible search API: POST {"query", "topic": "news", "max_results"}.
    search_url: str = ""
    search_api_key: Secret = msgspec.field(default_factory=Secret)
    # The crypto Fear & Greed index in alternative.me's format.
    fear_greed_url: str = ""
    # Headlines returned to the model (and scored), newest sources first.
    max_results: Annotated[int, msgspec.Meta(ge=1, le=50)] = 8
    # Per request; the whole call answers within 15 s whatever the sources do.
    request_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=15)] = 10.0
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024, le=64 * 1024 * 1024)] = 2 * 1024 * 1024

    def __post_init__(self) -> None:
        for i, url in enumerate(self.rss_feeds):
            check_http_url(url, f"rss_feeds[{i}]")
        for key in ("search_url", "fear_greed_url"):
            if url := getattr(self, key):
                check_http_url(url, key)

    @property
    def configured(self) -> bool:
        """Whether any source is set."""
        return bool(self.rss_feeds or self.search_url or self.fear_greed_url)


class DflowSection(Base, frozen=True):
    """``discover_event``'s prediction-market source: DFlow's Metadata API."""

    # The developer endpoint needs no key (rate-limited); production needs api_key.
    base_url: str = "https://dev-prediction-markets-api.dflow.net"
    api_key: Secret = msgspec.field(default_factory=Secret)  # sent as x-api-key
    request_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=30)] = 10.0
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024, le=64 * 1024 * 1024)] = 8 * 1024 * 1024

    def __post_init__(self) -> None:
        check_http_url(self.base_url, "base_url")


class ToolsSection(Base, frozen=True):
    sentiment: SentimentSection = msgspec.field(default_factory=SentimentSection)
    dflow: DflowSection = msgspec.field(default_factory=DflowSection)


class Config(Base, frozen=True):
    daemon: DaemonSection = msgspec.field(default_factory=DaemonSection)
    bus: BusSection = msgspec.field(default_factory=BusSection)
    feeds: FeedsSection = msgspec.field(default_factory=FeedsSection)
    state: StateSection = msgspec.field(default_factory=StateSection)
    hooks: HooksSection = msgspec.field(default_factory=HooksSection)
    audit: AuditSection = msgspec.field(default_factory=AuditSection)
    trading: TradingSection = msgspec.field(default_factory=TradingSection)
    copytrade: CopytradeSection = msgspec.field(default_factory=CopytradeSection)
    rag: RagConfig = msgspec.field(default_factory=RagConfig)
    mcp: McpSection = msgspec.field(default_factory=McpSection)
    tools: ToolsSection = msgspec.field(default_factory=ToolsSection)

    def __post_init__(self) -> None:
        if not self.rag.store.path:  # the pattern store lives beside the daemon's state
            store = msgspec.structs.replace(
                self.rag.store, path=str(Path(self.daemon.state_dir) / "rag")
            )
            rag = msgspec.structs.replace(self.rag, store=store)
            msgspec.structs.force_setattr(self, "rag", rag)
        if not self.state.shared and (self.hooks.enabled and self.hooks.run_agents):
            raise ValueError(
                "state.shared = false needs hooks.run_agents = false (the agents' tools "
                "read the shared market state)"
            )
        if not self.state.shared and self.mcp.enabled:
            raise ValueError(
                "state.shared = false needs mcp.enabled = false (the MCP tools read the "
                "shared market state)"
            )

    @property
    def audit_dir(self) -> Path:
        """Where the audit log lives."""
        return Path(self.audit.dir) if self.audit.dir else Path(self.daemon.state_dir) / "audit"

    @property
    def event_time(self) -> bool:
        """Whether agents live on event time (``[daemon] clock``; auto: no live feed)."""
        if self.daemon.clock != "auto":
            return self.daemon.clock == "event"
        feeds = self.feeds
        live = (
            feeds.coinbase_ws,
            feeds.candles,
            feeds.movers,
            feeds.copytrade_webhook,
            feeds.tradingview,
        )
        return not any(f.enabled for f in live)


_SECRET_KEY = re.compile(
    r"(secret|token|password|passphrase|api_key|apikey|authorization)", re.IGNORECASE
)


def expand_env(value: Any, path: str, *, keep_missing: bool = False) -> Any:
    """Substitute ``${VAR}`` recursively; a missing variable is a ConfigError, or
    left as written with ``keep_missing`` (a disabled agent may name a key that
    is not set yet)."""
    if isinstance(value, dict):
        return {
            k: expand_env(v, f"{path}.{k}" if path else k, keep_missing=keep_missing)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            expand_env(v, f"{path}[{i}]", keep_missing=keep_missing) for i, v in enumerate(value)
        ]
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name in os.environ:
                return os.environ[name]
            if keep_missing:
                return m.group(0)
            raise ConfigError(f"{path}: environment variable {name} is not set")

        return _VAR.sub(sub, value)
    return value


def unexpanded(value: str) -> list[str]:
    """The ``${VAR}`` names left in ``value``: variables that were not set when it was
    loaded with ``keep_missing`` (a disabled agent's key)."""
    return _VAR.findall(value)


def decode_hook(type_: type, obj: Any) -> Any:
    """msgspec ``dec_hook``: a string where a :class:`Secret` is expected becomes one."""
    if type_ is Secret:
        if isinstance(obj, str):
            return Secret(obj)
        # msgspec reports this at the key's path: `api_key = 5` is a config error
        raise TypeError(f"Expected `str`, got `{type(obj).__name__}`")
    raise NotImplementedError(f"cannot decode {type_!r}")


def _lookup(raw: Any, path: str) -> Any:
    """Follow a msgspec error path like ``$.feeds.candles[0]`` through raw data."""
    cur = raw
    for part in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        key, index = part
        try:
            cur = cur[key] if key else cur[int(index)]
        except (KeyError, IndexError, TypeError):
            return None
    return cur


def _type_at(root: type, path: str) -> Any:
    """msgspec's type info of the field at an error path (``$.wake.runner``), or None."""
    info: Any = msgspec.inspect.type_info(root)
    for name, item in re.findall(r"\.([^.\[]+)|(\[[^\]]*\])", path):
        info = _struct_of(info)
        if item:  # a table of sections (leaders.<name>) or a list's entry
            info = getattr(info, "value_type", None) or getattr(info, "item_type", None)
            continue
        fields = {f.encode_name: f.type for f in getattr(info, "fields", ())}
        if name not in fields:
            return None
        info = fields[name]
    return _struct_of(info)


def _struct_of(info: Any) -> Any:
    """``info``, or the section in it when it is optional (``X | None``)."""
    for option in getattr(info, "types", ()):
        if isinstance(option, msgspec.inspect.StructType):
            return option
    return info


def _choices(root: type, path: str) -> list[Any]:
    """The allowed values of the Literal field at ``path``, if it is one."""
    return list(getattr(_type_at(root, path), "values", ()))


def _unknown_key(root: type, where: str, name: str) -> str:
    """``unknown key 'topic' (did you mean 'topics'?)``, else the keys that exist."""
    known = [f.encode_name for f in getattr(_type_at(root, where), "fields", ())]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    top = root is Config and where == "$"
    what = "section or key" if top else "key"
    if close:
        return f"unknown {what} {name!r} (did you mean {close[0]!r}?)"
    listed = "top-level sections are" if top else "known keys"
    return f"unknown {what} {name!r} ({listed}: {', '.join(known)})"


def describe_error(
    raw: dict[str, Any], err: msgspec.ValidationError, source: str, root: type = Config
) -> str:
    """One line for a decoding problem: the file, the key path, what is wrong and
    what was found (secrets masked), the allowed values or the likely key meant."""
    text = str(err)
    msg, _, where = text.rpartition(" - at `")
    if not msg:
        msg, where = text, "$"
    where = where.rstrip("`")
    key = where.removeprefix("$").lstrip(".")
    prefix = f"{source}: {key}: " if key else f"{source}: "
    unknown = re.match(r"Object contains unknown field `([^`]+)`", msg)
    if unknown:
        return prefix + _unknown_key(root, where, unknown.group(1))
    found = _lookup(raw, where)
    choices = _choices(root, where)
    if choices:
        allowed = ", ".join(repr(c) for c in choices)
        return f"{prefix}expected one of {allowed} (found {found!r})"
    if key and found is not None and not isinstance(found, (dict, list)):
        if _SECRET_KEY.search(key):
            found = "***"
        return f"{prefix}{msg[0].lower()}{msg[1:]} (found {found!r})"
    return f"{prefix}{msg[0].lower()}{msg[1:]}"


def parse(text: str, source: str = "<config>") -> Config:
    """Decode config text; every problem becomes one readable ConfigError."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    try:
        expanded = expand_env(raw, "")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    try:
        return msgspec.convert(expanded, Config, dec_hook=decode_hook)
    except msgspec.ValidationError as exc:
        raise ConfigError(describe_error(expanded, exc, source)) from None


def load(path: Path | str | None = None) -> Config:
    """Read and decode a config file (``config.toml`` by default)."""
    p = Path(path) if path is not None else DEFAULT_CONFIG_PATH
    try:
        text = read_input(p, MAX_CONFIG_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read config: {exc}") from None
    return parse(text, str(p))
