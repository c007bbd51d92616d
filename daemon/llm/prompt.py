"""What the model reads: the agent's own instructions, then why it was woken.

The system prompt is ``agents/<id>/AGENT.md`` (a regular file of at most
64 KiB, read like every workspace file: no links, no FIFOs). The first user
message renders the :class:`WakeContext`: the hooks' reasons with their
events, older wakes summarized, and a compact JSON state (last candles and
indicators of the symbols involved).
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import msgspec
import structlog

from daemon.errors import WorkspaceFileError
from daemon.wake.context import WakeContext
from hooks_runtime.safe_read import read_regular

log = structlog.get_logger("llm")
MAX_AGENT_MD_BYTES = 64 * 1024
DEFAULT_SYSTEM = (
    "You are a trading agent run by marketwake. A hook decided that the market needs "
    "your attention; the user message says why. Use the tools to check the situation, "
    "then answer with a short assessment and what you would do."
)


def _read(path: Path) -> bytes | None:
    """AGENT.md's bytes; None when there is none. Blocking: run it in a thread."""
    if not os.path.lexists(path):
        return None
    try:
        return read_regular(path, MAX_AGENT_MD_BYTES, "AGENT.md")
    except WorkspaceFileError as exc:  # there is one, but it cannot be used: say why
        log.warning("AGENT.md not used; the default prompt runs", error=str(exc))
        return None


async def system_prompt(agent_dir: Path | None) -> str:
    """AGENT.md of the agent, or a neutral default when there is none (or it is unusable)."""
    if agent_dir is None:
        return DEFAULT_SYSTEM
    data = await anyio.to_thread.run_sync(_read, agent_dir / "AGENT.md")
    text = data.decode("utf-8", errors="replace").strip() if data else ""
    return text or DEFAULT_SYSTEM


def render_context(ctx: WakeContext) -> str:
    """The wake as the model's first message."""
    lines = [f"# {ctx.kind} run {ctx.run_id} at {ctx.triggered_at}"]
    if ctx.rerun_of:
        lines.append(
            f"A restart cut run {ctx.rerun_of}, which had these same wakes; this run "
            "repeats it. What it did may stand: check get_orders and get_positions "
            "before you trade (a signal it placed for a symbol is not placed again)."
        )
    if ctx.reasons:
        lines.append("")
        lines.append("## Why you were woken (oldest first)")
        for r in ctx.reasons:
            where = " ".join(x for x in (r.symbol, r.topic, r.ts) if x)
            about = "; ".join(x for x in (where, r.event_id and f"event {r.event_id}") if x)
            lines.append(f"- {r.hook_id}: {r.reason}" + (f" ({about})" if about else ""))
    else:
        lines.append("No hook woke you: this is a periodic audit run. Review and report.")
    if ctx.earlier:
        lines.append(ctx.earlier)
    if ctx.state:
        lines.append("")
        lines.append("## Market state (JSON: last candles, indicators, ticks)")
        lines.append(msgspec.json.encode(ctx.state).decode())
    return "\n".join(lines)
