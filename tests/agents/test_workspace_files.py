"""Hostile workspace files: refused for their agent, never a hang, crash or leak."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import msgspec
import pytest
from click.testing import CliRunner

from daemon.agents.pipeline import open_agents
from daemon.agents.workspace import load_agent
from daemon.cli.main import cli
from daemon.config import Config
from daemon.service import Service
from tests.agents.test_pipeline import WAKE_EVERY, PacedFeed, audit, candle

SECRET = "DB_PASSWORD=hunter2-do-not-leak"


def agent(root: Path, agent_id: str, hooks: dict[str, str] | None = None) -> Path:
    path = root / "agents" / agent_id
    (path / "hooks").mkdir(parents=True)
    for name, src in (hooks or {}).items():
        (path / "hooks" / name).write_text(src)
    return path


def test_links_special_files_and_bad_names_are_refused_without_echoing(tmp_path: Path) -> None:
    secret = tmp_path / "secret.env"
    secret.write_text(SECRET + "\n")
    other = agent(tmp_path, "other", {"wake_mine.py": WAKE_EVERY})
    a = agent(tmp_path, "a", {"wake_ok.py": WAKE_EVERY})
    hooks = a / "hooks"
    (hooks / "wake_leak.py").symlink_to(secret)
    (hooks / "wake_steal.py").symlink_to(other / "hooks" / "wake_mine.py")
    os.link(other / "hooks" / "wake_mine.py", hooks / "wake_hard.py")
    os.mkfifo(hooks / "wake_fifo.py")
    (hooks / os.fsdecode(b"wake_\xff\xfe.py")).write_text(WAKE_EVERY)
    loaded = load_agent(a, 256 * 1024)
    assert sorted(loaded.hooks) == ["wake_ok"]
    errors = loaded.errors
    assert "symbolic link" in errors["wake_leak"] and "symbolic link" in errors["wake_steal"]
    assert "hard links" in errors["wake_hard"] and "not a regular file" in errors["wake_fifo"]
    (bad_name,) = [k for k in errors if k.startswith("wake_\\")]
    assert "rename it" in errors[bad_name]
    assert all(SECRET not in e for e in errors.values())


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "huge", "symlink"])
def test_a_special_agent_toml_is_a_config_error(tmp_path: Path, kind: str) -> None:
    from daemon.errors import ConfigError

    a = agent(tmp_path, "a")
    toml = a / "agent.toml"
    if kind == "fifo":
        os.mkfifo(toml)
    elif kind == "dev_zero":
        toml.symlink_to("/dev/zero")
    elif kind == "huge":
        toml.write_bytes(b"# padding\n" * 2_600_000)  # 26 MB
    else:
        (tmp_path / "real.toml").write_text("enabled = true\n")
        toml.symlink_to(tmp_path / "real.toml")
    with pytest.raises(ConfigError, match=r"agent\.toml") as err:
        load_agent(a, 256 * 1024)
    assert "padding" not in str(err.value)


def test_an_agents_hook_sources_are_capped_together(tmp_path: Path) -> None:
    """34 hooks of ~250 KB: those past the per-agent cap are refused, with what to change."""
    big = WAKE_EVERY + "#" + "x" * 250_000 + "\n"
    a = agent(tmp_path, "a", {f"wake_h{i:02d}.py": big for i in range(34)})
    loaded = load_agent(a, 256 * 1024, 2 * 1024 * 1024)
    assert len(loaded.hooks) == 9  # 9 x 250 KB fit under 2 MiB
    assert len(loaded.errors) == 25
    assert all("max_agent_source_bytes" in e for e in loaded.errors.values())


async def test_the_daemon_serves_other_agents_beside_hostile_workspaces(tmp_path: Path) -> None:
    """A FIFO agent.toml, a /dev/zero agent.toml, a symlinked agent directory and a
    symlinked hook: the daemon starts, stops promptly, and the calm agent is served."""
    agent(tmp_path, "calm", {"wake_every.py": WAKE_EVERY})
    os.mkfifo(agent(tmp_path, "fifo") / "agent.toml")
    (agent(tmp_path, "zero") / "agent.toml").symlink_to("/dev/zero")
    (tmp_path / "agents" / "alias").symlink_to(tmp_path / "agents" / "calm")
    secret = tmp_path / "secret.env"
    secret.write_text(SECRET)
    (agent(tmp_path, "leaky") / "hooks" / "wake_x.py").symlink_to(secret)
    broken = agent(tmp_path, "broken", {"wake_typo.py": "def evaluate(e, s)\n    return 1\n"})
    cfg = msgspec.convert(
        {
            "daemon": {"state_dir": str(tmp_path / "state")},
            "hooks": {"agents_dir": str(tmp_path / "agents"), "reload_seconds": 0.05},
        },
        Config,
    )
    feed = PacedFeed([candle(i) for i in range(5)], gap=0.02)
    svc = Service(cfg, lambda _: [feed], components=[open_agents])
    with anyio.fail_after(20):
        status = await svc.run()
    rows = [r for r in audit(tmp_path) if r["type"] == "hook"]
    assert {r["agentId"] for r in rows} == {"calm"}
    assert len(rows) == 5
    hooks = status.hooks
    assert hooks is not None and sorted(hooks.config_errors) == ["fifo", "zero"]
    assert "symbolic link" in hooks.agents["leaky"].file_errors["wake_x"]
    typo = hooks.agents["broken"].compile_errors["wake_typo"]
    assert typo.startswith(f"{broken}/hooks/wake_typo.py: revision ") and "SyntaxError" in typo
    assert "does not compile" in typo and typo.endswith("the hook does not run")
    # and `status` shows each, under its agent
    shown = CliRunner().invoke(cli, ["status", "--state-dir", str(tmp_path / "state")]).stdout
    assert f"agent fifo NOT LOADED: {hooks.config_errors['fifo']}" in shown
    leaky = shown.index("agent leaky:")
    assert shown.index("NOT LOADED: " + hooks.agents["leaky"].file_errors["wake_x"]) > leaky
    assert f"    NOT LOADED: {typo}" in shown
    everything = b"".join(f.read_bytes() for f in (tmp_path / "state").rglob("*") if f.is_file())
    assert SECRET.encode() not in everything


def test_only_directories_with_an_agent_toml_or_hooks_are_agents(tmp_path: Path) -> None:
    """A state dir kept under the agents dir, or a folder of notes, is no agent (it was
    one with no hooks, subscribed to every event and with an account of its own)."""
    from daemon.agents.workspace import discover

    root = tmp_path / "agents"
    agent(tmp_path, "hooked")
    (root / "configured").mkdir()
    (root / "configured" / "agent.toml").write_text("enabled = false\n")
    (root / "state" / "audit").mkdir(parents=True)  # a daemon's state dir
    (root / "notes").mkdir()
    (root / "linked").mkdir()
    (root / "linked" / "hooks").symlink_to(root / "hooked" / "hooks")  # refused when loaded
    (root / "piped").mkdir()
    os.mkfifo(root / "piped" / "hooks")  # never opened: a read would block
    assert [p.name for p in discover(root)] == ["configured", "hooked", "linked", "piped"]
    for odd in ("linked", "piped"):
        loaded = load_agent(root / odd, 256 * 1024)
        assert not loaded.hooks and "not a plain directory" in loaded.errors["hooks"]
    assert not load_agent(root / "configured", 256 * 1024).errors  # no hooks/ at all: fine
