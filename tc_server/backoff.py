"""Exponential backoff with jitter for whatever reconnects by itself (Oxia streams, broker connections,
participant deliveries)."""

from __future__ import annotations

import random

# Start fast (a restarted standalone server is back within a second), cap low enough that a
# recovered server is noticed well within the default 10 s request timeout.
INITIAL_DELAY_S = 0.05
MAX_DELAY_S = 2.0


class Backoff:
    """Delays of ``INITIAL * 2**n`` capped at ``MAX``, each with up to 50% random reduction so that
    many clients do not reconnect in lockstep."""

    def __init__(self, initial_s: float = INITIAL_DELAY_S, max_s: float = MAX_DELAY_S) -> None:
        self._initial = initial_s
        self._max = max_s
        self._next = initial_s

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self._max)
        return delay * (0.5 + random.random() / 2)

    def reset(self) -> None:
        self._next = self._initial
