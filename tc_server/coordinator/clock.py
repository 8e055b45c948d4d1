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
monotonic clock at the same rate, keeps them so). Past that (a step) it catches up with the system clock
gradually, running at most CATCH_UP_RATE faster or slower than time passes, so a deadline or a retention
comes at most that fraction early or late; the step is logged once, the end of the catching up too.
Keeping to the monotonic clock for good instead left the stamps off by the step until the process restarted,
where a step is most often the system clock being corrected: a host that booted an hour behind wrote stamps an
hour old, which another instance (a take-over, GC) read as an hour of time passed. Instances that share a
store compare each other's stamps, so their system clocks must agree (docs/semantics.md §6).
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
# Past a step, the clock moves towards the system clock by at most this fraction of the time that passed: a
# step of a minute is caught up in 10 minutes, during which a txn's timeout comes up to a tenth early (a step
# forward) or late (back). The clock never runs backwards while it does.
CATCH_UP_RATE = 0.1
_NS_PER_MS = 1_000_000


class SteadyWallClock:
    """Callable: the milliseconds since the epoch, as above. ``wall`` and ``monotonic`` (nanoseconds) are
    the system's, or a test's."""

    __slots__ = ("_catching_up", "_check_at_ns", "_compared_at_ns", "_monotonic", "_offset_ns", "_stepped_ns",
                 "_wall")

    def __init__(self, wall: Callable[[], int] = time.time_ns,
                 monotonic: Callable[[], int] = time.monotonic_ns) -> None:
        self._wall = wall
        self._monotonic = monotonic
        mono = monotonic()
        self._offset_ns = wall() - mono  # this clock = monotonic + offset
        self._compared_at_ns = mono
        self._check_at_ns = mono + CHECK_EVERY_MS * _NS_PER_MS
        self._stepped_ns = 0  # how far the system clock was expected to be from this one after the last compare
        self._catching_up = False

    def __call__(self) -> int:
        mono = self._monotonic()
        if mono >= self._check_at_ns:
            self._compare(mono)
        return (mono + self._offset_ns) // _NS_PER_MS

    def _compare(self, mono: int) -> None:
        """Follow the system clock if it agrees with this one within the tolerance, else move towards it by
        CATCH_UP_RATE of the time since the last compare; log a step once, and the end of catching up."""
        elapsed = mono - self._compared_at_ns
        self._compared_at_ns = mono
        self._check_at_ns = mono + CHECK_EVERY_MS * _NS_PER_MS
        wall = self._wall()
        apart = wall - (mono + self._offset_ns)
        tolerance = STEP_TOLERANCE_MS * _NS_PER_MS
        most = int(elapsed * CATCH_UP_RATE)
        if (-tolerance <= apart <= tolerance and not self._catching_up) or abs(apart) <= most:
            self._offset_ns = wall - mono  # agreeing, or caught up: follow the system clock exactly
            self._stepped_ns = 0
            if self._catching_up:
                self._catching_up = False
                log.info("caught up with the system clock after its step")
            return
        # Catching up: to the end, rather than jumping the last STEP_TOLERANCE_MS, which would run it backwards.
        if abs(apart - self._stepped_ns) > tolerance:
            log.warning("system clock stepped; transaction timeouts, stamps and GC catch up with it gradually",
                        step_ms=apart // _NS_PER_MS, catch_up_s=round(abs(apart) / CATCH_UP_RATE / 1e9),
                        catch_up_rate=CATCH_UP_RATE)
        move = most if apart > 0 else -most
        self._offset_ns += move
        self._stepped_ns = apart - move
        self._catching_up = True

coordinator_clock = SteadyWallClock()
