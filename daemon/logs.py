"""structlog setup: readable on a terminal, one JSON object per line elsewhere.

journald stores stdout lines as they are, so JSON there keeps every field
queryable; a terminal gets aligned, coloured key=value lines. Values of keys
that look secret are replaced before rendering, whatever the caller passed.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import structlog
from structlog.typing import EventDict, WrappedLogger

_SECRET_KEY = re.compile(r"(secret|token|password|api_key|apikey|authorization)", re.IGNORECASE)
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def redact_secrets(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Replace values of secret-looking keys with ``***``."""
    for key in event_dict:
        if _SECRET_KEY.search(key):
            event_dict[key] = "***"
    return event_dict


def configure(fmt: str = "auto", level: str = "info", stream: Any = None) -> None:
    """Configure structlog once, from the CLI entry point."""
    out = stream if stream is not None else sys.stderr
    if fmt == "auto":
        fmt = "console" if out.isatty() else "json"
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=out.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.ERROR)),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


class Outage:
    """A failure that repeats until something outside is fixed (a full disk): logged
    once when it starts and once when it ends, not on every retry. ``error`` is the
    current one ("" while things work), for ``status``."""

    def __init__(
        self, logger: Any, failing: str, working: str | None = None, level: str = "error"
    ) -> None:
        self._log = logger
        self._failing = failing
        self._working = working
        self._level = level
        self.error = ""

    def failed(self, error: str, **fields: Any) -> None:
        """Another failure: logged if it is the first since things worked."""
        if not self.error:
            getattr(self._log, self._level)(self._failing, error=error, **fields)
        self.error = error

    def worked(self, **fields: Any) -> None:
        """It worked: after failures, say so once."""
        if self.error and self._working is not None:
            self._log.info(self._working, **fields)
        self.error = ""
