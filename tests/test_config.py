"""Config decoding: clear errors with the key path, env substitution, secrets hidden."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from daemon import config
from daemon.agents.workspace import load_agent_config
from daemon.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_shipped_config_is_valid() -> None:
    """The commented example config.toml at the root decodes."""
    cfg = config.load(ROOT / "config.toml")
    assert cfg.feeds.coinbase_ws.url.startswith("wss://")


def test_empty_config_uses_defaults() -> None:
    """Every key has a default."""
    cfg = config.parse("")
    assert cfg.bus.queue_size == 4096


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[bus]\nqueue_sise = 3\n", "bus: unknown key 'queue_sise'"),
        ("[bus]\nqueue_size = 'big'\n", "bus.queue_size: expected `int`, got `str` (found 'big')"),
        ("[feeds.candles]\ntimeframes = ['7m']\n", "feeds.candles: unknown timeframe '7m'"),
        # Product ids: `config check` used to pass these and `run` to fail (or subscribe
        # to an id no event would ever carry).
        (
            "[feeds.coinbase_ws]\nproducts = ['BTC-USD', 'eth-usd']\n",
            (
                "feeds.coinbase_ws: products[1]: 'eth-usd' is not a Coinbase product id like "
                "'BTC-USD' (did you mean 'ETH-USD'?)"
            ),
        ),
        (
            "[feeds.coinbase_ws]\nproducts = ['BTCUSD']\n",
            "feeds.coinbase_ws: products[0]: 'BTCUSD' is not a Coinbase product id",
        ),
        ("[feeds.candles]\nproducts = ['SOL-usd']\n", "(did you mean 'SOL-USD'?)"),
        (
            "[daemon]\nlog_format = 'xml'\n",
            "daemon.log_format: expected one of 'auto', 'console', 'json' (found 'xml')",
        ),
        ("[wake]\nx = 1\n", "unknown section or key 'wake' (top-level sections are: daemon,"),
        ("[bus\n", "not valid TOML"),
        ("[bus]\nqueue_size = 0\n", "bus.queue_size: expected `int` >= 1 (found 0)"),
        (
            "[daemon]\nstop_timeout_seconds = 900\n",
            "daemon.stop_timeout_seconds: expected `float` <= 600",
        ),
        ("[hooks]\nlookahead_events = 100000\n", "hooks.lookahead_events: expected `int` <= 256"),
        ("[hooks]\nlookahead_events = -1\n", "hooks.lookahead_events: expected `int` >= 0"),
        ("[hooks]\nreload_seconds = -1\n", "hooks.reload_seconds: expected `float` >= 0.0"),
        (
            "[hooks]\nalert_webhook_keep_seconds = -1\n",
            "hooks.alert_webhook_keep_seconds: expected `float` >= 0.0",
        ),
        ("[feeds.replay]\nfrom_ms = -5\n", "feeds.replay.from_ms: expected `int` >= 0"),
        ("[feeds.replay]\nspeed = -1\n", "feeds.replay.speed: expected `float` >= 0.0"),
        (
            "[trading]\npaper_slippage_bps = 5000\n",
            "trading.paper_slippage_bps: expected `float` <= 1000",
        ),
        (
            "[feeds.replay]\nfrom_ms = 1700000000000\nto_ms = 1600000000000\n",
            "feeds.replay: from_ms must be before to_ms",
        ),
        ("[state]\nshared = false\n", "state.shared = false needs hooks.run_agents = false"),
        # Each used to pass `config check` and then crash `run`, spin, or stall every feed.
        ("[state]\nmax_candles = 0\n", "state.max_candles: expected `int` >= 1 (found 0)"),
        ("[state]\nmax_candles = 10000000\n", "state.max_candles: expected `int` <= 100000"),
        ("[daemon]\nstatus_interval_seconds = 0\n", "daemon.status_interval_seconds: expected"),
        ("[daemon]\nstall_seconds = -1\n", "daemon.stall_seconds: expected `float` > 0.0"),
        ("[feeds.candles]\npoll_seconds = -5\n", "feeds.candles.poll_seconds: expected"),
        ("[feeds.candles]\nmax_backfill = -1\n", "feeds.candles.max_backfill: expected"),
        ("[feeds.candles]\nrequest_timeout_seconds = 0\n", "request_timeout_seconds: expected"),
        ("[rag.exchange]\nmax_oi_age_hours = 0\n", "rag.exchange.max_oi_age_hours: expected"),
        ("[rag.embedding]\ncache_ttl_seconds = -1\n", "cache_ttl_seconds: expected `float` >= 0"),
        # an infinite hook budget would let a looping hook hold its agent for good
        ("[hooks.sandbox]\ntimeout_ms = inf\n", "hooks.sandbox.timeout_ms: expected `float` <="),
        ("[hooks.sandbox]\ntimeout_ms = nan\n", "hooks.sandbox.timeout_ms: expected `float` >"),
        ("[hooks.sandbox]\ncompile_timeout_ms = inf\n", "compile_timeout_ms: expected `float` <="),
        ("[hooks.sandbox]\nstartup_timeout_ms = 0\n", "startup_timeout_ms: expected `float` >"),
        (
            "[state]\nshared = false\n[hooks]\nrun_agents = false\n[mcp]\nenabled = true\n",
            "state.shared = false needs mcp.enabled = false",
        ),
    ],
)
def test_errors_name_the_key_and_what_was_found(text: str, expected: str) -> None:
    """One line says where, what was expected and what was found."""
    with pytest.raises(ConfigError) as info:
        config.parse(text, "x.toml")
    assert str(info.value).startswith("x.toml: ")
    assert expected in str(info.value)


def test_env_substitution_and_missing_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """${VAR} comes from the environment; a missing one names the key."""
    monkeypatch.setenv("MW_TEST_URL", "ws://127.0.0.1:1")
    cfg = config.parse('[feeds.coinbase_ws]\nurl = "${MW_TEST_URL}"\n')
    assert cfg.feeds.coinbase_ws.url == "ws://127.0.0.1:1"
    monkeypatch.delenv("MW_TEST_URL")
    with pytest.raises(ConfigError, match=r"^c\.toml: feeds\.coinbase_ws\.url: environment var"):
        config.parse('[feeds.coinbase_ws]\nurl = "${MW_TEST_URL}"\n', "c.toml")


def test_secret_never_prints() -> None:
    """Secret values hide in repr/str and reveal only on request."""
    s = config.Secret("hunter2")
    assert "hunter2" not in repr(s) and "hunter2" not in str(s) and "hunter2" not in f"{s}"
    assert s.reveal() == "hunter2"


@pytest.mark.parametrize("value", ["31337", "[31337]", "-inf", "{ a = 31337 }"])
def test_a_secret_that_is_no_string_names_the_key_not_the_value(value: str) -> None:
    """A number, list or table where a secret goes is a config error at its key, and the
    value is not echoed (it raised NotImplementedError out of config check)."""
    for section, key in (("mcp", "token"), ("tools.sentiment", "search_api_key")):
        with pytest.raises(
            ConfigError, match=rf"^c\.toml: {section}\.{key}: expected `str`"
        ) as err:
            config.parse(f"[{section}]\n{key} = {value}\n", "c.toml")
        assert "31337" not in str(err.value)


def test_an_agent_secret_that_is_no_string_is_a_config_error(tmp_path: Path) -> None:
    toml = tmp_path / "agent.toml"
    toml.write_text('[wake.runner]\nkind = "llm"\napi_key = 31337\n')
    with pytest.raises(ConfigError, match=r"wake\.runner\.api_key: expected `str`") as err:
        load_agent_config(toml)
    assert "31337" not in str(err.value)


def test_an_unknown_key_in_a_table_of_sections_names_the_known_ones() -> None:
    """leaders.<name>, hooks.<name>: a typo is matched against that section's keys (the
    list was empty: "known keys: ")."""
    with pytest.raises(ConfigError, match=r"unknown key 'leader' \(known keys: id, passp"):
        config.parse("[feeds.tradingview.hooks.tv1]\nleader = 'tv1'\n")
    with pytest.raises(ConfigError, match=r"unknown key 'secrt' \(did you mean 'secret'\?\)"):
        config.parse("[feeds.copytrade_webhook.leaders.alice]\nsecret = 'x'\nsecrt = 'y'\n")


def test_missing_file(tmp_path: Path) -> None:
    """A missing file is a ConfigError naming the path."""
    with pytest.raises(ConfigError, match="config file not found"):
        config.load(tmp_path / "nope.toml")


def test_only_a_regular_file_of_sane_size_is_read(tmp_path: Path) -> None:
    """A FIFO, a directory or a huge file named as the config is an error at once (a
    FIFO would block the start forever); a symbolic link to a config is fine."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.toml"
    huge.write_bytes(b"#" * (config.MAX_CONFIG_BYTES + 1))
    for path, why in [(fifo, "not a regular file"), (tmp_path, "a directory"),
                      (huge, "larger than"), (Path("/dev/zero"), "not a regular file")]:  # fmt: skip
        with pytest.raises(ConfigError, match=why):
            config.load(path)
    link = tmp_path / "link.toml"
    link.symlink_to(ROOT / "config.toml")
    assert config.load(link) == config.load(ROOT / "config.toml")
