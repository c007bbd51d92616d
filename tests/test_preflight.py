"""`config check` and the daemon's start reject what `run` cannot run, naming file and key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from daemon import preflight
from daemon.app import run_daemon
from daemon.config import Config, parse
from daemon.errors import ConfigError
from feeds.synthetic import generate_candles
from tests.test_cli import mw

LLM = '[wake.runner]\nkind = "llm"\nprovider = "anthropic"\nmodel = "claude-x"\n'


def config(tmp_path: Path, extra: str = "", agents: Path | None = None) -> Config:
    agents_dir = agents if agents is not None else tmp_path / "agents"
    return parse(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
        f'[hooks]\nagents_dir = "{agents_dir}"\n' + extra,
        "c.toml",
    )


def agent(root: Path, name: str, toml: str, hooks: dict[str, str] | None = None) -> Path:
    path = root / "agents" / name
    (path / "hooks").mkdir(parents=True)
    (path / "agent.toml").write_text(toml)
    for file, source in (hooks or {}).items():
        (path / "hooks" / file).write_text(source)
    return path


def problems(cfg: Config) -> list[str]:
    report = preflight.check(cfg)
    return report.problems + report.agent_problems


def test_a_good_setup_has_no_problems_and_describes_each_agent(tmp_path: Path) -> None:
    agent(tmp_path, "alpha", "", {"wake_x.py": "def evaluate(e, s):\n    return None\n"})
    agent(tmp_path, "scanner", "enabled = false\n" + LLM + 'api_key = "${MW_UNSET_KEY}"\n')
    report = preflight.check(config(tmp_path))
    assert report.problems == report.agent_problems == []
    assert report.agents == [
        "alpha: enabled, 1 hook, runner log",
        # not a problem while disabled, but said before it is enabled (or run anyway)
        (
            "scanner: disabled, 0 hooks, runner llm (anthropic claude-x); "
            "api_key reads ${MW_UNSET_KEY}, not set"
        ),
    ]


def test_agent_toml_problems_name_the_agent_the_file_and_the_key(tmp_path: Path) -> None:
    """A misspelt key gets a suggestion; a missing api_key and an unset ${VAR} of an
    enabled agent are errors; hook files the daemon refuses are listed too."""
    a = agent(tmp_path, "a", 'topic = ["market.candle.closed"]\n')
    b = agent(tmp_path, "b", LLM)
    c = agent(tmp_path, "c", LLM + 'api_key = "${MW_UNSET_KEY}"\n')
    agent(tmp_path, "d", "", {"wake_bad-name.py": "x = 1\n"})
    assert "MW_UNSET_KEY" not in os.environ
    assert problems(config(tmp_path)) == [
        f"agent 'a': {a}/agent.toml: unknown key 'topic' (did you mean 'topics'?)",
        (
            f"agent 'b': {b}/agent.toml: wake.runner: runner.api_key is missing "
            '(api_key = "${ANTHROPIC_API_KEY}" reads it from the environment); only a '
            "local base_url may go without one"
        ),
        (
            f"agent 'c': {c}/agent.toml: wake.runner.api_key: environment variable "
            "MW_UNSET_KEY is not set"
        ),
        (
            "agent 'd': 'wake_bad-name.py': rename it to wake_<name>.py with letters, "
            "digits and '_' only"
        ),
    ]


def test_a_missing_agents_dir_and_replay_problems_are_found(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    assert problems(config(tmp_path, agents=missing)) == [
        (
            f"hooks.agents_dir: '{missing}' is not a directory (create it with "
            "agents/<id>/hooks/, or set [hooks] enabled = false to run without hooks)"
        )
    ]
    off = "[hooks]\nenabled = false\n"

    def replay(body: str) -> list[str]:
        cfg = parse(f"{off}[feeds.replay]\nenabled = true\n{body}", "c.toml")
        return problems(cfg)

    assert replay("") == ["feeds.replay.path: must name a file when the replay is enabled"]
    nope = tmp_path / "nope.csv"
    assert replay(f'path = "{nope}"\n') == [f"feeds.replay.path: '{nope}' does not exist"]
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=1, n=10, timeframe="1m")
    assert replay(f'path = "{csv}"\n') == [
        f"feeds.replay: {csv}: feeds.replay.symbol must be set to replay CSV candles"
    ]
    assert replay(f'path = "{csv}"\nsymbol = "BTC-USD"\n') == []
    # more files: each is checked, named by its place
    more = f'path = "{csv}"\nsymbol = "BTC-USD"\nfiles = [{{ path = "{nope}" }}, {{ path = "{csv}" }}]\n'
    assert replay(more) == [f"feeds.replay.files[0].path: '{nope}' does not exist"]


def test_urls_are_checked_after_variable_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MW_TEST_URL", "api.example.com/v3")
    with pytest.raises(ConfigError) as info:
        parse('[feeds.movers]\nbase_url = "${MW_TEST_URL}"\n', "c.toml")
    assert str(info.value) == (
        "c.toml: feeds.movers: base_url must be an http:// or https:// URL with a host "
        "(got 'api.example.com/v3')"
    )
    with pytest.raises(ConfigError, match="hooks: alert_webhook must be an http"):
        parse('[hooks]\nalert_webhook = "slack"\n', "c.toml")


def test_the_daemon_refuses_to_start_when_no_agent_would(tmp_path: Path) -> None:
    """Every agent broken: exit 2 (ConfigError) before anything runs; every problem
    is listed, the first on the first line."""
    agent(tmp_path, "a", "topics = []\n")
    agent(tmp_path, "b", "state_candles = -1\n")
    agent(tmp_path, "c", "pause_agent_after_paused_hooks = -1\n")  # was: 1
    with pytest.raises(ConfigError) as info:
        run_daemon(config(tmp_path))
    first, second, third = str(info.value).splitlines()
    assert third.strip().startswith("agent 'c': ") and "expected `int` >= 0" in third
    assert first.startswith("agent 'a': ") and first.endswith(
        "topics must list at least one topic pattern (and 2 more below)"
    )
    assert second.strip().startswith("agent 'b': ") and "state_candles" in second
    assert not (tmp_path / "state").exists()


def test_one_broken_agent_does_not_keep_the_others_down(tmp_path: Path) -> None:
    """A restart after a reboot must not leave every agent down for one stray file:
    the good agent starts and evaluates, the broken agent and the refused hook file
    are in `status`. A backtest (agents="all") and `config check` still refuse it, as
    does a start where the only good agent is disabled (nothing would run)."""
    csv = tmp_path / "c.csv"
    generate_candles(csv, seed=1, n=10, timeframe="1m")
    replay = f'[feeds.replay]\nenabled = true\npath = "{csv}"\nsymbol = "BTC-USD"\n'
    hook = "def evaluate(e, s):\n    return {'decision': 'IGNORE', 'reason': 'ok'}\n"
    agent(tmp_path, "good", "", {"wake_ok.py": hook, "wake_bad-name.py": hook})
    agent(tmp_path, "typo", 'topic = ["x"]\n')
    cfg = config(tmp_path, replay)
    status = run_daemon(cfg)
    assert status.hooks is not None and status.hooks.evaluations == 10
    assert "unknown key 'topic'" in status.hooks.config_errors["typo"]
    assert "rename it to wake_<name>.py" in status.hooks.agents["good"].file_errors["wake_bad-name"]
    shown = mw("status", "--state-dir", str(tmp_path / "state")).stdout
    assert "agent typo NOT LOADED: " in shown and "    NOT LOADED: 'wake_bad-name.py'" in shown
    with pytest.raises(ConfigError, match="unknown key 'topic'"):
        run_daemon(cfg, agents="all")
    file = tmp_path / "c.toml"
    file.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
        f'[hooks]\nagents_dir = "{tmp_path / "agents"}"\n' + replay
    )
    checked = mw("config", "check", str(file))
    assert checked.returncode == 2 and "unknown key 'topic'" in checked.stderr
    (tmp_path / "agents" / "good" / "agent.toml").write_text("enabled = false\n")
    with pytest.raises(ConfigError, match="unknown key 'topic'"):
        run_daemon(cfg)


def test_config_check_prints_every_problem_and_exits_2(tmp_path: Path) -> None:
    agent(tmp_path, "a", 'topic = ["x"]\n')
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[hooks]\nagents_dir = "{tmp_path / "agents"}"\n'
        f'[feeds.replay]\nenabled = true\npath = "{tmp_path / "gone.jsonl"}"\n'
    )
    res = mw("config", "check", str(cfg))
    assert res.returncode == 2, res.stdout
    assert "feeds.replay.path: " in res.stderr and "gone.jsonl' does not exist" in res.stderr
    assert "unknown key 'topic' (did you mean 'topics'?)" in res.stderr
    ok = mw("config", "check", "config.toml")
    assert ok.returncode == 0 and "example: enabled, 3 hooks, runner log" in ok.stdout


def test_mcp_agent_must_be_an_agent_of_the_workspace(tmp_path: Path) -> None:
    agent(tmp_path, "alpha", "")
    assert problems(config(tmp_path, '[mcp]\nenabled = true\nagent = "alpha"\n')) == []
    assert problems(config(tmp_path, '[mcp]\nenabled = true\nagent = "alhpa"\n')) == [
        f"mcp.agent: no agent 'alhpa' in {str(tmp_path / 'agents')!r} (agents: alpha)"
    ]


def test_copytrade_leader_agents_must_be_agents_of_the_workspace(tmp_path: Path) -> None:
    agent(tmp_path, "alpha", "")
    assert problems(config(tmp_path, '[copytrade]\nleader_agents = ["alpha"]\n')) == []
    assert problems(config(tmp_path, '[copytrade]\nleader_agents = ["alpah"]\n')) == [
        f"copytrade.leader_agents: no agent 'alpah' in {str(tmp_path / 'agents')!r}"
    ]


def test_a_directory_setting_naming_a_file_is_one_clear_line(tmp_path: Path) -> None:
    """state_dir / audit.dir / agents_dir naming a file: a problem each, and `run`
    stops on it (it raised FileExistsError from deep in the start)."""
    (tmp_path / "f").write_text("x")
    f = tmp_path / "f"
    cfg = parse(
        f'[daemon]\nstate_dir = "{f}"\n[audit]\ndir = "{f}"\n[hooks]\nagents_dir = "{f}"\n',
        "c.toml",
    )
    found = problems(cfg)
    assert found[:2] == [
        f"{key}: {str(f)!r} exists and is not a directory"
        for key in ("daemon.state_dir", "audit.dir")
    ]
    assert found[2].startswith("hooks.agents_dir:")
    with pytest.raises(ConfigError, match=r"daemon\.state_dir"):
        run_daemon(cfg)


def test_a_record_file_that_is_a_directory_or_a_fifo_stops_the_start(tmp_path: Path) -> None:
    """[daemon] record (or run --record) naming a directory raised IsADirectoryError
    out of the recorder; a FIFO would hold the start until something read it."""
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    cfg = parse(f'[daemon]\nstate_dir = "{tmp_path / "s"}"\nrecord = "{tmp_path / "dir"}"\n', "c")
    assert problems(cfg) == [
        f"daemon.record: {str(tmp_path / 'dir')!r} exists and is not a regular file (name a file)"
    ]
    with pytest.raises(ConfigError, match=r"daemon\.record: .*fifo"):
        run_daemon(cfg, record_path=tmp_path / "fifo")
    fine = parse(
        f'[daemon]\nstate_dir = "{tmp_path / "s"}"\nrecord = "{tmp_path / "r.jsonl"}"\n', "c"
    )
    assert problems(fine) == []


def test_the_pattern_tools_files_must_exist(tmp_path: Path) -> None:
    """[rag.exchange] funding_file / open_interest_file that are not regular files are
    config errors naming the key (else the tool would say so only when first called)."""
    funding = tmp_path / "f.csv"
    funding.write_text("funding_time_ms,funding_rate\n")
    cfg = parse(
        f'[hooks]\nenabled = false\n[rag.exchange]\nfunding_file = "{funding}"\n'
        f'open_interest_file = "{tmp_path}"\n',
        "c.toml",
    )
    (problem,) = preflight.check(cfg).problems
    assert problem == f"rag.exchange.open_interest_file: {str(tmp_path)!r} is not a regular file"


def test_bad_coinbase_ws_settings_are_reported_only_when_the_feed_runs(tmp_path: Path) -> None:
    """`config check` lists a ticker feed's bad URL or timeout as one problem naming the
    key (never a traceback); the same values in a disabled section are no problem."""
    (tmp_path / "agents").mkdir()
    bad = '[feeds.coinbase_ws]\nurl = "https://example.invalid"\nidle_timeout_seconds = 0\n'
    assert problems(config(tmp_path, bad)) == []
    found = problems(config(tmp_path, bad + "enabled = true\n"))
    assert len(found) == 1 and found[0].startswith("feeds.coinbase_ws.url")
    slow = "[feeds.coinbase_ws]\nenabled = true\nidle_timeout_seconds = 0\n"
    assert problems(config(tmp_path, slow)) == [
        "feeds.coinbase_ws.idle_timeout_seconds: must be > 0"
    ]
