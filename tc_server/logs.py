"""structlog set-up: JSON lines in production, readable console lines on a TTY (README, *Operations*);
and the limiter of repeated warnings every module logs through."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
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


class _StdlibLines(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler configure_logging puts on the root logger (told from others, so it is there once)."""


class _NamedLines(structlog.PrintLogger):
    """A PrintLogger that keeps the name its module asked for (``structlog.get_logger("tc_server.delivery")``),
    so that every line says which part of tc-server wrote it, as the libraries' lines do (``logger``)."""

    def __init__(self, file: TextIO, name: str) -> None:
        super().__init__(file)
        self.name = name


def _add_module_name(logger: Any, method_name: str, event_dict: Any) -> Any:
    event_dict.setdefault("logger", getattr(logger, "name", "tc_server"))
    return event_dict


class _CurrentStderr:
    """``sys.stderr`` as it is when a line is written, not when logging was configured: a command run inside
    another program (the tests call ``tc-server export`` in-process) writes where that program's stderr is
    now."""

    def write(self, data: str) -> int:
        return sys.stderr.write(data)

    def flush(self) -> None:
        sys.stderr.flush()


_STDERR = cast(IO[Any], _CurrentStderr())


def configure_logging(fmt: str = "auto", level: str = "info", cache: bool = True) -> None:
    """``fmt``: ``json``, ``console`` or ``auto`` (console when stderr is a TTY). ``cache``: each module's
    logger is built once, on its first line (the server's choice: a line costs less); False leaves a later
    ``structlog.configure`` (the tests') in force for every logger."""
    use_console = resolved_format(fmt) == "console"
    lines = cast(TextIO, LinesOrNothing(_STDERR))
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    processors = _held_processors([
        structlog.contextvars.merge_contextvars,
        _add_module_name,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        renderer,
    ])
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        # What PrintLogger uses of a file is write() and flush().
        logger_factory=lambda *args: _NamedLines(lines, str(args[0]) if args else "tc_server"),
        cache_logger_on_first_use=cache,
    )
    # The libraries' own logging (asyncio's "Task exception was never retrieved", aiohttp's, grpc's) in the
    # same format, with the logger's name: through logging's last-resort handler it came out as bare text
    # among the JSON lines, whatever --log-level said. Their warnings and errors only (their info lines are
    # theirs to tune, not an operator's); --log-level error leaves out their warnings too.
    handler = _StdlibLines(cast(TextIO, LinesOrNothing(_STDERR)))
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.contextvars.merge_contextvars, structlog.stdlib.add_logger_name,
                           structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso", utc=True)],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer]))
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _StdlibLines)] + [handler]  # once
    root.setLevel(max(logging.WARNING, getattr(logging, level.upper())))


def _held_processors(processors: list[Any]) -> list[Any]:
    """``processors`` written into the list loggers already built hold (structlog.testing.capture_logs edits it
    the same way), which is returned: a new list left every logger cached before with the old chain, out of
    reach of a later capture_logs."""
    held: list[Any] = structlog.get_config()["processors"]
    held[:] = processors
    return held


def logging_state() -> dict[str, Any]:
    """structlog's configuration now, its processors copied: what :func:`restore_logging` sets back."""
    state = structlog.get_config()
    return {**state, "processors": list(state["processors"])}


def restore_logging(state: dict[str, Any]) -> None:
    """structlog configured as in ``state`` (:func:`logging_state`) and configure_logging's handler off the root
    logger: what a program that ran a command in-process (the tests) sets back after it. The processors go into
    the list loggers already hold, as in configure_logging: structlog.reset_defaults() made a new one, and the
    loggers bound before no longer reached a later capture_logs (a CI run: two tests captured nothing)."""
    structlog.configure(processors=_held_processors(state["processors"]), wrapper_class=state["wrapper_class"],
                        context_class=state["context_class"], logger_factory=state["logger_factory"],
                        cache_logger_on_first_use=state["cache_logger_on_first_use"])
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _StdlibLines)]


