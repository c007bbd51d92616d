"""A command's own directory: new, empty, marked, or an older run's layout; never
anything else."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.errors import ConfigError
from daemon.scratchdir import Scratch

OWN = Scratch(
    option="--out",
    marker=".mine",
    note="mine\n",
    required="report.json",
    known=frozenset({"state", "report.json"}),
)


def test_new_empty_marked_and_an_older_runs_layout_are_the_commands(tmp_path: Path) -> None:
    OWN.claim(tmp_path / "new" / "deeper")
    assert (tmp_path / "new" / "deeper" / ".mine").read_text() == "mine\n"
    (tmp_path / "empty").mkdir()
    OWN.claim(tmp_path / "empty")
    marked = tmp_path / "marked"
    OWN.claim(marked)
    (marked / "anything").write_text("x")
    OWN.check(marked)  # the marker makes it the command's, whatever else is inside
    older = tmp_path / "older"
    (older / "state").mkdir(parents=True)
    (older / "report.json").write_text("{}")
    OWN.claim(older)
    assert (older / ".mine").is_file()


@pytest.mark.parametrize(
    "entries",
    [["state"], ["state", "report.json", "README.md"], ["notes.txt"]],
)
def test_anything_else_is_refused_and_left_alone(tmp_path: Path, entries: list[str]) -> None:
    for name in entries:
        (tmp_path / name).write_text("keep")
    with pytest.raises(ConfigError, match="did not write") as err:
        OWN.claim(tmp_path)
    assert entries[0] in str(err.value) and "--out" in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(entries)
    assert all((tmp_path / name).read_text() == "keep" for name in entries)


def test_a_file_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        OWN.check(tmp_path / "f")
