"""A command's own directory: new, empty, marked, or an older run's layout; never
anything else; one run at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.errors import ConfigError, StateDirInUse
from daemon.scratchdir import Scratch

OWN = Scratch(
    option="--out",
    replaced=("state",),
    marker=".mine",
    required="report.json",
    known=frozenset({"state", "report.json"}),
)


def test_new_empty_marked_and_an_older_runs_layout_are_the_commands(tmp_path: Path) -> None:
    with OWN.claim(tmp_path / "new" / "deeper"):
        pass
    assert (tmp_path / "new" / "deeper" / ".mine").is_file()
    (tmp_path / "empty").mkdir()
    with OWN.claim(tmp_path / "empty"):
        pass
    marked = tmp_path / "marked"
    with OWN.claim(marked):
        (marked / "anything").write_text("x")
    OWN.check(marked)  # the marker makes it the command's, whatever else is inside
    older = tmp_path / "older"
    (older / "state").mkdir(parents=True)
    (older / "report.json").write_text("{}")
    with OWN.claim(older):
        assert (older / ".mine").is_file()


def test_one_run_at_a_time(tmp_path: Path) -> None:
    """A second run on a directory in use is refused before it touches anything (it
    would replace the files the first one is writing)."""
    with (
        OWN.claim(tmp_path),
        pytest.raises(StateDirInUse, match=r"--out .* is in use by pid \d+"),
        OWN.claim(tmp_path),
    ):
        pass
    with OWN.claim(tmp_path):  # free again once the first has finished
        pass


@pytest.mark.parametrize(
    "entries",
    [["state"], ["state", "report.json", "README.md"], ["notes.txt"]],
)
def test_anything_else_is_refused_and_left_alone(tmp_path: Path, entries: list[str]) -> None:
    for name in entries:
        (tmp_path / name).write_text("keep")
    with pytest.raises(ConfigError, match="did not write") as err, OWN.claim(tmp_path):
        pass
    assert entries[0] in str(err.value) and "--out" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(entries)
    assert all((tmp_path / name).read_text() == "keep" for name in entries)


def test_a_file_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        OWN.check(tmp_path / "f")


def test_an_input_inside_what_a_run_replaces_is_refused(tmp_path: Path) -> None:
    inside = tmp_path / "state" / "data.csv"
    with pytest.raises(ConfigError, match=r"--data .*data\.csv is inside --out .*state/"):
        OWN.refuse_inside(tmp_path, [("--agent", tmp_path / "elsewhere"), ("--data", inside)])
    OWN.refuse_inside(tmp_path, [("--data", tmp_path / "beside.csv")])  # not replaced: fine
