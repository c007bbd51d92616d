"""Every hook revision's source, kept content-addressed in the state dir.

The audit names the revision each decision came from (a hash of the file);
keeping the source under that hash the first time a revision is seen lets
``marketwake backtest --revision HOOK=HASH`` run an old revision again, long
after the file was edited. ``<state_dir>/revisions/<hash>.py``, written once
(atomically) and never changed: the name is the content's hash.
"""

from __future__ import annotations

import re
from pathlib import Path

from daemon.atomicfile import write_atomic
from daemon.errors import ConfigError, StoreError
from daemon.inputfile import read_input
from hooks_runtime.hookfile import revision_of

_HASH = re.compile(r"^[0-9a-f]{6,64}$")
MAX_REVISION_BYTES = 4 * 1024 * 1024  # a hook's source is at most 256 KiB by default


class RevisionStore:
    """Hook sources by revision hash."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def put(self, revision: str, source: str) -> Path:
        """Keep ``source`` as ``revision`` (a no-op when it is already kept)."""
        path = self.directory / f"{revision}.py"
        if path.exists():
            return path
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomic(path, source.encode())
        except OSError as exc:
            raise StoreError(f"{path}: cannot keep the hook revision: {exc}") from None
        return path

    def get(self, revision: str) -> tuple[str, str]:
        """(full hash, source) of a kept revision, named by its hash or a unique prefix
        of at least 6 characters."""
        if not _HASH.match(revision):
            raise ConfigError(f"revision {revision!r}: expected a hex hash (6+ characters)")
        found = sorted(self.directory.glob(f"{revision}*.py")) if self.directory.is_dir() else []
        if not found:
            raise ConfigError(f"revision {revision!r} is not kept in {self.directory}")
        if len(found) > 1:
            names = ", ".join(p.stem for p in found[:5])
            raise ConfigError(f"revision {revision!r} is ambiguous: {names}")
        path = found[0]
        try:  # (a FIFO is an error, never a wait; a huge file is not read whole)
            data = read_input(path, MAX_REVISION_BYTES)
            source = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"revision {path.stem}: cannot read {path}: {exc}") from None
        if revision_of(data) != path.stem:  # written once, never changed: damaged
            raise ConfigError(
                f"revision {path.stem}: {path} no longer holds that revision (its content"
                f" hashes to {revision_of(data)}): damaged or edited"
            )
        return path.stem, source
