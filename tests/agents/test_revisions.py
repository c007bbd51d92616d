"""The revision store: a kept source comes back only as the revision it is named for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from daemon.agents.revisions import RevisionStore
from daemon.errors import ConfigError
from hooks_runtime.hookfile import revision_of

SOURCE = "def evaluate(event, state):\n    return {'decision': 'IGNORE', 'reason': 'x'}\n"


def test_a_kept_revision_comes_back_by_a_prefix(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path / "revisions")
    rev = revision_of(SOURCE.encode())
    store.put(rev, SOURCE)
    assert store.get(rev[:6]) == (rev, SOURCE)


def test_a_damaged_or_edited_revision_is_refused_saying_so(tmp_path: Path) -> None:
    """`backtest --revision` must run the code the audit names or refuse: bytes that
    are not UTF-8 ended the command with a traceback, an edited file ran other code
    under the old name, and a FIFO under a revision's name blocked it for good."""
    store = RevisionStore(tmp_path / "revisions")
    rev = revision_of(SOURCE.encode())
    path = store.put(rev, SOURCE)
    path.write_bytes(b"\xff\xfe" + SOURCE.encode())
    with pytest.raises(ConfigError, match=f"revision {rev}: cannot read .*utf-8"):
        store.get(rev)
    path.write_text(SOURCE + "# edited\n")
    with pytest.raises(ConfigError, match=r"no longer holds that revision .*damaged or edited"):
        store.get(rev)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ConfigError, match="not a regular file"):
        store.get(rev)
    path.unlink()
    path.mkdir()
    with pytest.raises(ConfigError, match="not a regular file"):
        store.get(rev)
