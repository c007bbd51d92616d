"""What ``run`` would reject, found before anything starts.

Decoding ``config.toml`` catches wrong keys, types and URL shapes. What needs
the filesystem is checked here, once, by both ``marketwake config check`` and
the daemon's start: the replay file (it exists and its first record parses),
the agents directory, every agent workspace (``agent.toml`` decodes, hook
files are readable) and the pattern tool's funding / open-interest files.
``config check`` reports every problem as one :class:`ConfigError` (exit 2).
At the daemon's start the daemon's own problems stop it the same way, while an
agent's problems are that agent's: the others start (a service that restarts
after a reboot must not leave every agent down for one stray file), the broken
files are logged and ``status`` lists them, as during a hot reload. Only when
no agent would start at all does the start stop (or when the caller runs one
agent, ``agents="all"``: a backtest).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from daemon.agents.workspace import Agent, discover, load_agent
from daemon.config import Config, unexpanded
from daemon.errors import ConfigError, ReplayError
from feeds.replay import ReplayFeed


@dataclass
class Report:
    """The problems found, one line each, and a line per agent for ``config check``."""

    # The daemon's own: its config and what it points at.
    problems: list[str] = field(default_factory=list)
    # One agent's: its agent.toml, its hook files.
    agent_problems: list[str] = field(default_factory=list)
    agents: list[str] = field(default_factory=list)  # the agents that load
    enabled: int = 0  # of them, those a daemon starts

    def raise_for_problems(self, agents: Literal["all", "some"] = "all") -> None:
        """One ConfigError listing every problem (the first on the first line).
        ``agents="some"``: an agent's problems only count when no enabled agent loads."""
        found = self.problems + self.agent_problems
        if agents == "some" and not self.problems and self.enabled:
            found = []
        if found:
            more = f" (and {len(found) - 1} more below)" if len(found) > 1 else ""
            raise ConfigError("\n  ".join([found[0] + more, *found[1:]]))


def check(cfg: Config, record: Path | None = None) -> Report:
    """Everything ``cfg`` needs from the filesystem (``record``: ``run --record``'s
    file, else ``[daemon] record``). Blocking (reads files)."""
    report = Report()
    _check_dirs(cfg, report)
    _check_record(record or (Path(cfg.daemon.record) if cfg.daemon.record else None), report)
    _check_feeds(cfg, report)
    _check_rag_files(cfg, report)
    if cfg.hooks.enabled:
        _check_agents(cfg, report)
    return report


def _check_rag_files(cfg: Config, report: Report) -> None:
    """The pattern tool's funding / open-interest files, when named: regular files
    (read on the first call, then kept; a bad row is that call's answer)."""
    ex = cfg.rag.exchange
    for key, name in (
        ("funding_file", ex.funding_file),
        ("open_interest_file", ex.open_interest_file),
    ):
        path = Path(name)
        if name and not path.is_file():
            what = "is not a regular file" if path.exists() else "does not exist"
            report.problems.append(f"rag.exchange.{key}: {name!r} {what}")


def _check_dirs(cfg: Config, report: Report) -> None:
    """The directories the daemon creates must not be something else (agents_dir:
    :func:`_check_agents`)."""
    dirs = [("daemon.state_dir", Path(cfg.daemon.state_dir))]
    if cfg.audit.dir:
        dirs.append(("audit.dir", Path(cfg.audit.dir)))
    for key, path in dirs:
        if path.exists() and not path.is_dir():
            report.problems.append(f"{key}: {str(path)!r} exists and is not a directory")


def _check_record(path: Path | None, report: Report) -> None:
    """The recording is appended to: a regular file or none yet, in a directory (a
    FIFO there would hold the start until something read it)."""
    if path is None:
        return
    if path.exists() and not path.is_file():
        report.problems.append(
            f"daemon.record: {str(path)!r} exists and is not a regular file (name a file)"
        )
    elif not path.parent.is_dir() and path.parent.exists():
        report.problems.append(f"daemon.record: {str(path.parent)!r} exists and is not a directory")


def _check_feeds(cfg: Config, report: Report) -> None:
    if cfg.feeds.coinbase_ws.enabled:
        try:
            cfg.feeds.coinbase_ws.check()
        except ConfigError as exc:
            report.problems.append(str(exc))
    replay = cfg.feeds.replay
    if not replay.enabled:
        return
    if not replay.path:
        report.problems.append("feeds.replay.path: must name a file when the replay is enabled")
        return
    for i, part in enumerate(ReplayFeed(replay).parts()):
        key = "feeds.replay.path" if i == 0 else f"feeds.replay.files[{i - 1}].path"
        path = Path(part.config.path)
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "does not exist"
            report.problems.append(f"{key}: {part.config.path!r} {what}")
            continue
        events = part.events()
        try:
            next(events, None)  # the header and the first record parse
        except ReplayError as exc:
            report.problems.append(f"feeds.replay: {exc}")
        finally:
            events.close()


def _check_agents(cfg: Config, report: Report) -> None:
    agents_dir = Path(cfg.hooks.agents_dir)
    if not agents_dir.is_dir():
        report.problems.append(
            f"hooks.agents_dir: {str(agents_dir)!r} is not a directory (create it with "
            "agents/<id>/hooks/, or set [hooks] enabled = false to run without hooks)"
        )
        return
    sandbox = cfg.hooks.sandbox
    found = discover(agents_dir)
    if cfg.mcp.enabled and cfg.mcp.agent and cfg.mcp.agent not in {p.name for p in found}:
        report.problems.append(
            f"mcp.agent: no agent {cfg.mcp.agent!r} in {str(agents_dir)!r} "
            f"(agents: {', '.join(sorted(p.name for p in found)) or 'none'})"
        )
    for leader in cfg.copytrade.leader_agents:
        if leader not in {p.name for p in found}:
            report.problems.append(
                f"copytrade.leader_agents: no agent {leader!r} in {str(agents_dir)!r}"
            )
    for path in found:
        try:
            agent = load_agent(path, sandbox.max_source_bytes, sandbox.max_agent_source_bytes)
        except ConfigError as exc:
            report.agent_problems.append(f"agent {path.name!r}: {exc}")
            continue
        report.agent_problems += [
            f"agent {agent.agent_id!r}: {problem}" for problem in agent.errors.values()
        ]
        report.agents.append(describe(agent))
        report.enabled += agent.config.enabled


def describe(agent: Agent) -> str:
    """``scanner: disabled, 1 hook, runner llm (anthropic claude-…)``."""
    cfg = agent.config
    runner = cfg.wake.runner
    how: str = runner.kind
    if runner.kind == "llm":
        how += f" ({runner.provider} {runner.model})"
        if missing := unexpanded(runner.api_key.reveal()):
            # a disabled agent may name it; say so before it is enabled (or run anyway)
            how += f"; api_key reads ${{{missing[0]}}}, not set"
    hooks = len(agent.hooks)
    state = "enabled" if cfg.enabled else "disabled"
    return f"{agent.agent_id}: {state}, {hooks} hook{'s' * (hooks != 1)}, runner {how}"
