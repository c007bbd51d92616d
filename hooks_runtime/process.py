"""The parent's handle on one worker process: spawn, handshake, framed I/O, kill.

The worker is started with ``close_fds``, ``start_new_session`` (so one killpg
takes any stray children too), a minimal environment and an empty 0500 working
directory that is removed as soon as the worker is up. ``-S`` keeps
site-packages off ``sys.path``; the entries the worker needs (this project,
RestrictedPython, msgspec and the optional layer packages) are passed in argv.
"""

from __future__ import annotations

import asyncio
import collections
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import anyio
import anyio.lowlevel
import msgspec

from daemon.errors import HookCrashed, SandboxUnavailable
from hooks_runtime.config import SandboxConfig
from hooks_runtime.protocol import (
    Fatal,
    FrameEncoder,
    FrameReader,
    FromWorker,
    Ready,
    Result,
    Setup,
    decode_from_worker,
    result_frame_cap,
)
from hooks_runtime.series import Held, Windows
from hooks_runtime.worker import BOOT

F_SETPIPE_SZ = 1031
_SPIN_SLICE = 25e-6  # longest stretch the result poll holds the event loop
WORKER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def _module_root(name: str) -> str | None:
    try:
        mod = __import__(name)
    except ImportError:
        return None
    file = getattr(mod, "__file__", None)
    if file is None:
        return None
    path = Path(file)
    return str(path.parent.parent if path.name == "__init__.py" else path.parent)


def worker_sys_path() -> list[str]:
    """sys.path entries a ``-I -S`` worker needs, in order, without duplicates."""
    names = ["hooks_runtime", "RestrictedPython", "msgspec", "landlock", "pyseccomp"]
    roots = [r for r in (_module_root(n) for n in names) if r]
    return list(dict.fromkeys(roots))


