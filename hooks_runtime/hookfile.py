"""Hook files on disk -> :class:`HookSpec` (kind from the prefix, revision = content hash)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from daemon.errors import HookCompileError
from hooks_runtime.protocol import HookKind

KINDS: tuple[HookKind, ...] = ("wake", "autotrade", "copytrade")


class HookSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One revision of one hook, as the pool evaluates it."""

    hook_id: str
    kind: HookKind
    revision: str
    source: str


def kind_of(filename: str) -> HookKind:
    """``wake_x.py`` -> ``wake``; anything else is an error naming the valid prefixes."""
    prefix = filename.split("_", 1)[0]
    if prefix not in KINDS or not filename.endswith(".py") or "_" not in filename:
        raise HookCompileError(
            f"{filename}: hook files are named wake_*.py, autotrade_*.py or copytrade_*.py"
        )
    return prefix


def revision_of(data: bytes) -> str:
    """The content hash that names a revision."""
    return hashlib.sha256(data).hexdigest()[:16]


def spec_from_source(hook_id: str, kind: HookKind, source: str) -> HookSpec:
    """A spec for in-memory source (tests, replays)."""
    return HookSpec(
        hook_id=hook_id, kind=kind, revision=revision_of(source.encode()), source=source
    )


def load_hook(path: Path, max_bytes: int = 256 * 1024) -> HookSpec:
    """Read one hook file; unreadable, oversized or non-UTF-8 files are compile errors."""
    kind = kind_of(path.name)
    try:
        with path.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise HookCompileError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > max_bytes:
        raise HookCompileError(f"{path}: larger than {max_bytes} bytes")
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HookCompileError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return HookSpec(hook_id=path.stem, kind=kind, revision=revision_of(data), source=source)


def hook_paths(hooks_dir: Path) -> list[Path]:
    """The hook files of an agent's hooks directory, sorted (non-hook files ignored)."""
    return sorted(
        p for p in hooks_dir.glob("*.py") if p.is_file() and p.name.split("_", 1)[0] in KINDS
    )
