"""structlog set-up: JSON lines in production, readable console lines on a TTY (README, *Operations*)."""

from __future__ import annotations

import logging
import sys
from typing import IO, Any, TextIO, cast

import structlog


class LinesOrNothing:
    """The stream log lines go to (stderr), whose failures drop the line. The reader of a pipe can go
    away (a log shipper restarted, ``| head``): every later write then raises BrokenPipeError, which
    raised out of whatever was logging. In the supervisor of --workers that ended its restart and
    readiness loops, and it went on answering /healthz 200 while supervising nothing."""

    def __init__(self, stream: IO[Any]) -> None:
        self._stream = stream  # text (the log lines) or bytes (the workers' lines, tc_server/supervisor.py)

    def write(self, data: Any) -> int:
        try:
            return self._stream.write(data)
        except (OSError, ValueError):  # ValueError: the stream was closed
            return 0

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            pass


def resolved_format(fmt: str) -> str:
    """``json`` or ``console``: what ``auto`` means here (console when stderr is a TTY)."""
    return "console" if fmt == "console" or (fmt == "auto" and sys.stderr.isatty()) else "json"


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """``fmt``: ``json``, ``console`` or ``auto`` (console when stderr is a TTY)."""
    use_console = resolved_format(fmt) == "console"
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        # What PrintLogger uses of a file is write() and flush().
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, LinesOrNothing(sys.stderr))),
        cache_logger_on_first_use=True,
    )