def configure_command_logging() -> None:
    """The log of a command beside the server (``tc-server export``, ``upgrade-store``, the audit's export)
    and of the benchmarks: warnings and errors, on stderr. Their stdout is what they print (a count, a
    table), and structlog left unconfigured writes to stdout: a store's warning (a file of an earlier
    shape) landed among a benchmark's table and broke the test that read it."""
    configure_logging("auto", "warning", cache=False)


# A process that cannot start (or go on) ends with one line saying why, starting with this, and an exit code.
REFUSAL_PREFIX = "tc-server: "


def say_refusal(text: str, fmt: str) -> None:
    """``text`` ("tc-server: ..."), the one line a process that cannot start (or go on) ends with, on stderr
    in the log's format (``fmt``, as --log-format): as it is on a console, else a JSON object whose event is
    that text, so that a log pipeline that takes JSON lines only keeps the reason a container did not start.
    Before structlog is configured too (a setting that cannot be read)."""
    if resolved_format(fmt) != "console":
        text = json.dumps({"event": text, "level": "error",
                           "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z")})
    stderr = LinesOrNothing(sys.stderr)
    stderr.write(text + "\n")
    stderr.flush()


def refusal_in(line: bytes) -> str | None:
    """The text of a line :func:`say_refusal` wrote in either format, else None (any other log line)."""
    text = line.decode(errors="replace").strip()
    if text.startswith("{"):
        try:
            event = json.loads(text).get("event")
        except (ValueError, AttributeError):
            return None
        text = event if isinstance(event, str) else ""
    return text if text.startswith(REFUSAL_PREFIX) else None


# Rate-limited warnings: a client that repeats the same mistake (or a flood of refused connections)
# gets one log line per interval, not one per occurrence (issue 15, "Log amplification": ~10-byte
# unknown commands made 19x their size in log lines). The line after a quiet interval says how many
# were left out, so nothing is hidden, only summarized. One line per event kind per interval: enough
# to see that it happens and to whom. Here, not in server/, because the store and the participants log
# through it too.
LOG_LIMIT_INTERVAL_S = 10.0
# Kinds a limiter remembers before it forgets those it no longer holds back.
MAX_LIMITED_KINDS = 10_000


class LogLimiter:
    """Decides whether a log line of one kind (``key``) may be written now."""

    __slots__ = ("_clock", "_forget_at", "_interval_s", "_next_at", "_suppressed")

    def __init__(self, interval_s: float = LOG_LIMIT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._next_at: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._forget_at = MAX_LIMITED_KINDS  # kinds remembered when _forget_quiet runs next

    def allow(self, key: str) -> int | None:
        """None: leave this line out. Otherwise write it, with the returned number of lines of the same
        kind left out since the last one (0 for the first)."""
        now = self._clock()
        if now < self._next_at.get(key, 0.0):
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        if len(self._next_at) >= self._forget_at:
            self._forget_quiet(now)
        self._next_at[key] = now + self._interval_s
        return self._suppressed.pop(key, 0)

    def _forget_quiet(self, now: float) -> None:
        # Kinds whose interval is over and that have nothing left out are as good as new: forgotten, so that
        # kinds a client can vary (a path, a topic) do not grow the limiter without end.
        self._next_at = {key: at for key, at in self._next_at.items() if at > now or key in self._suppressed}
        # Not again before the kinds kept have doubled: a pass over them per line would cost O(kinds) each.
        self._forget_at = max(MAX_LIMITED_KINDS, 2 * len(self._next_at))

    def left_out(self) -> dict[str, int]:
        """The lines left out since each kind's last line, now counted nowhere else (a stop says them: the
        next line that would have carried the count never comes); forgotten here."""
        left_out, self._suppressed = self._suppressed, {}
        return left_out
