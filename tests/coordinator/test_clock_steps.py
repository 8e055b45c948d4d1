"""The coordinator's clock against steps of the system clock (in-process: the coordinator's clock is
tc_server/coordinator/clock.py's SteadyWallClock over a system clock the test steps).

A step is what NTP stepping the clock, a VM snapshot restored, or a new process on a host whose clock is
behind does: real time keeps going, the wall clock jumps. A txn's TTL is what its client asked for as elapsed
time (the Java client counts it on its own timer); the coordinator must neither abort a txn long before that
much time has passed, nor keep an abandoned one OPEN far past it (an OPEN txn pins its topics' read position
on today's brokers and the coordinator's low watermark). The GC retention keeps END_TXN idempotent: a COMMIT
retried after a lost answer is answered success while the header is kept. On the system clock itself, each
of the tests below failed (a review's)."""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractAsyncContextManager

import pytest

from tc_server.coordinator.clock import SteadyWallClock
from tc_server.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
from tc_server.coordinator.errors import TransactionNotFound
from tc_server.coordinator.layout import TxnState
from tc_server.coordinator.partition import PartitionConfig
from tc_server.metrics import Metrics
from tc_server.store.memory import MemoryStore
from tests.coordinator.test_partition import header
from tests.participants.test_outbox import running

HOUR_MS = 3_600_000


