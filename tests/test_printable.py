"""What hooks write cannot drive the operator's terminal through the CLI's text."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from daemon.cli.main import cli
from daemon.printable import visible_json, visible_lines
from feeds.synthetic import generate_candles

EVIL = "\x1b[2J\x1b]0;pwned\x07boom\r\nagent other: all fine\u202e"
RAISES = f"""
def evaluate(event, state):
    raise ValueError({EVIL!r})
"""


def test_visible_lines_keeps_layout_and_shows_the_rest() -> None:
    assert visible_lines("a\tb\nc ü") == "a\tb\nc ü"
    assert visible_lines("x\x1b[31m\r\ny") == "x\\x1b[31m\\r\ny"


def test_visible_json_is_the_same_json_and_prints_nothing_raw() -> None:
    doc = json.dumps({"e": EVIL + "\x85\U000e0001 ü", "n": [1.5]}, ensure_ascii=False, indent=2)
    shown = visible_json(doc)
    assert json.loads(shown) == json.loads(doc)
    assert not any(ch in shown for ch in "\x1b\x07\r\x85\u202e\U000e0001")
    assert "ü" in shown and shown.count("\n") == doc.count("\n")
    assert visible_json('{"a": "plain"}') == '{"a": "plain"}'


def test_a_hooks_error_text_is_shown_not_obeyed(tmp_path: Path) -> None:
    hooks = tmp_path / "agents" / "evil" / "hooks"
    hooks.mkdir(parents=True)
    (hooks.parent / "agent.toml").write_text("")
    (hooks / "wake_boom.py").write_text(RAISES)
    data = tmp_path / "c.csv"
    generate_candles(data, seed=1, n=30, timeframe="5m")
    out = tmp_path / "out"
    state = ["--state-dir", str(out / "state")]
    runner = CliRunner()  # color=True below: click would strip colour codes, not the rest
    args = ["backtest", "--agent", str(hooks.parent), "--data", str(data), "--out", str(out)]
    runs = {
        "backtest": runner.invoke(cli, args, color=True),
        "status": runner.invoke(cli, ["status", *state], color=True),
        "paused": runner.invoke(cli, ["hooks", "paused", *state], color=True),
        "json": runner.invoke(cli, ["status", "--json", *state], color=True),
    }
    for name, res in runs.items():
        assert res.exit_code == 0, (name, res.output)
        assert not any(ch in res.output for ch in "\x1b\x07\r\u202e"), (name, res.output)
        assert not any(line.startswith("agent other") for line in res.output.splitlines()), (
            name,
            res.output,
        )
    for name in ("backtest", "status", "paused"):
        assert "\\x1b[2J\\x1b]0;pwned\\x07boom\\r\\nagent other" in runs[name].output, name
    health = json.loads(runs["json"].output)["components"]["hooks"]["agents"]["evil"]["hook_health"]
    assert EVIL in health["wake_boom"]["last_error"]
