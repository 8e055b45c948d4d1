"""The coordinator's clock: wall-clock milliseconds that move with time as it passes, not with steps of the
system clock.

Everything the coordinator times reads it: a txn's creation and end stamps, its deadline and the timeout
sweep, the GC's retention horizon, the id floor (ids.py). On the system clock itself, a step forward (an NTP
step, a VM resumed, `date -s`) aborted every open txn at once, long before its timeout, and a step forward
longer than --gc-retention-s deleted headers that had ended a moment ago (a client's retried END_TXN then
found nothing); a step back kept abandoned txns open for the length of the step, pinning their brokers'
read positions. Pulsar's own coordinator times out on a monotonic timer (a timer wheel on nanoTime), so it
does not either.

It follows the system clock while the two agree within FOLLOW_MS (NTP's slewing moves the monotonic clock
at the same rate, so they do). Past that it catches up with the system clock gradually, running at most
CATCH_UP_RATE faster or slower than time passes, so a deadline or a retention comes at most that fraction early
or late, and the clock never runs backwards (by more than FOLLOW_MS). A step (a difference over
STEP_TOLERANCE_MS) is logged once, and the end of its catching up too. Keeping to the monotonic clock for good
instead left the stamps off by the step until the process restarted, where a step is most often the system
clock being corrected: a host that booted an hour behind wrote stamps an hour old, which another instance (a
take-over, GC) read as an hour of time passed. Instances that share a store compare each other's stamps, so
their system clocks must agree (docs/semantics.md §6).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

log = structlog.get_logger("tc_server.coordinator.clock")

# A difference from the system clock up to this is followed at once (NTP's slewing leaves microseconds); past
# it the clock catches up gradually.
FOLLOW_MS = 1
# A difference past this is a step of the system clock, logged.
STEP_TOLERANCE_MS = 1000
# How often the system clock is read to compare: in between, a reading is the monotonic clock's alone (one
# call instead of two; the clock is read twice per transaction).
CHECK_EVERY_MS = 100
# Past FOLLOW_MS, the clock moves towards the system clock by this fraction of the time that passes, at every
# reading: a step of a minute is caught up in 10 minutes, during which a txn's timeout comes up to a tenth early
# (a step forward) or late (back).
CATCH_UP_RATE = 0.1
_NS_PER_MS = 1_000_000


class SteadyWallClock:
    """Callable: the milliseconds since the epoch, as above. ``wall`` and ``monotonic`` (nanoseconds) are
    the system's, or a test's."""

    __slots__ = ("_check_at_ns", "_compared_at_ns", "_logged_step", "_monotonic", "_offset_ns", "_remaining_ns",
                 "_stepped_ns", "_wall")

    def __init__(self, wall: Callable[[], int] = time.time_ns,
                 monotonic: Callable[[], int] = time.monotonic_ns) -> None:
        self._wall = wall
        self._monotonic = monotonic
        mono = monotonic()
        self._offset_ns = wall() - mono  # this clock = monotonic + offset (+ the catching up since the compare)
        self._compared_at_ns = mono
        self._check_at_ns = mono + CHECK_EVERY_MS * _NS_PER_MS
        # While catching up: how far the system clock was from this one at the last compare, signed (0: not).
        self._remaining_ns = 0
        self._stepped_ns = 0  # the difference the last logged step left, as expected at the last compare
        self._logged_step = False

    def __call__(self) -> int:
        mono = self._monotonic()
        if mono >= self._check_at_ns:
            self._compare(mono)
        if self._remaining_ns:
            return (mono + self._offset_ns + self._caught_up_ns(mono)) // _NS_PER_MS
        return (mono + self._offset_ns) // _NS_PER_MS

    def _caught_up_ns(self, mono: int) -> int:
        """How much of the difference left at the last compare is made up by ``mono``: CATCH_UP_RATE of the time
        since, continuously (applied at the compare only, a reading just after it was earlier than one just
        before), never more than that difference."""
        moved = int((mono - self._compared_at_ns) * CATCH_UP_RATE)
        remaining = self._remaining_ns
        if remaining > 0:
            return moved if moved < remaining else remaining
        return -moved if moved < -remaining else remaining

    def _compare(self, mono: int) -> None:
        """Follow the system clock if it agrees with this one within FOLLOW_MS, else catch up with it; log a
        step once, and the end of catching up with it."""
        if self._remaining_ns:
            self._offset_ns += self._caught_up_ns(mono)
        self._compared_at_ns = mono
        self._check_at_ns = mono + CHECK_EVERY_MS * _NS_PER_MS
        apart = self._wall() - (mono + self._offset_ns)
        if -FOLLOW_MS * _NS_PER_MS <= apart <= FOLLOW_MS * _NS_PER_MS:
            self._offset_ns += apart  # agreeing, or caught up: follow the system clock exactly
            self._remaining_ns = self._stepped_ns = 0
            if self._logged_step:
                self._logged_step = False
                log.info("caught up with the system clock after its step")
            return
        if abs(apart - self._stepped_ns) > STEP_TOLERANCE_MS * _NS_PER_MS:
            self._logged_step = True
            log.warning("system clock stepped; transaction timeouts, stamps and GC catch up with it gradually",
                        step_ms=apart // _NS_PER_MS, catch_up_s=round(abs(apart) / CATCH_UP_RATE / 1e9),
                        catch_up_rate=CATCH_UP_RATE)
        self._remaining_ns = self._stepped_ns = apart

coordinator_clock = SteadyWallClock()