def worker_command(bell_fd: int) -> list[str]:
    """The exact argv of a worker whose doorbell pipe is ``bell_fd``."""
    flags = ["-I", "-S", "-B", "-X", "int_max_str_digits=4300"]
    return [sys.executable, *flags, "-c", BOOT, str(bell_fd), *worker_sys_path()]


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def wait_readable(fd: int, seconds: float) -> None:
    """Return when ``fd`` is readable or ``seconds`` passed.

    On asyncio this talks to the loop directly (a reader callback and a timer
    on one future): it is the hot path of every evaluation, and a cancel scope
    plus anyio's generic wait cost more than the worker's whole evaluation.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # another anyio backend (trio)
        with anyio.move_on_after(seconds):
            await anyio.wait_readable(fd)
        return
    fut: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, _wake, fut)
    timer = loop.call_later(seconds, _wake, fut)
    try:
        await fut
    finally:
        loop.remove_reader(fd)
        timer.cancel()


def _popen(cwd: str, bell_w: int) -> subprocess.Popen[bytes]:
    """Spawn a worker with a minimal environment in an empty directory."""
    return subprocess.Popen(
        worker_command(bell_w),
        pass_fds=(bell_w,),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,
        env=WORKER_ENV,
        cwd=cwd,
    )


class WorkerProcess:
    """One live worker; at most one request in flight (the pool holds a lock)."""

    def __init__(self, proc: subprocess.Popen[bytes], bell: int, cfg: SandboxConfig) -> None:
        self.proc = proc
        self._bell = bell
        self.pid = proc.pid
        self.cfg = cfg
        assert proc.stdin is not None and proc.stdout is not None
        self._w = proc.stdin.fileno()
        self._r = proc.stdout.fileno()
        os.set_blocking(self._w, False)
        os.set_blocking(self._r, False)
        os.set_blocking(self._bell, False)
        try:  # room for a whole batch of results, so the worker never waits on us
            fcntl.fcntl(self._r, F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
        self._reader = FrameReader(result_frame_cap(cfg))
        self._pending: collections.deque[FromWorker] = collections.deque()
        self.encoder = FrameEncoder()
        self.ready: Ready | None = None
        self.known: dict[str, str] = {}  # hook_id -> revision compiled in this worker
        self.evaluations = 0
        self.batches = 0
        # The first state of the last batch sent: one the worker still holds frozen.
        self.sent_state: msgspec.Raw | None = None
        # ... and its candle windows, when they went apart (as deltas, see
        # :mod:`hooks_runtime.series`): None when that state went whole.
        self.sent_windows: Windows | None = None
        self.sent_size = 0  # that state's bytes, encoded whole
        # The candle windows the worker holds from its last batch with deltas.
        self.series: Held = {}
        self.poisoned = False  # a MemoryError happened: replace after this batch
        self.spin_missed = False  # the last batch's poll ran out before the doorbell
        self.alive = True

    @classmethod
    async def start(cls, cfg: SandboxConfig) -> WorkerProcess:
        """Spawn, send the setup frame and wait for READY (or raise)."""
        cwd = tempfile.mkdtemp(prefix="mw-hook-")
        os.chmod(cwd, 0o500)
        bell_r, bell_w = os.pipe()
        try:
            try:
                # Not in a thread: PR_SET_PDEATHSIG fires when the *thread* that
                # forked the worker exits, so spawn from the long-lived loop thread.
                proc = _popen(cwd, bell_w)  # vfork+exec: about 1 ms
            except BaseException:
                os.close(bell_r)
                raise
            finally:
                os.close(bell_w)
            worker = cls(proc, bell_r, cfg)
            try:
                await worker._handshake()
            except BaseException:
                worker.kill()
                worker.proc.wait()  # SIGKILLed: returns at once
                raise
        finally:
            shutil.rmtree(cwd, ignore_errors=True)
        return worker

    async def _handshake(self) -> None:
        await self.send(self.encoder.encode(Setup(self.cfg)))
        deadline = time.monotonic() + self.cfg.startup_timeout_ms / 1000
        try:
            frame = await self.recv(deadline)
        except HookCrashed as exc:
            raise SandboxUnavailable(f"hook worker failed to start: {exc}") from None
        if isinstance(frame, Fatal):
            raise SandboxUnavailable(f"hook worker refused setup: {frame.message}")
        if not isinstance(frame, Ready):
            raise SandboxUnavailable("hook worker did not report READY in time")
        self.ready = frame
        need = [n for n in self.cfg.require_layers if n not in frame.active]
        if need:
            why = "; ".join(f"{n}: {frame.missing.get(n, 'not reported')}" for n in need)
            raise SandboxUnavailable(f"required sandbox layer(s) not active: {why}")

    async def send(self, data: bytes, seconds: float = 10.0) -> None:
        """Write a whole frame; a worker that stops reading for ``seconds`` is dead."""
        view = memoryview(data)
        deadline = time.monotonic() + seconds
        while view:
            try:
                view = view[os.write(self._w, view) :]
            except BlockingIOError:
                with anyio.move_on_after(deadline - time.monotonic()) as scope:
                    await anyio.wait_writable(self._w)
                if scope.cancelled_caught:
                    raise HookCrashed("worker stopped reading its requests") from None
            except OSError as exc:
                raise HookCrashed(f"worker pipe closed: {exc.strerror}") from None

    async def recv(self, deadline: float) -> FromWorker | None:
        """The next frame, or None when ``deadline`` (monotonic) passes first."""
        while not self._pending:
            try:
                data = os.read(self._r, 1 << 16)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                await wait_readable(self._r, left)
                continue
            if not data:
                raise HookCrashed(f"worker exited ({self._exit_reason()})")
            for body in self._reader.feed(data):
                self._pending.append(decode_from_worker(body))
        return self._pending.popleft()

    async def collect(
        self,
        batch_id: int,
        budgets: list[float],
        sent_at: float,
        spin: float = 0.0,
        alone: Callable[[], bool] = lambda: False,
        on_result: Callable[[Result], object] | None = None,
        runtime_limit: float = float("inf"),
    ) -> tuple[list[Result], Literal["timeout", "crashed"] | None, str, float]:
        """Results of a batch of ``len(budgets)`` hooks, each held to its own budget
        (seconds, counted from the previous hook's finish), each handed to
        ``on_result`` as soon as it is read.

        With ``spin`` > 0 it first polls the result pipe that long, yielding to the
        loop every few microseconds, while ``alone()`` says no other batch is in
        flight (waking up costs more): the caller checks each result while the
        worker runs the next hook, and only the last one's check is left when the
        batch ends. Past the spin it sleeps on the doorbell, rung once per batch.

        ``runtime_limit``: the longest evaluation (seconds, as the worker measured it,
        its compile apart): a fresh worker's first hook also has the compile budget,
        which must not lengthen its evaluation.

        Returns (results so far, failure kind or None, message, the culprit's time in
        seconds: the budget it broke). On a failure the hook at ``len(results)`` is
        the culprit and the worker must be killed.
        """
        results: list[Result] = []

        def overran(budget: float) -> tuple[list[Result], Literal["timeout"], str, float]:
            return results, "timeout", f"exceeded its {budget * 1000:.0f} ms budget", budget

        start = sent_at
        rung = False  # this batch's doorbell byte has been read
        spin_end = time.monotonic() + spin if spin > 0 else 0.0
        slice_end = 0.0
        while True:
            try:
                got = self._drain_results(batch_id, len(results), len(budgets))
            except HookCrashed as exc:
                return results, "crashed", str(exc), budgets[len(results)]
            now = time.monotonic()
            for r in got:  # a lying worker can only move each start between prev and now
                done = min(max(r.done_at, start), now)
                # Held to its budget however late this task looks: asleep on an earlier
                # deadline (a fresh worker's compile budget, a speculative request whose
                # caller is busy), it would find results that overran theirs already in.
                if done - start > budgets[len(results)]:
                    return overran(budgets[len(results)])
                if r.runtime_us > runtime_limit * 1e6:
                    return overran(runtime_limit)
                start = done
                results.append(r)
                if on_result is not None:
                    on_result(r)
            if len(results) >= len(budgets):
                if not rung:  # (a ring still to come is read with a later batch)
                    self._drain_bell()
                return results, None, "", 0.0
            deadline = start + budgets[len(results)]
            if now >= deadline:
                return overran(budgets[len(results)])
            if spin_end:
                if now < spin_end and alone():
                    if now >= slice_end:  # tight polls for one slice, then let others run
                        if slice_end:
                            await anyio.lowlevel.checkpoint()
                        slice_end = time.monotonic() + _SPIN_SLICE
                    continue
                self.spin_missed = True
                spin_end = 0.0
            await wait_readable(self._bell, deadline - now)
            rung = self._drain_bell()

    def _drain_results(self, batch_id: int, have: int, want: int) -> list[Result]:
        """Results now readable, stopping once ``want`` are in (no read that would
        only find the pipe empty)."""
        got: list[Result] = []
        while have + len(got) < want:
            try:
                data = os.read(self._r, 1 << 20)
            except BlockingIOError:
                return got
            if not data:
                raise HookCrashed(f"worker exited ({self._exit_reason()})")
            for body in self._reader.feed(data):
                frame = decode_from_worker(body)
                if not isinstance(frame, Result):
                    raise HookCrashed(f"worker sent an unexpected {type(frame).__name__} frame")
                if frame.id != batch_id or frame.index != have + len(got):
                    raise HookCrashed("worker answered out of order")
                got.append(frame)
        return got

    def _drain_bell(self) -> bool:
        """Read what the doorbell holds; True if it had rung (or closed)."""
        try:
            os.read(self._bell, 4096)
        except BlockingIOError:
            return False
        return True

    def _exit_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=0.02)  # it is exiting: usually immediate
        except subprocess.TimeoutExpired:
            return "pipe closed"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"

    def kill(self) -> None:
        """SIGKILL the worker's whole process group; the pool reaps it."""
        if not self.alive:
            return
        self.alive = False
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()
        os.close(self._bell)

    def usage(self) -> tuple[int, float]:
        """(RSS bytes, CPU seconds) from /proc, or zeros if unreadable."""
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            ticks = os.sysconf("SC_CLK_TCK")
            cpu = (int(fields[11]) + int(fields[12])) / ticks
            rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
            return rss, cpu
        except (OSError, IndexError, ValueError):
            return 0, 0.0
