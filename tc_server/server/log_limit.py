"""Rate-limited warnings: a client that repeats the same mistake (or a flood of refused connections)
gets one log line per interval, not one per occurrence (issue 15, "Log amplification": ~10-byte
unknown commands made 19x their size in log lines). The line after a quiet interval says how many
were left out, so nothing is hidden, only summarized."""

from __future__ import annotations

import time
from collections.abc import Callable

# One line per event kind per interval: enough to see that it happens and to whom.
DEFAULT_INTERVAL_S = 10.0


class LogLimiter:
    """Decides whether a log line of one kind (``key``) may be written now."""

    __slots__ = ("_clock", "_interval_s", "_next_at", "_suppressed")

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._next_at: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def allow(self, key: str) -> int | None:
        """None: leave this line out. Otherwise write it, with the returned number of lines of the same
        kind left out since the last one (0 for the first)."""
        now = self._clock()
        if now < self._next_at.get(key, 0.0):
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        self._next_at[key] = now + self._interval_s
        return self._suppressed.pop(key, 0)
