"""Process-level layers a worker applies to itself at startup (Linux, no root needed).

Order matters (research/sandbox.md §2.1): everything is imported first, then
fds are isolated, then rlimits, then the prctl flags, then Landlock, then
seccomp. Each function returns normally when its layer is active and raises
``OSError``/``RuntimeError`` with a reason otherwise; the worker reports both
in its READY frame and the parent decides what is required.
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import os
import resource
import sys
from typing import Any

from hooks_runtime.config import SandboxConfig

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
CLONE_THREAD = 0x00010000

#: Syscalls that fail with EPERM once seccomp is on (research §2.2).
DENIED_SYSCALLS = [
    "socket",
    "socketpair",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    "execve",
    "execveat",
    "fork",
    "vfork",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "unshare",
    "setns",
    "pivot_root",
    "chroot",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "userfaultfd",
    "perf_event_open",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "personality",
]


class _Discard:
    """sys.stdout/sys.stderr of a worker: nothing reaches any fd."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def isolate_fds(bell_fd: int) -> tuple[int, int, int]:
    """Move the IPC pipes off fds 0/1, point 0/1/2 at /dev/null, close everything else.

    Returns (requests in, results out, doorbell out).
    """
    ipc_in, ipc_out, bell = os.dup(0), os.dup(1), os.dup(bell_fd)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    keep = {0, 1, 2, ipc_in, ipc_out, bell}
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass  # the listdir handle itself
    sys.stdout = sys.stderr = _Discard()
    sys.stdin = None
    return ipc_in, ipc_out, bell


def open_fds() -> list[int]:
    """The fds this process holds (read before Landlock hides /proc)."""
    return sorted(int(n) for n in os.listdir("/proc/self/fd"))


def apply_rlimits(cfg: SandboxConfig) -> None:
    """Address space, lifetime CPU, files, processes, file size and core dumps."""
    mb = cfg.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mb, mb))
    resource.setrlimit(resource.RLIMIT_CPU, (cfg.cpu_seconds, cfg.cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg.max_open_files, cfg.max_open_files))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def set_no_new_privs() -> None:
    """No setuid/file-capability gains; required before unprivileged seccomp/Landlock."""
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def set_not_dumpable() -> None:
    """Blocks ptrace and /proc/<pid>/mem access from other same-uid workers."""
    _prctl(PR_SET_DUMPABLE, 0)


def set_parent_death_signal(parent_pid: int) -> None:
    """Die with the daemon; exits now if the daemon already died."""
    _prctl(PR_SET_PDEATHSIG, 9)
    if os.getppid() != parent_pid:
        os._exit(0)


def apply_landlock() -> None:
    """Deny every filesystem access except reading the standard library.

    The project and site-packages are not readable: everything the worker needs
    from them is imported before this point.
    """
    import landlock  # optional dependency, imported by harden() already

    ruleset = landlock.Ruleset()
    read = landlock.FSAccess.READ_FILE | landlock.FSAccess.READ_DIR
    ruleset.allow(os.path.dirname(os.__file__), rules=read)
    ruleset.apply()


def apply_seccomp() -> None:
    """EPERM for sockets, exec, fork (threads still allowed), ptrace, kill of others, ..."""
    import pyseccomp as sc  # optional dependency, imported by harden() already

    f = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        _add_rule(f, deny, name)
    _add_rule(f, deny, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    _add_rule(f, sc.ERRNO(errno.ENOSYS), "clone3")
    pid = os.getpid()
    _add_rule(f, deny, "kill", sc.Arg(0, sc.NE, pid))
    _add_rule(f, deny, "tkill", sc.Arg(0, sc.NE, pid))
    _add_rule(f, deny, "tgkill", sc.Arg(0, sc.NE, pid))
    f.load()


def _add_rule(f: Any, action: int, name: str, *args: Any) -> None:
    try:
        f.add_rule(action, name, *args)
    except (OSError, ValueError, RuntimeError):
        if name not in {"fork", "vfork", "socketpair"}:  # absent on some architectures
            raise


def harden(cfg: SandboxConfig, parent_pid: int) -> tuple[list[str], dict[str, str]]:
    """Apply every layer after fds; return (active, missing-with-reason)."""
    for module in ("landlock", "pyseccomp"):  # before landlock closes site-packages
        try:
            importlib.import_module(module)
        except ImportError:  # reported as a missing layer below
            pass
    active: list[str] = []
    missing: dict[str, str] = {}
    steps: list[tuple[str, Any]] = [
        ("rlimits", lambda: apply_rlimits(cfg)),
        ("no_new_privs", set_no_new_privs),
        ("no_dumpable", set_not_dumpable),
        ("pdeathsig", lambda: set_parent_death_signal(parent_pid)),
    ]
    if cfg.landlock:
        steps.append(("landlock", apply_landlock))
    if cfg.seccomp:
        steps.append(("seccomp", apply_seccomp))
    for name, step in steps:
        try:
            step()
            active.append(name)
        except Exception as exc:  # noqa: BLE001 - any failure means "layer missing"
            missing[name] = f"{type(exc).__name__}: {exc}"[:300]
    if not cfg.landlock:
        missing["landlock"] = "disabled by config"
    if not cfg.seccomp:
        missing["seccomp"] = "disabled by config"
    return active, missing
