"""Hook files on disk -> :class:`HookSpec` (kind from the prefix, revision = content hash).

A hook file must be a regular file of its own inside the agent's ``hooks``
directory (no symlink, hard link or special file: see :mod:`hooks_runtime.safe_read`)
named ``<kind>_<name>.py`` with an ASCII name, so its id can travel anywhere.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import msgspec

from daemon.errors import HookCompileError
from hooks_runtime.protocol import HookKind
from hooks_runtime.safe_read import is_plain_dir, read_regular

KINDS: tuple[HookKind, ...] = ("wake", "autotrade", "copytrade")
HOOK_NAME = re.compile(r"^(wake|autotrade|copytrade)_[A-Za-z0-9_]{1,64}\.py$")


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
    """Read one hook file; links, special, unreadable, oversized or non-UTF-8 files are
    compile errors (whose text never shows the file's content)."""
    kind = kind_of(path.name)
    if not HOOK_NAME.match(path.name):
        raise HookCompileError(
            f"{path.name!r}: rename it to {kind}_<name>.py with letters, digits and '_' only"
        )
    data = read_regular(path, max_bytes, "a hook file")
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HookCompileError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return HookSpec(hook_id=path.stem, kind=kind, revision=revision_of(data), source=source)


def hook_paths(hooks_dir: Path) -> list[Path]:
    """The hook files of an agent's hooks directory, sorted (non-hook files ignored).

    Candidates are listed by name only (nothing is followed or opened here);
    :func:`load_hook` refuses what is not a plain file. A symlinked ``hooks``
    directory (another agent's hooks, say) yields nothing."""
    if not is_plain_dir(hooks_dir):
        return []
    return sorted(
        p for p in hooks_dir.iterdir() if p.suffix == ".py" and p.name.split("_", 1)[0] in KINDS
    )
