"""Directories a command owns and replaces at every run (a backtest's ``--out``, the
demo's ``--dir``).

Such a command deletes what it finds there, so it works only in a directory
that is new, empty, or its own: marked by an earlier run, or laid out exactly
as a run of a version before the marker leaves it. Anything else (the project
root, a live daemon's state dir) is refused with a :exc:`ConfigError` and left
untouched.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from daemon.errors import ConfigError
from daemon.statedir import StateDirLock


class Scratch(msgspec.Struct, frozen=True, kw_only=True):
    """What marks a command's directory, and how an unmarked one of its own looks."""

    option: str  # the command's option naming the directory, for messages
    replaced: tuple[str, ...]  # the entries each run deletes and makes again
    marker: str  # the file a run leaves in it: locked while it runs, with its pid
    # An unmarked directory is the command's own (an older version's run) when it
    # holds ``required`` and nothing but ``known`` names.
    required: str
    known: frozenset[str]

    def check(self, directory: Path) -> None:
        """ConfigError unless a run may replace what is in ``directory``."""
        try:
            entries = os.listdir(directory)
        except FileNotFoundError:
            return
        except NotADirectoryError:
            raise ConfigError(f"{self.option} {directory} is not a directory") from None
        except OSError as exc:
            raise ConfigError(
                f"{self.option} {directory}: cannot read it: {exc.strerror}"
            ) from None
        if not entries or self.marker in entries:
            return
        if self.required in entries and self.known.issuperset(entries):
            return
        shown = ", ".join(sorted(entries)[:4]) + (", ..." if len(entries) > 4 else "")
        raise ConfigError(
            f"{self.option} {directory} already holds files this command did not write "
            f"({shown}), which a run would replace: name a new or empty directory"
        )

    def refuse_inside(self, directory: Path, inputs: list[tuple[str, Path]]) -> None:
        """ConfigError if an input (option, path) lies in what a run in ``directory``
        replaces: the run would delete it before reading it."""
        out = directory.resolve()
        gone = [out / sub for sub in self.replaced]
        for option, path in inputs:
            path = path.resolve()
            if any(path == g or g in path.parents for g in gone):
                subs = " and ".join(f"{sub}/" for sub in self.replaced)
                raise ConfigError(
                    f"{option} {path} is inside {self.option} {directory}, whose {subs} "
                    "each run replaces: copy it elsewhere first"
                )

    @contextmanager
    def claim(self, directory: Path) -> Iterator[None]:
        """While open: ``directory`` checked, created if need be, marked as the
        command's and locked (a second run on it is refused: it would replace the
        files this one is writing; StateDirInUse names the holder)."""
        self.check(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"{self.option} {directory}: cannot write there: {exc.strerror}"
            ) from None
        with StateDirLock(directory, self.marker, f"{self.option} {directory}"):
            yield
