"""write_atomic: the old content or the new, never a part, and no temporary left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from daemon.atomicfile import write_atomic


def test_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "marker"
    target.write_bytes(b"old")
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and os.listdir(tmp_path) == ["marker"]


def test_a_failure_keeps_the_old_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "marker"
    target.write_bytes(b"old")

    def refuse(src: str, dst: Path) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="no space"):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["marker"]


def test_a_kills_leftover_temporary_is_removed_by_the_next_write(tmp_path: Path) -> None:
    """A kill between the temporary and the rename leaves it behind (a full copy):
    the next write removes it once it is stale; a fresh one (another writer's, in
    progress) and other files stay."""
    target = tmp_path / "state_cache.json"
    stale, fresh = tmp_path / ".state_cache.json.k1ll3d", tmp_path / ".state_cache.json.n0w"
    other = tmp_path / ".other.json.k1ll3d"
    for f in (stale, fresh, other):
        f.write_bytes(b"{}")
    os.utime(stale, (1, 1))
    os.utime(other, (1, 1))
    write_atomic(target, b"new")
    assert sorted(os.listdir(tmp_path)) == sorted([target.name, fresh.name, other.name])
