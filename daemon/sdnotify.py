"""systemd's notify protocol (sd_notify(3)) without the systemd package.

One datagram per notification to ``$NOTIFY_SOCKET`` (a path, or ``@name`` for
an abstract socket). Outside systemd the variable is unset and every call is a
no-op. Failures are logged and ignored, as the man page recommends.
"""

from __future__ import annotations

import os
import socket
import time

import structlog

log = structlog.get_logger("sdnotify")


class Notifier:
    """Sends READY/RELOADING/STOPPING/STATUS/WATCHDOG to systemd when present."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        addr = env.get("NOTIFY_SOCKET", "")
        if addr.startswith("@"):
            addr = "\0" + addr[1:]
        self._addr = addr if addr[:1] in ("/", "\0") else ""
        self.watchdog_interval = self._watchdog_interval(env)

    @staticmethod
    def _watchdog_interval(env: dict[str, str] | os._Environ[str]) -> float | None:
        """Half of WATCHDOG_USEC when the watchdog is meant for this process."""
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        if not usec or (pid and pid != str(os.getpid())):
            return None
        try:
            return max(int(usec) / 2e6, 0.05)
        except ValueError:
            return None

    @property
    def enabled(self) -> bool:
        """Whether a notify socket is configured."""
        return bool(self._addr)

    def notify(self, *assignments: str) -> None:
        """Send ``KEY=VALUE`` lines as one datagram."""
        if not self._addr:
            return
        payload = "\n".join(assignments).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self._addr)
                sock.send(payload)
        except OSError as exc:
            log.warning("sd_notify failed", error=str(exc))

    def ready(self, status: str = "") -> None:
        """Startup or reload finished."""
        self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def reloading(self) -> None:
        """A reload began; READY=1 must follow."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self) -> None:
        """Shutdown began."""
        self.notify("STOPPING=1")

    def status(self, text: str) -> None:
        """One line for ``systemctl status``."""
        self.notify(f"STATUS={text.splitlines()[0] if text else ''}")

    def watchdog(self) -> None:
        """Keep-alive for WatchdogSec=."""
        self.notify("WATCHDOG=1")
