"""The coordinator's clock: wall-clock milliseconds that move with time as it passes, not with steps of the
system clock.

Everything the coordinator times reads it: a txn's creation and end stamps, its deadline and the timeout
sweep, the GC's retention horizon, the id floor (ids.py). On the system clock itself, a step forward (an NTP
step, a VM resumed, `date -s`) aborted every open txn at once, long before its timeout, and a step forward
longer than --gc-retention-s deleted headers that had ended a moment ago (a client's retried END_TXN then
found nothing); a step back kept abandoned txns open for the length of the step, pinning their brokers'
read positions. Pulsar's own coordinator times out on a monotonic timer (a timer wheel on nanoTime), so it
does not either.

It follows the system clock while the two agree within STEP_TOLERANCE_MS (NTP's slewing, which moves the
monotonic clock at the same rate, keeps them so), and keeps to the monotonic clock past that: a step is
logged once, and the coordinator's stamps then differ from the system clock by the step until the process
restarts (it reads the system clock again). Instances that share a store compare each other's stamps (a
hand-over, GC), so their system clocks must agree (docs/semantics.md §6).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

log = structlog.get_logger("tc_server.coordinator.clock")

# How far the system clock may move from time as measured since the last reading before it counts as a step.
STEP_TOLERANCE_MS = 1000
# How often the system clock is read to compare: in between, a reading is the monotonic clock's alone (one
# call instead of two; the clock is read twice per transaction).
CHECK_EVERY_MS = 100
_NS_PER_MS = 1_000_000


class SteadyWallClock:
    """Callable: the milliseconds since the epoch, as above. ``wall`` and ``monotonic`` (nanoseconds) are
    the system's, or a test's."""

    __slots__ = ("_check_at_ns", "_monotonic", "_offset_ns", "_stepped_ns", "_wall")

    def __init__(self, wall: Callable[[], int] = time.time_ns,
                 monotonic: Callable[[], int] = time.monotonic_ns) -> None:
        self._wall = wall
        self._monotonic = monotonic
        mono = monotonic()
        self._offset_ns = wall() - mono  # wall = monotonic + offset, as of the last agreement
        self._check_at_ns = mono + CHECK_EVERY_MS * _NS_PER_MS
        self._stepped_ns = 0  # the step last logged (the system clock minus this clock)

    def __call__(self) -> int:
        mono = self._monotonic()
        if mono >= self._check_at_ns:
            self._compare(mono)
        return (mono + self._offset_ns) // _NS_PER_MS

    def _compare(self, mono: int) -> None:
        """Follow the system clock if it agrees with this one within the tolerance; log a step once."""
        self._check_at_ns = mono + CHECK_EVERY_MS * _NS_PER_MS
        wall = self._wall()
        apart = wall - (mono + self._offset_ns)
        if -STEP_TOLERANCE_MS * _NS_PER_MS <= apart <= STEP_TOLERANCE_MS * _NS_PER_MS:
            self._offset_ns = wall - mono  # agreeing: follow the system clock exactly
        elif abs(apart - self._stepped_ns) > STEP_TOLERANCE_MS * _NS_PER_MS:
            self._stepped_ns = apart
            log.warning("system clock stepped; transaction timeouts, stamps and GC keep to the time that passed "
                        "(until a restart)", step_ms=apart // _NS_PER_MS)


coordinator_clock = SteadyWallClock()