class SteppedClock:
    """The coordinator's clock (SteadyWallClock, as tc-server runs it) over a system clock the test steps:
    real time plus ``offset_ms``, which goes on with real time after a step. ``offset_ms`` given here: the
    system clock of a process started that far off."""

    def __init__(self, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms
        self._clock = SteadyWallClock(wall=lambda: time.time_ns() + self.offset_ms * 1_000_000)

    def __call__(self) -> int:
        return self._clock()


def coordinator(store, clock) -> TransactionCoordinator:
    config = CoordinatorConfig(partitions=1, partition=PartitionConfig(id_block_size=10), timeout_sweep=True,
                               gc_retention_s=900)
    return TransactionCoordinator(store, config, Metrics("test"), clock)


def leading(store: MemoryStore, clock: SteppedClock) -> AbstractAsyncContextManager[TransactionCoordinator]:
    """A coordinator on ``store`` and ``clock``, leading and recovered; stopped after the block."""
    return running(coordinator(store, clock))


async def state(store: MemoryStore, least: int) -> TxnState:
    return (await header(store, 0, least)).state


async def state_after(store, least, seconds: float) -> TxnState:
    """The header's state once ``seconds`` of real time passed with the sweeper running, or as soon as it
    is no longer OPEN."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (found := await state(store, least)) is not TxnState.OPEN:
            return found
        await asyncio.sleep(0.05)
    return await state(store, least)


async def test_a_forward_clock_step_does_not_abort_a_txn_long_before_its_ttl():
    # NTP steps the clock 2 minutes forward half a second into a txn of 60 s: the sweep (200 ms) aborts it
    # at once, and the client's COMMIT 59 s before its TTL gets "timed out" (TransactionNotFound).
    store, clock = MemoryStore(), SteppedClock()
    async with leading(store, clock) as tc:
        least = await tc.partition(0).new_txn(60_000, None)
        clock.offset_ms += 120_000
        assert await state_after(store, least, 1.0) is TxnState.OPEN, (
            "aborted about a second into a txn of 60 s: the wall clock stepped 2 minutes forward")
        await tc.partition(0).end_txn(least, commit=True, principal=None)
        assert await state(store, least) is TxnState.COMMITTED


async def test_a_backward_clock_step_does_not_keep_an_abandoned_txn_open_for_the_steps_length():
    # The clock steps an hour back just after a txn of 1 s opened, and its client is gone: the txn must be
    # aborted about a second later, not in an hour (meanwhile its brokers hold its topics' readers back).
    store, clock = MemoryStore(), SteppedClock()
    async with leading(store, clock) as tc:
        least = await tc.partition(0).new_txn(1_000, None)
        clock.offset_ms -= HOUR_MS
        assert await state_after(store, least, 3.0) is TxnState.ABORTED, (
            "a txn of 1 s still OPEN 3 s later: the wall clock stepped an hour back, so its deadline is an hour away")


async def test_a_txn_recovered_from_the_future_is_still_aborted_within_its_ttl():
    # The previous leader's clock was an hour ahead of this one (a restart after the clock was corrected
    # back, or a take-over on Oxia by an instance whose clock is behind): the recovered txn of 1 s has a
    # created time an hour in this clock's future. No txn can need more than its TTL from now: it should be
    # aborted about a second after recovery, not an hour later.
    store = MemoryStore()
    ahead, behind = SteppedClock(HOUR_MS), SteppedClock()
    async with leading(store, ahead) as first:
        least = await first.partition(0).new_txn(1_000, None)
    async with leading(store, behind):
        assert await state_after(store, least, 3.0) is TxnState.ABORTED, (
            "a recovered txn of 1 s created 'an hour from now' is still OPEN 3 s after the take-over")


async def test_a_txn_created_by_a_clock_ahead_is_never_stamped_ended_before_it_was_created():
    # The previous leader's clock was an hour ahead (a restart after the system clock was stepped back): the
    # END_TXN here stamped finalizedAt an hour before createdAt, a header the audit calls illegal (a review's).
    store = MemoryStore()
    ahead, behind = SteppedClock(HOUR_MS), SteppedClock()
    async with leading(store, ahead) as first:
        least = await first.partition(0).new_txn(60_000, None)
    async with leading(store, behind) as second:
        await second.partition(0).end_txn(least, commit=True, principal=None)
        ended = await header(store, 0, least)
        assert ended.state is TxnState.COMMITTED and ended.finalized_ms == ended.created_ms


async def test_a_forward_clock_step_does_not_cut_the_retention_of_a_header_ended_a_moment_ago():
    store, clock = MemoryStore(), SteppedClock()
    async with leading(store, clock) as tc:
        least = await tc.partition(0).new_txn(60_000, None)
        await tc.partition(0).end_txn(least, commit=True, principal=None)  # its answer lost on the way
        clock.offset_ms += 20 * 60_000  # NTP steps the clock 20 minutes forward
        await tc.collect_garbage_now()
        try:
            await tc.partition(0).end_txn(least, commit=True, principal=None)  # the client's retry
        except TransactionNotFound:
            pytest.fail("a COMMIT retried a moment after it succeeded was answered TransactionNotFound: GC collected "
                        "the header after a forward clock step, well within --gc-retention-s of its end")


class SystemClocks:
    """A wall and a monotonic clock (nanoseconds) the test moves."""

    def __init__(self) -> None:
        self.wall = 1_000_000 * 1_000_000_000
        self.mono = 5 * 1_000_000_000

    def advance(self, seconds: float) -> None:
        self.wall += int(seconds * 1e9)
        self.mono += int(seconds * 1e9)

    def clock(self) -> SteadyWallClock:
        return SteadyWallClock(wall=lambda: self.wall, monotonic=lambda: self.mono)


def test_the_clock_follows_the_system_clock_and_keeps_to_elapsed_time_across_a_step() -> None:
    system = SystemClocks()
    clock = system.clock()
    assert clock() == 1_000_000_000
    system.mono += 2_000_000_000
    system.wall += 2_000_300_000  # NTP slewing: within the tolerance, followed exactly
    assert clock() == 1_000_002_000
    system.wall += HOUR_MS * 1_000_000  # a step: time as it passed, and no more than CATCH_UP_RATE on top
    assert clock() == 1_000_002_000
    system.advance(1.0)
    assert clock() == 1_000_003_000  # seen at this reading: caught up from here on
    system.advance(1.0)
    assert clock() == 1_000_004_100
    system.wall -= HOUR_MS * 1_000_000 - 100_000_000  # stepped back to agree with the clock as of this reading
    system.advance(1.0)
    assert clock() == 1_000_005_200  # it caught up 0.1 s more meanwhile, and comes back from here
    for _ in range(30):
        system.advance(0.1)
        clock()
    assert clock() == system.wall // 1_000_000


@pytest.mark.parametrize("step_s", [120, -120])
def test_after_a_step_the_clock_catches_up_with_the_system_clock_at_a_bounded_rate(step_s: int) -> None:
    # It used to keep to the monotonic clock until the process restarted: a host whose clock NTP corrected
    # by an hour after tc-server started wrote stamps an hour off for good, which instances sharing the store
    # (a take-over, GC) read as an hour of time passed, or yet to come.
    system = SystemClocks()
    clock = system.clock()
    readings = [clock()]
    system.wall += step_s * 1_000_000_000
    for _ in range(200 * abs(step_s)):  # 10 readings a second, twice as long as catching up takes
        system.advance(0.1)
        readings.append(clock())
    steps = [later - earlier for earlier, later in zip(readings, readings[1:], strict=False)]
    assert all(90 <= step <= 110 for step in steps), "ran more than a tenth fast or slow, or backwards"
    assert clock() == system.wall // 1_000_000, "not caught up with the system clock"


NS_PER_MS = 1_000_000


def test_the_clock_never_runs_backwards_while_catching_up_with_a_backward_step() -> None:
    # The catch-up was applied at each compare, for the time since the last: a reading just after a compare
    # was up to 10 ms earlier than one just before it (a review's). It is continuous now.
    system = SystemClocks()
    clock = system.clock()
    clock()
    system.wall -= 60_000 * NS_PER_MS  # NTP steps the system clock a minute back
    readings: list[int] = []
    # Read often, as a busy coordinator does (twice per transaction): every 0.5 ms for a few seconds.
    step_ns = NS_PER_MS // 2 + 7
    for _ in range(10_000):
        system.mono += step_ns
        system.wall += step_ns
        readings.append(clock())
    went_back = [(i, a, b) for i, (a, b) in enumerate(zip(readings, readings[1:], strict=False)) if b < a]
    assert not went_back, (f"the coordinator clock ran backwards {len(went_back)} times while catching up, "
                           f"first at reading {went_back[0][0]}: {went_back[0][1]} -> {went_back[0][2]} ms")
