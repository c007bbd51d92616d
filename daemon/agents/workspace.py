"""Agent workspaces on disk: ``agents/<id>/agent.toml`` and ``agents/<id>/hooks/*.py``.

A workspace is read into an :class:`Agent`: its typed config and the current
revision of every hook file. Hook files that cannot be read are kept as
errors next to the good ones, so one broken file never hides the others.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import msgspec

from daemon.config import decode_hook, describe_error, expand_env
from daemon.copytrade.follow import FollowSettings
from daemon.errors import ConfigError, HookCompileError, WorkspaceFileError
from daemon.events import validate_pattern
from daemon.trading.intents import RiskLimits
from daemon.wake.policy import WakePolicy
from hooks_runtime.hookfile import HookSpec, hook_paths, load_hook
from hooks_runtime.safe_read import is_plain_dir, read_regular

AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
AGENT_FILE = "agent.toml"
MAX_AGENT_TOML_BYTES = 64 * 1024


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``agent.toml``: what the agent listens to and the limits it runs under."""

    enabled: bool = True
    # Topic patterns (``*`` one token, ``>`` the rest) this agent's hooks see.
    topics: list[str] = msgspec.field(default_factory=lambda: ["market.candle.closed"])
    # Only events for these symbols (empty = every symbol; events without one pass).
    symbols: list[str] = msgspec.field(default_factory=list)
    # Candles per series in the hooks' ``state`` (more = slower round trips).
    state_candles: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 50
    # The paper account this agent trades in; empty = its own (the agent id).
    # Agents naming the same account share positions, orders, PnL and limits' view.
    account: str = ""
    # Pause the whole agent after this many hooks are paused (0 = never).
    pause_agent_after_paused_hooks: Annotated[int, msgspec.Meta(ge=0)] = 0
    wake: WakePolicy = msgspec.field(default_factory=WakePolicy)
    risk: RiskLimits = msgspec.field(default_factory=RiskLimits)
    # How this agent copies leaders, if it follows any (docs/copytrade.md).
    copytrade: FollowSettings = msgspec.field(default_factory=FollowSettings)

    def __post_init__(self) -> None:
        if not self.topics:
            raise ValueError("topics must list at least one topic pattern")
        for pattern in self.topics:
            validate_pattern(pattern)
        if self.account and not AGENT_ID.match(self.account):
            raise ValueError(
                "account must be 1-64 letters, digits, '_', '.' or '-', starting with a "
                f"letter or digit (got {self.account!r})"
            )


@dataclass
class Agent:
    """One agent as loaded from disk."""

    agent_id: str
    path: Path
    config: AgentConfig
    hooks: dict[str, HookSpec] = field(default_factory=dict)
    hook_paths: dict[str, Path] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def load_agent_config(path: Path) -> AgentConfig:
    """Decode an ``agent.toml``; problems are one ConfigError naming the file and key."""
    if not os.path.lexists(path):
        return AgentConfig()
    try:
        data = read_regular(path, MAX_AGENT_TOML_BYTES, "agent.toml")
        raw = tomllib.loads(data.decode("utf-8"))
    except WorkspaceFileError as exc:
        raise ConfigError(str(exc)) from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        # ${VAR} is read from the environment (an LLM runner's api_key), as in config.toml;
        # a disabled agent may name one that is not set (it is checked once enabled).
        expanded = expand_env(raw, "", keep_missing=raw.get("enabled") is False)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        return msgspec.convert(expanded, AgentConfig, dec_hook=decode_hook)
    except msgspec.ValidationError as exc:
        raise ConfigError(describe_error(expanded, exc, str(path), AgentConfig)) from None


def load_agent(path: Path, max_source_bytes: int, max_total_bytes: int = 0) -> Agent:
    """Read one workspace directory (config and hook files). Blocking: call it from a
    worker thread. ``max_total_bytes`` (0 = no cap) bounds the agent's hook sources
    together: files past it are refused for this agent alone."""
    agent = Agent(path.name, path, load_agent_config(path / AGENT_FILE))
    hooks_dir = path / "hooks"
    if os.path.lexists(hooks_dir) and not is_plain_dir(hooks_dir):  # said, not silent
        agent.errors["hooks"] = (
            f"{hooks_dir}: not a plain directory (a symbolic link, or a file): none of "
            "its hooks are loaded"
        )
    total = 0
    for hook_path in hook_paths(hooks_dir):
        if max_total_bytes and total >= max_total_bytes:
            agent.errors[_hook_id(hook_path)] = (
                f"{hook_path.name}: the agent's hooks already hold {total} bytes, the "
                f"[hooks.sandbox] max_agent_source_bytes cap ({max_total_bytes}); "
                "split the agent or raise the cap"
            )
            continue
        try:
            spec = load_hook(hook_path, max_source_bytes)
        except HookCompileError as exc:
            agent.errors[_hook_id(hook_path)] = str(exc)
            continue
        total += len(spec.source.encode())
        agent.hooks[spec.hook_id] = spec
        agent.hook_paths[spec.hook_id] = hook_path
    return agent


def _hook_id(path: Path) -> str:
    """A printable id for a hook file, even one whose name is not UTF-8."""
    return path.stem.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")


def discover(agents_dir: Path) -> list[Path]:
    """Workspace directories under ``agents_dir``: those with an ``agent.toml`` or a
    ``hooks/`` (a state dir or a notes folder kept there is no agent). Hidden,
    invalid and symlinked names are skipped: a link could make one agent run
    another's files."""
    if not agents_dir.is_dir():
        return []
    return sorted(
        p
        for p in agents_dir.iterdir()
        if AGENT_ID.match(p.name)
        and is_plain_dir(p)
        and (os.path.lexists(p / AGENT_FILE) or os.path.lexists(p / "hooks"))
    )
