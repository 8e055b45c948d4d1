"""Store failures at the awkward moments: a write applied but its answer lost, a scan that fails
while taking over, a hand-over racing the new leader's recovery. Each test wraps the memory store
to inject exactly one such fault (the real stores cannot be made to fail on cue)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
import structlog

from tc_server.coordinator import layout, leadership
from tc_server.coordinator.coordinator import OVERDUE_GRACE_MS, CoordinatorConfig, TransactionCoordinator
from tc_server.coordinator.errors import CoordinatorNotFound, InvalidTxnStatus, NotAllowed
from tc_server.coordinator.ids import IdAllocator
from tc_server.coordinator.layout import OpKind, Participant, TxnOp, TxnState
from tc_server.coordinator.partition import TIMEOUT_RETRY_MS, CoordinatorPartition, PartitionConfig
from tc_server.metrics import Metrics
from tc_server.store.api import MetadataStore, Record, StoreUnavailableError
from tc_server.store.memory import MemoryBackend, MemoryStore
from tests.coordinator.test_partition import FakeClock, header, make, seed_sequence
from tests.participants.test_outbox import OTHER, TOPIC, RecordingSender, committed_count, led
from tests.participants.test_outbox import coordinator as coordinator_with_sender
from tests.support.gated_store import GatedStore
from tests.support.waiting import async_wait_for

_T = TypeVar("_T")


class LoseReply(MemoryStore):
    """Applies the next put under ``prefix`` and then reports it as failed (the answer was lost)."""

    prefix: str | None = None

    async def put(self, key, value, **kw):
        record = await super().put(key, value, **kw)
        if self.prefix is not None and key.startswith(self.prefix):
            self.prefix = None
            raise StoreUnavailableError("reply lost")
        return record


class StallIdBlocks(MemoryStore):
    """The reservations of id blocks (``/txn/tc-seq/``) wait for the gate: a slow store, on cue."""

    def __init__(self, backend: MemoryBackend | None = None) -> None:
        super().__init__(backend)
        self.gate = asyncio.Event()
        self.gate.set()

    async def put(self, key, value, **kw):
        if key.startswith(layout.TC_SEQ_PREFIX):
            await self.gate.wait()
        return await super().put(key, value, **kw)


class FailScan(MemoryStore):
    failures = 0
    error: Exception = StoreUnavailableError("scan failed")

    def scan_index(self, *args, **kwargs):
        if self.failures:
            self.failures -= 1
            raise self.error
        return super().scan_index(*args, **kwargs)


@pytest.fixture(autouse=True)
def fast_recheck(monkeypatch):
    monkeypatch.setattr(leadership, "RECHECK_INTERVAL_S", 0.05)


def coordinator(store: MetadataStore, url: str, partitions: int = 2, **kw: Any) -> TransactionCoordinator:
    config = CoordinatorConfig(partitions=partitions, advertised_url=url,
                               partition=PartitionConfig(id_block_size=10), **kw)
    return TransactionCoordinator(store, config, Metrics("t"))


async def started(store: MetadataStore, clock: FakeClock | None = None) -> TransactionCoordinator:
    """One coordinator (one partition) leading and recovered on ``store``: with its own timeout sweep, or
    on ``clock`` with none (the test runs the timeouts)."""
    tc = coordinator(store, "pulsar://a:1", partitions=1) if clock is None else make(store, clock, partitions=1)
    await tc.start()
    await tc.wait_recovered()
    return tc


async def open_headers(store):
    return [r.key for start, end in layout.deadline_ranges()
            async for r in store.scan_index(layout.IDX_TXN_BY_DEADLINE, start, end)]


async def test_created_header_with_lost_reply_still_times_out():
    store = LoseReply()
    first = await seed_sequence(store, 0)
    tc = coordinator(store, "pulsar://a:1", partitions=1)
    await tc.start()
    store.prefix = layout.HEADER_PREFIX
    with pytest.raises(StoreUnavailableError):
        await tc.partition(0).new_txn(100, None)
    assert await open_headers(store) == [layout.header_path(0, first)]  # it was written after all
    assert await async_wait_for(lambda: not tc.partition(0).open_txns())
    assert await open_headers(store) == []
    # Created once its header was found, so a timeout has its creation: without it, each such txn raised
    # TcServerTransactionsTimingOut's timeouts / creations ratio, past 1 in a store outage (a review).
    labels = tc.metrics.tc(0)
    assert (tc.metrics.created.labels(**labels).value, tc.metrics.timed_out.labels(**labels).value) == (1, 1)
    await tc.stop()


class HeadersNotWritten(MemoryStore):
    """Header writes fail while ``how`` is set, without being applied: "refused" before anything is sent (as
    the embedded store refuses while its writer is too far behind), "lost" after (an unknown outcome)."""

    how: str | None = None

    def _start_put(self, op):
        if self.how == "refused" and op.key.startswith(layout.HEADER_PREFIX):
            raise StoreUnavailableError("new writes are refused")
        return super()._start_put(op)

    async def put(self, key, value, **kw):
        if self.how == "lost" and key.startswith(layout.HEADER_PREFIX):
            raise StoreUnavailableError("no answer")
        return await super().put(key, value, **kw)


@pytest.mark.parametrize("how", ["refused", "lost"])
async def test_a_new_txn_whose_header_was_never_written_does_not_stay_open_until_its_timeout(how: str) -> None:
    # Such ids held their place in the open set for the txn's whole timeout (up to an hour): after a store
    # stall with clients retrying NEW_TXN, --max-active-transactions-per-coordinator refused every NEW_TXN of
    # a healthy coordinator with NotAllowed, which clients do not retry.
    store = HeadersNotWritten()
    clock = FakeClock()
    tc = await started(store, clock)
    partition = tc.partition(0)
    store.how = how
    for _ in range(3):
        with pytest.raises(StoreUnavailableError):
            await partition.new_txn(3_600_000, None)
    store.how = None
    if how == "lost":  # the outcome is unknown: looked at early, not at the deadline
        assert len(partition.open_txns()) == 3
        clock.now += TIMEOUT_RETRY_MS
        assert await tc.abort_expired_now() == 3
    assert not partition.open_txns()
    assert await open_headers(store) == []
    assert tc.metrics.created.labels(**tc.metrics.tc(0)).value == 0  # none was created
    await tc.stop()


async def test_a_header_written_despite_a_lost_answer_is_not_aborted_before_its_deadline():
    # The early look (above) finds the header: the txn goes back to its deadline, still OPEN.
    store = LoseReply()
    clock = FakeClock()
    tc = await started(store, clock)
    partition = tc.partition(0)
    store.prefix = layout.HEADER_PREFIX
    with pytest.raises(StoreUnavailableError):
        await partition.new_txn(60_000, None)
    (least,) = partition.open_txns()
    clock.now += TIMEOUT_RETRY_MS
    assert await tc.abort_expired_now() == 1
    assert (await header(store, 0, least)).state is TxnState.OPEN and list(partition.open_txns()) == [least]
    clock.now += 60_000
    assert await tc.abort_expired_now() == 1
    assert (await header(store, 0, least)).state is TxnState.ABORTED
    await tc.stop()


async def test_decided_header_with_lost_reply_is_delivered_on_the_retry():
    # The decision was written, its answer lost: the txn stays held (the low watermark) until the
    # decision is delivered; the client's retry finds it on disk and delivers it. Before, the retry's
    # CAS from the cached OPEN header failed, the re-read said "already committed" and the txn left
    # the open set without entering the outbox: the watermark passed a commit its broker never heard.
    store = LoseReply()
    sender = RecordingSender()
    async with led(store, sender) as tc:
        partition = tc.partition(0)
        least = await partition.new_txn(60_000, None)
        await partition.add_participants(least, None, [Participant(TOPIC)])
        store.prefix = layout.HEADER_PREFIX
        with pytest.raises(StoreUnavailableError):
            await partition.end_txn(least, commit=True, principal=None)
        assert least in partition.open_txns() and not sender.told
        delivery = await partition.end_txn(least, commit=True, principal=None)
        if delivery is not None:
            await delivery
        assert [(t.least, t.participant.topic, t.committed) for t in sender.told] == [(least, TOPIC, True)]
        assert least not in partition.open_txns()
        assert committed_count(tc.metrics) == 1  # this leader's own decision: counted once, by the retry



@pytest.mark.parametrize("reply_lost", [False, True])
async def test_a_client_abort_after_the_deadline_counts_as_an_abort_whether_or_not_its_answer_was_lost(
        reply_lost: bool):
    # A client's ABORT of an overdue txn is a plain abort (docs/semantics.md §2), not a timeout. With its
    # answer lost, the retry adopted the decision from the header and, its time past the deadline, counted
    # a timeout: pulsar_txn_timeout_total, which TcServerTransactionsTimingOut reads, grew with store trouble.
    store, clock = LoseReply(), FakeClock()
    tc = make(store, clock, partitions=1)
    await tc.start()
    partition = tc.partition(0)
    least = await partition.new_txn(1_000, None)
    clock.now += 2_000
    if reply_lost:
        store.prefix = layout.HEADER_PREFIX
        with pytest.raises(StoreUnavailableError):
            await partition.end_txn(least, commit=False, principal=None)
    await partition.end_txn(least, commit=False, principal=None)  # (the client's retry)
    assert (tc.metrics.aborted.labels(**tc.metrics.tc(0)).value,
            tc.metrics.timed_out.labels(**tc.metrics.tc(0)).value) == (1, 0)
    await tc.stop()

async def new_txn_held_past_its_deadline(
        store: GatedStore) -> tuple[TransactionCoordinator, CoordinatorPartition, asyncio.Task[int]]:
    """A coordinator on ``store`` (no sweep of its own) whose NEW_TXN of 1 s waits at the store's gate,
    tracked, its deadline past on the coordinator's clock: (coordinator, partition, the request)."""
    clock = FakeClock()
    tc = await started(store, clock)
    partition = tc.partition(0)
    store.gate.clear()
    request = asyncio.create_task(partition.new_txn(1_000, None))
    assert await async_wait_for(lambda: bool(partition.open_txns()))
    clock.now += 2_000
    return tc, partition, request


async def test_header_landing_after_its_txn_timed_out_is_still_aborted():
    # The sweep looked for a NEW_TXN's header before the slow write landed, found none and forgot the
    # id. Once the header lands it is tracked again and aborted, not left OPEN for a next leader.
    store = GatedStore()
    tc, partition, request = await new_txn_held_past_its_deadline(store)
    assert await tc.abort_expired_now() == 1  # no header yet: forgotten
    assert not partition.open_txns()
    store.gate.set()
    least = await request
    assert least in partition.open_txns()
    assert await tc.abort_expired_now() == 1
    assert (await header(store, 0, least)).state is TxnState.ABORTED
    assert not partition.open_txns()
    await tc.stop()


class SlowHeaderReads(GatedStore):
    """Header writes wait for ``gate`` (GatedStore); a header read, once ``slow_reads`` is set, reads the
    store at once but answers only when ``read_gate`` opens: a read overtaken by a write."""

    def __init__(self) -> None:
        super().__init__()
        self.read_gate = asyncio.Event()
        self.reading = asyncio.Event()
        self.slow_reads = False

    async def get(self, key, **kwargs):
        record = await super().get(key, **kwargs)
        if self.slow_reads and key.startswith(layout.HEADER_PREFIX):
            self.reading.set()
            await self.read_gate.wait()
        return record


async def test_a_header_landing_while_the_timeout_reads_it_is_still_aborted():
    # The timeout's read found no header; the NEW_TXN's write landed before that answer came back. The
    # sweep forgot the id after the write's own check had seen it tracked: an OPEN header nobody
    # tracked, aborted only by the overdue scan seconds later (a fuzzer's 1 ms TTLs: "missed by the
    # deadline queue").
    store = SlowHeaderReads()
    tc, partition, request = await new_txn_held_past_its_deadline(store)
    store.slow_reads = True
    sweep = asyncio.create_task(tc.abort_expired_now())
    await store.reading.wait()  # the read saw no header
    store.gate.set()
    least = await request  # the header landed
    store.read_gate.set()
    await sweep
    assert least in partition.open_txns()
    assert await tc.abort_expired_now() == 1
    assert (await header(store, 0, least)).state is TxnState.ABORTED
    assert not partition.open_txns()
    await tc.stop()


async def test_the_overdue_scan_tells_a_txn_its_queue_missed_from_one_the_queue_is_late_with():
    store = MemoryStore()
    clock = FakeClock()
    tc = await started(store, clock)  # no timeout sweep of its own: its queue never runs here
    late = await tc.partition(0).new_txn(1_000, None)
    # A header no one told this leader of (an earlier leader's write just before a hand-over).
    missed = 500
    written = layout.TxnHeader(TxnState.OPEN, created_ms=clock.now, timeout_ms=1_000)
    await store.put(layout.header_path(0, missed), written.to_json(), partition_key=layout.txn_key(0, missed),
                    secondary_indexes=written.index_entries())
    clock.now += 1_000 + OVERDUE_GRACE_MS + 1
    assert await tc.abort_overdue() == (1, 1)
    for least in (late, missed):
        assert (await header(store, 0, least)).state is TxnState.ABORTED
    assert await tc.abort_overdue() == (0, 0)
    await tc.stop()


class LapsingLease(MemoryStore):
    """A memory store whose leader records hold a lease (as on Oxia) that ``lapse()`` ends: a process
    stalled past its session timeout, on cue."""

    def __init__(self) -> None:
        super().__init__()
        self.until = float("inf")

    def ephemeral_lease(self, key, session_id=None):
        return lambda: self.until

    def lapse(self) -> None:
        self.until = 0.0


async def test_a_timeout_abort_written_as_the_lease_lapses_is_not_logged_as_failed():
    store = LapsingLease()
    clock = FakeClock()
    tc = await started(store, clock)
    partition = tc.partition(0)
    least = await partition.new_txn(1_000, None)
    clock.now += 2_000
    store.lapse()
    with structlog.testing.capture_logs() as logged:
        assert await tc.abort_expired_now() == 1
    assert (await header(store, 0, least)).state is TxnState.ABORTED  # the abort landed
    assert not partition.open_txns()
    assert [e["event"] for e in logged] == ["timeout abort written; this instance may no longer lead the "
                                            "coordinator"], logged
    await tc.stop()


async def test_new_txn_waiting_for_ids_when_the_partition_steps_down_is_told_to_look_up_again():
    # Stepping down cancels the id block reservation in flight (IdAllocator.close). The NEW_TXN
    # waiting on it must fail with the error the Java client retries after a lookup, not end as
    # cancelled: a cancelled request task is never answered, and the client would wait out its
    # operation timeout.
    store = StallIdBlocks()
    tc = coordinator(store, "pulsar://a:1", partitions=1)
    await tc.start()
    partition = tc.partition(0)
    store.gate.clear()
    waiting = asyncio.create_task(partition.new_txn(60_000, None))
    assert await async_wait_for(lambda: partition._ids._refill is not None)
    await tc.stop()
    outcome = (await asyncio.gather(waiting, return_exceptions=True))[0]
    assert isinstance(outcome, CoordinatorNotFound), repr(outcome)
    assert "stepped down" in str(outcome)
    # A request that still holds the stopped partition reserves nothing more either.
    with pytest.raises(CoordinatorNotFound):
        await partition.new_txn(60_000, None)
    assert await store.get(layout.tc_seq_path(0)) is None


@pytest.mark.parametrize("error", [StoreUnavailableError("scan failed"), RuntimeError("a bug in one pass")])
async def test_failed_recovery_scan_is_retried(error):
    # Any failure, a bug's too, is retried: recovery ending for good would leave the open txns untracked
    # (never timed out) until the next election.
    backend = MemoryBackend()
    a_store, b_store = MemoryStore(backend), FailScan(backend)
    b_store.error = error
    a, b = coordinator(a_store, "pulsar://a:1"), coordinator(b_store, "pulsar://b:2")
    await a.start()
    await b.start()
    assert await async_wait_for(lambda: b.leads(1))
    left_open = await a.partition(0).new_txn(60_000, None)
    b_store.failures = 1  # the recovery scan after taking partition 0 over fails once
    await a.stop()
    await a_store.close()
    assert await async_wait_for(lambda: b.leads(0) and b.leads(1))
    assert b.leader_url(0) == "pulsar://b:2"
    assert await async_wait_for(lambda: left_open in b.partition(0).open_txns())
    await b.stop()


async def test_leader_record_with_lost_reply_is_adopted():
    backend = MemoryBackend()
    a_store, b_store = MemoryStore(backend), LoseReply(backend)
    a, b = coordinator(a_store, "pulsar://a:1", partitions=1), coordinator(b_store, "pulsar://b:2", partitions=1)
    await a.start()
    await b.start()
    b_store.prefix = layout.LEADER_PREFIX
    await a.stop()
    await a_store.close()
    assert await async_wait_for(lambda: b.leads(0))
    await b.stop()


async def test_txns_created_by_the_old_leader_during_hand_over_are_timed_out():
    backend = MemoryBackend()
    a_store, b_store = MemoryStore(backend), MemoryStore(backend)
    a = coordinator(a_store, "pulsar://a:1")
    await a.start()
    late = await a.partition(1).new_txn(300, None)  # created just before b joins and takes 1 over
    b = coordinator(b_store, "pulsar://b:2")
    await b.start()
    assert await async_wait_for(lambda: b.leads(1))
    state = None
    for _ in range(200):  # bounded poll: the new leader recovers the txn and aborts it at its deadline
        record = await b_store.get(layout.header_path(1, late))
        assert record is not None
        state = layout.TxnHeader.from_json(record.value).state
        if state is TxnState.ABORTED:
            break
        await asyncio.sleep(0.05)
    assert state is TxnState.ABORTED
    await b.stop()
    await a.stop()


async def test_decision_events_are_retried_after_a_failed_publication():
    class FailBatch(MemoryStore):
        failures = 0

        async def write_batch(self, ops):
            if self.failures:
                self.failures -= 1
                raise StoreUnavailableError("events lost")
            return await super().write_batch(ops)

    store = FailBatch()
    tc = coordinator(store, "pulsar://a:1", partitions=1)
    await tc.start()
    await tc.wait_recovered()  # the takeover's own pass over owed events is over: only the sweeper writes
    p = tc.partition(0)
    least = await p.new_txn(60_000, None)
    op = layout.TxnOp(layout.OpKind.WRITE, "seg", 1, 1)
    await store.put_sequential(layout.op_prefix(0, least), op.to_json(), partition_key=layout.txn_key(0, least),
                               secondary_indexes=op.index_entries(0, least))
    store.failures = 1
    with pytest.raises(StoreUnavailableError):
        await p.end_txn(least, commit=True, principal=None)
    events: list[Record] = []

    async def published():
        events[:] = [r async for r in store.scan_prefix(layout.SEGMENT_EVENTS_PREFIX)]
        return bool(events)

    await async_wait_for(published)
    assert len(events) == 1
    await tc.stop()


def test_unreadable_header_fields_are_value_errors():
    with pytest.raises(ValueError, match="malformed"):
        layout.TxnHeader.from_json(b'{"state":"OPEN","createdMs":1,"timeoutMs":1,"finalizedMs":[]}')


async def stepped_down_and_led_again(tc, old):
    """Our leader record is deleted under us (an Oxia session expired, another instance released it):
    the partition ``old`` stops, the record is taken again and a new partition recovers."""
    await tc.store.delete(layout.leader_path(old.tc_id))
    assert await async_wait_for(lambda: tc.leads(old.tc_id) and tc.partition(old.tc_id) is not old)
    await tc.wait_recovered()
    return tc.partition(old.tc_id)


async def test_new_txn_landing_after_its_partition_stepped_down_is_not_handed_out():
    # The next leader scanned before the header landed: it does not track the txn, so the low watermark
    # it sends may pass it. The client must therefore not get the id (it retries at the next leader);
    # the header stays OPEN with no one using it, and is aborted once overdue.
    store = GatedStore()
    tc = coordinator_with_sender(store, RecordingSender(), partitions=1, clock=FakeClock())
    await tc.start()
    await tc.wait_recovered()
    old = tc.partition(0)
    store.gate.clear()
    request = asyncio.create_task(old.new_txn(60_000, None))
    assert await async_wait_for(lambda: bool(old.open_txns()))  # its header write is in flight
    new = await stepped_down_and_led_again(tc, old)
    store.gate.set()
    with pytest.raises(CoordinatorNotFound,
                       match="stepped down on this instance while the header of .* was being written"):
        await request
    assert await new.new_txn(60_000, None) > 0  # the retry, at the new leader: a fresh id
    await tc.stop()


@pytest.mark.parametrize("requests", [1, 2], ids=["the-decision", "and-a-retry-queued-behind-it"])
async def test_decision_landing_after_its_partition_stepped_down_is_delivered_on_the_retry(requests: int):
    # The END_TXN (and with 2 the client's retry, queued behind its CAS) reaches the leader; it steps down
    # and the next leader recovers the txn as OPEN, before the CAS landed. The decision lands: its request
    # is answered CoordinatorNotFound. The retry then read COMMITTED and was answered success by the stopped
    # partition: the client did not retry, and the new leader told the broker only at the txn's deadline.
    store = GatedStore()
    sender = RecordingSender()
    tc = coordinator_with_sender(store, sender, partitions=1, clock=FakeClock())
    await tc.start()
    await tc.wait_recovered()
    old = tc.partition(0)
    least = await old.new_txn(3_600_000, None)
    await old.add_participants(least, None, [Participant(TOPIC)])
    store.gate.clear()
    ending = []
    for _ in range(requests):
        ending.append(asyncio.create_task(old.end_txn(least, commit=True, principal=None)))
        await asyncio.sleep(0.01)  # its CAS is in flight
    new = await stepped_down_and_led_again(tc, old)
    assert least in new.open_txns()  # recovered as OPEN: the CAS had not landed
    store.gate.set()
    for request in ending:
        with pytest.raises(CoordinatorNotFound, match="stepped down on this instance while the decision of"):
            await request
    assert (await header(store, 0, least)).state is TxnState.COMMITTED
    # The client's retry reaches the new leader, which finds the decision and delivers it.
    delivery = await new.end_txn(least, commit=True, principal=None)
    if delivery is not None:
        await delivery
    assert [(t.least, t.committed) for t in sender.told] == [(least, True)]
    assert least not in new.open_txns()
    await tc.stop()


@pytest.mark.parametrize("turns", range(4))
async def test_no_id_block_is_reserved_after_the_partition_stopped(turns: int):
    # NEW_TXNs waiting for a block resume as the partition stops: the first of them to take past half
    # the block started the next block's reservation after stop() had closed the allocator, a task
    # nothing cancelled, writing the sequence record for a coordinator this instance no longer leads.
    store = StallIdBlocks()
    first = await seed_sequence(store, 0)  # the first block is [first, first + 4)
    partition = CoordinatorPartition(0, store, PartitionConfig(id_block_size=4), Metrics("ids_after_stop"),
                                     FakeClock(), sweep_timeouts=False)
    store.gate.clear()
    waiting = [asyncio.create_task(partition.new_txn(60_000, None)) for _ in range(3)]
    assert await async_wait_for(lambda: partition._ids._refill is not None)
    store.gate.set()
    for _ in range(turns):
        await asyncio.sleep(0)
    await partition.stop()
    await asyncio.gather(*waiting, return_exceptions=True)
    await asyncio.sleep(0.05)
    sequence = await store.get(layout.tc_seq_path(0))
    # The block they waited for (unless stop() cancelled its reservation first), and no more.
    assert sequence is not None and layout.parse_tc_seq(sequence.value) in (first, first + 4)


class PagedDeadlineScan(MemoryStore):
    """Reads a whole page of the deadline index, then hands it out once ``hold`` is set (as Oxia's
    pages do: what the page says may be older than what a request meanwhile did)."""

    hold: asyncio.Event | None = None
    read: asyncio.Event | None = None  # set once a page was read

    def scan_index(self, index_name: str, start_inclusive: str, end_exclusive: str, *,
                   partition_key: str | None = None) -> AsyncIterator[Record]:
        inner = super().scan_index(index_name, start_inclusive, end_exclusive, partition_key=partition_key)
        hold, read = self.hold, self.read
        if index_name != layout.IDX_TXN_BY_DEADLINE or hold is None or read is None:
            return inner

        async def paged() -> AsyncIterator[Record]:
            page = [record async for record in inner]
            read.set()
            await hold.wait()
            for record in page:
                yield record
        return paged()


async def test_txn_ended_while_the_recovery_scan_was_in_flight_stays_ended():
    backend = MemoryBackend()
    config = CoordinatorConfig(partitions=1, timeout_sweep=False,
                               partition=PartitionConfig(id_block_size=10, max_open_txns_per_principal=1))
    clock = FakeClock()
    first = TransactionCoordinator(MemoryStore(backend), config, Metrics("a"), clock)
    await first.start()
    await first.wait_recovered()
    least = await first.partition(0).new_txn(3_600_000, "alice")
    await first.stop()
    store = PagedDeadlineScan(backend)
    store.hold, store.read = asyncio.Event(), asyncio.Event()
    second = TransactionCoordinator(store, config, Metrics("b"), clock)
    await second.start()
    await store.read.wait()  # the recovery scan read the txn as OPEN, and has not adopted it yet
    await second.partition(0).end_txn(least, commit=True, principal="alice")  # served before recovery landed
    store.hold.set()
    await second.wait_recovered()
    assert least not in second.partition(0).open_txns()
    # alice's one open transaction ended: her next one is not refused by a count the scan brought back.
    await second.partition(0).new_txn(60_000, "alice")
    with pytest.raises(NotAllowed):
        await second.partition(0).new_txn(60_000, "alice")
    await second.stop()


class LoseLeaderReply(MemoryStore):
    """The first leader record created is applied, and its answer lost."""

    lose = True

    async def put(self, key, value, **kwargs):
        record = await super().put(key, value, **kwargs)
        if self.lose and key.startswith(layout.LEADER_PREFIX):
            self.lose = False
            raise StoreUnavailableError("reply lost")
        return record


async def test_leader_record_with_lost_reply_at_start_does_not_fail_the_start():
    store = LoseLeaderReply()
    tc = coordinator(store, "pulsar://a:1", partitions=2)
    await tc.start()  # the first campaign's store error is the recheck's to retry
    assert await async_wait_for(lambda: tc.leads(0) and tc.leads(1))
    await tc.stop()


class FailIdBlockOnce(MemoryStore):
    fail = False

    async def put(self, key, value, **kwargs):
        if self.fail and key.startswith(layout.TC_SEQ_PREFIX):
            self.fail = False
            raise StoreUnavailableError("id block reservation failed")
        return await super().put(key, value, **kwargs)


async def test_an_id_reservation_that_failed_earlier_fails_no_request_after_one_succeeded():
    store = FailIdBlockOnce()
    first = await seed_sequence(store, 0)
    ids = IdAllocator(store, 0, 2, FakeClock())
    assert await ids.next_id() == first  # block [first, first + 2); the prefetch of the next one fails
    store.fail = True
    assert await ids.next_id() == first + 1
    assert await async_wait_for(lambda: ids._refill is None)
    # Two requests now: one reservation serves them both (a block of 2), the old failure neither.
    assert sorted(await asyncio.gather(ids.next_id(), ids.next_id())) == [first + 2, first + 3]
    await ids.close()


class FailEvents(MemoryStore):
    """Decision events (the sequential puts under a segment's events) fail while ``failing``, after
    waiting for ``gate``: a store that cannot write them, or writes them slowly."""

    failing = False

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def write_batch(self, ops: Any) -> Any:
        if any(getattr(op, "sequential", False) and "-events/" in op.key for op in ops):
            await self.gate.wait()
            if self.failing:
                raise StoreUnavailableError("event write failed")
        return await super().write_batch(ops)


async def write_v5_op(store: MemoryStore, least: int) -> None:
    """What a Pulsar 5 participant writes when a txn sends to its segment: an op record."""
    op = TxnOp(OpKind.WRITE, "segment://public/default/orders/0", 1, 1)
    await store.put_sequential(layout.op_prefix(0, least), op.to_json(), partition_key=layout.txn_key(0, least),
                               secondary_indexes=op.index_entries(0, least))


async def decision_events(store: MemoryStore) -> list[bytes]:
    return [record.value async for record in store.scan_prefix(layout.SEGMENT_EVENTS_PREFIX)]




async def committed_without_events(store: FailEvents, partition: CoordinatorPartition,
                                   participants: tuple[Participant, ...] = ()) -> int:
    """A txn with a v5 op (and ``participants``) whose COMMIT landed but whose events failed: END_TXN
    answered an error. The store writes events again afterwards."""
    least = await partition.new_txn(60_000, None)
    if participants:
        await partition.add_participants(least, None, participants)
    await write_v5_op(store, least)
    store.failing = True
    with pytest.raises(StoreUnavailableError):
        await partition.end_txn(least, commit=True, principal=None)
    store.failing = False
    return least


async def test_events_a_stepping_down_partition_still_owes_are_written_as_it_stops():
    # The list of decisions whose events failed lives in the partition: they are written once more as
    # the partition stops, so a v5 participant does not wait for the next leader's takeover.
    store = FailEvents()
    tc = await started(store)
    old = tc.partition(0)
    least = await committed_without_events(store, old)
    await old.stop()  # as it steps down (the next leader would write them too: this is the stop's own)
    assert await decision_events(store) == [f'{{"txnId":"0_{least}","decision":"COMMITTED"}}'.encode()]
    await tc.stop()


async def test_a_timeout_abort_cancelled_between_its_cas_and_its_events_still_writes_them():
    store = FailEvents()
    tc = await started(store)
    old = tc.partition(0)
    least = await old.new_txn(300, None)
    await write_v5_op(store, least)
    store.gate.clear()  # the events are slow: the sweeper's abort waits on them after its CAS
    assert await async_wait_for(lambda: least not in old.open_txns())
    stopping = asyncio.create_task(old.stop())  # as it steps down: cancels the sweeper mid-publish
    await asyncio.sleep(0.1)
    store.gate.set()
    await stopping
    assert await decision_events(store) == [f'{{"txnId":"0_{least}","decision":"ABORTED"}}'.encode()]
    await tc.stop()


async def test_a_repeated_end_txn_whose_events_fail_is_retried_by_the_sweeper():
    store = FailEvents()
    tc = await started(store)
    partition = tc.partition(0)
    least = await committed_without_events(store, partition)
    partition._unpublished.clear()  # as at a next leader, which never saw the first failure
    store.failing = True
    with pytest.raises(StoreUnavailableError):
        await partition.end_txn(least, commit=True, principal=None)  # the client's retry fails too
    store.failing = False
    assert await async_wait_for(lambda: not partition._unpublished)
    assert await decision_events(store) == [f'{{"txnId":"0_{least}","decision":"COMMITTED"}}'.encode()]
    await tc.stop()


async def test_the_next_leader_writes_at_once_the_events_a_crashed_leader_owed():
    """A leader that dies between a decision's CAS and its events (kill -9: its list of what it owes is
    gone, and it never stops) leaves Pulsar 5's participants waiting: they re-read headers only on an
    event. The next leader writes the events as it takes the coordinator over, for a commit (whose
    client may never retry) and a timeout abort alike, not GC a retention later."""
    store = FailEvents()
    clock = FakeClock()
    tc = await started(store, clock)
    old = tc.partition(0)
    committed = await committed_without_events(store, old)
    timed_out = await old.new_txn(1_000, None)
    await write_v5_op(store, timed_out)
    still_open = await old.new_txn(60_000, None)
    await write_v5_op(store, still_open)
    clock.now += 1_500
    store.failing = True
    await old.expire(timed_out)  # the timeout sweep's abort: its CAS lands, its events fail (logged, kept)
    store.failing = False
    assert (await header(store, 0, timed_out)).state is TxnState.ABORTED
    assert await decision_events(store) == []
    old._unpublished.clear()  # as after a crash: what the dead leader owed was in its memory only
    new = await stepped_down_and_led_again(tc, old)
    expected = sorted([f'{{"txnId":"0_{committed}","decision":"COMMITTED"}}'.encode(),
                       f'{{"txnId":"0_{timed_out}","decision":"ABORTED"}}'.encode()])  # none for the open txn
    written: list[bytes] = []

    async def all_written() -> bool:
        written[:] = sorted(await decision_events(store))
        return written == expected

    await async_wait_for(all_written)
    assert written == expected
    assert still_open in new.open_txns()
    await tc.stop()


class FailOpsScanOnce(FailEvents):
    """The first coordinator-wide scan of idx:ops-by-txn fails (the next leader's look for owed events)."""

    failed = False
    deadline_scans = 0  # the recovery's scans of the open txns

    def scan_index(self, index_name: str, start_inclusive: str, end_exclusive: str, *,
                   partition_key: str | None = None) -> AsyncIterator[Record]:
        self.deadline_scans += index_name == layout.IDX_TXN_BY_DEADLINE
        if index_name == layout.IDX_OPS_BY_TXN and partition_key is None and not self.failed:
            self.failed = True

            async def failing() -> AsyncIterator[Record]:
                raise StoreUnavailableError("scan failed")
                yield  # an async generator

            return failing()
        return super().scan_index(index_name, start_inclusive, end_exclusive, partition_key=partition_key)


async def test_owed_events_are_retried_on_their_own_when_their_scan_fails():
    """Not by sending the coordinator through recovery again: the deadline scan runs once."""
    store = FailOpsScanOnce()
    store.failed = True  # not the first leader's look
    clock = FakeClock()
    tc = await started(store, clock)
    one_recovery = store.deadline_scans
    old = tc.partition(0)
    committed = await committed_without_events(store, old)
    old._unpublished.clear()  # as after a crash
    store.failed = False
    new = await stepped_down_and_led_again(tc, old)
    assert store.failed
    assert await async_wait_for(lambda: new._owed_events is not None and new._owed_events.done())
    assert await decision_events(store) == [f'{{"txnId":"0_{committed}","decision":"COMMITTED"}}'.encode()]
    assert store.deadline_scans == 2 * one_recovery
    await tc.stop()


async def test_gc_writes_the_events_of_a_txn_whose_todays_brokers_have_not_all_heard():
    # A txn with a classic participant (no upstream here: its records stay) and a v5 op: GC keeps its
    # header for the records, but writes the v5 events all the same.
    store = FailEvents()
    clock = FakeClock()
    tc = await started(store, clock)
    partition = tc.partition(0)
    least = await committed_without_events(store, partition, (Participant(TOPIC),))
    partition._unpublished.clear()  # as after a crash: only GC is left
    clock.now += 901_000
    await tc.collect_garbage_now()
    assert await decision_events(store) == [f'{{"txnId":"0_{least}","decision":"COMMITTED"}}'.encode()]
    assert (await header(store, 0, least)).state is TxnState.COMMITTED  # kept for its participant records
    await tc.stop()


class StalledWriter(MemoryStore):
    """Every write waits, in arrival order, for the gate, and lands even when its caller gave up: the
    embedded store's writer process stalled (what a request timeout cannot take back)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self._tail: asyncio.Future[Any] | None = None

    def _in_order(self, write: Callable[[], Awaitable[_T]]) -> Awaitable[_T]:
        before = self._tail

        async def run() -> _T:
            if before is not None:
                await asyncio.gather(before, return_exceptions=True)
            await self.gate.wait()
            return await write()

        task = asyncio.ensure_future(run())
        self._tail = task
        return asyncio.shield(task)

    def landed(self) -> bool:
        """Whether every write made so far has been applied."""
        return self._tail is None or self._tail.done()

    async def _put_record(self, op):
        return await self._in_order(lambda: MemoryStore._put_record(self, op))

    async def write_batch(self, ops):
        return await self._in_order(lambda: MemoryStore.write_batch(self, ops))


async def commit_of_unknown_outcome(store: StalledWriter, partition: CoordinatorPartition) -> int:
    """A txn with one participant whose COMMIT is queued behind the stalled writer, its request's deadline
    (--request-timeout-s) passed: the outcome is unknown to the partition. Returns its id."""
    least = await partition.new_txn(60_000, None)
    await partition.add_participants(least, None, [Participant(TOPIC)])
    store.gate.clear()  # the writer stalls
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(partition.end_txn(least, commit=True, principal=None), 0.1)
    return least


async def test_an_add_whose_record_lands_after_the_decision_is_refused() -> None:
    # An END_TXN whose decision write outlives its request deadline (a writer stalled behind a slow fsync,
    # or stopped) lands later; an ADD that read the header before then must not be answered success once
    # the decision is on disk (docs/semantics.md §3). Found during a kill -9 torture run's review; a real
    # process showed it with its writer stopped (SIGSTOP).
    store = StalledWriter()
    sender = RecordingSender()
    async with led(store, sender) as tc:
        partition = tc.partition(0)
        least = await commit_of_unknown_outcome(store, partition)
        # The same txn's ADD reads the header (still OPEN on disk) and queues its record behind the CAS.
        add = asyncio.ensure_future(partition.add_participants(least, None, [Participant(OTHER)]))
        await asyncio.sleep(0.05)
        store.gate.set()  # the writer goes on: the decision lands first, then the ADD's record
        outcome = (await asyncio.gather(add, return_exceptions=True))[0]
        assert (await header(store, 0, least)).state is TxnState.COMMITTED
        # The ADD was acknowledged after the COMMIT was durable: it must be refused instead.
        assert isinstance(outcome, InvalidTxnStatus), f"ADD answered {outcome!r} on a txn already COMMITTED"
        # Both participants still hear the commit (the refused ADD's record was written all the same).
        assert await async_wait_for(lambda: {t.participant.topic for t in sender.told} == {TOPIC, OTHER})
        assert {(t.participant.topic, t.committed) for t in sender.told} == {(TOPIC, True), (OTHER, True)}


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.header_gets = 0

    async def get(self, key, *, partition_key=None):
        if key.startswith(layout.HEADER_PREFIX):
            self.header_gets += 1
        return await super().get(key, partition_key=partition_key)


async def test_an_add_on_a_recovered_txn_reads_its_header_once() -> None:
    # The re-read above is for txns whose decision had an unknown outcome only: recovered txns are never in
    # the header cache, and re-reading for every ADD of theirs cost a store round trip each (found by review).
    store = CountingStore()
    async with led(store) as first:
        least = await first.partition(1).new_txn(600_000, None)
    # Another leader (or this one restarted) recovers the open txn from the store.
    async with led(store) as second:
        partition = second.partition(1)
        assert least in partition.open_txns()
        per_add = []
        for i in range(5):
            before = store.header_gets
            await partition.add_participants(least, None, [Participant(f"persistent://public/default/t-partition-{i}")])
            per_add.append(store.header_gets - before)
        assert per_add == [1] * 5, f"header reads per ADD on a recovered txn: {per_add}"


FROZEN_PARTITIONS = 8


class FrozenStore(MemoryStore):
    """Every read and write waits for the gate once it is closed: a store that does not answer.
    ``waiting``: how many calls wait at the gate now."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0

    async def _pass(self) -> None:
        self.waiting += 1
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1

    async def get(self, key, *, partition_key=None):
        await self._pass()
        return await super().get(key, partition_key=partition_key)

    async def _put_record(self, op):
        await self._pass()
        return await super()._put_record(op)

    async def write_batch(self, ops):
        await self._pass()
        return await super().write_batch(ops)

    def scan_prefix(self, prefix, *, partition_key=None):
        inner = super().scan_prefix(prefix, partition_key=partition_key)

        async def frozen():
            await self._pass()
            async for record in inner:
                yield record
        return frozen()

    def scan_index(self, *args, **kwargs):
        inner = super().scan_index(*args, **kwargs)

        async def frozen():
            await self._pass()
            async for record in inner:
                yield record
        return frozen()


async def test_a_stop_on_a_frozen_store_stops_every_partition_at_once() -> None:
    # Each partition's stop gives its unpublished decisions STOP_PUBLISH_TIMEOUT_S; one partition after the
    # other, 16 coordinators made a stop on a store that does not answer last 16 times that (found by
    # review). They stop together: every partition's last try waits at the gate at the same time.
    store = FrozenStore()
    tc = coordinator_with_sender(store, partitions=FROZEN_PARTITIONS)
    await tc.start()
    await tc.wait_recovered()
    for tc_id in range(FROZEN_PARTITIONS):
        # A decision whose events were not written when the store froze: partition._publish keeps it for stop().
        tc.partition(tc_id)._unpublished[1] = TxnState.COMMITTED
    store.gate.clear()  # the store stops answering
    stopping = asyncio.ensure_future(tc.stop())
    try:
        await async_wait_for(lambda: store.waiting >= FROZEN_PARTITIONS, "every frozen partition's write waiting")
    finally:
        store.gate.set()
        await asyncio.wait_for(stopping, 60)


async def test_a_decision_landing_after_the_early_look_is_delivered_before_the_deadline() -> None:
    # The decision's write outlives its request and the sweep's look 1 s later (the header still OPEN on
    # the store: the write is queued behind a stalled writer). Found by a crash-torture run with the writer
    # SIGSTOPped: the txn went back to its deadline, and its brokers heard of the landed commit only then.
    store = StalledWriter()
    sender = RecordingSender()
    clock = FakeClock()
    async with led(store, sender, clock=clock) as tc:
        least = await commit_of_unknown_outcome(store, tc.partition(0))
        clock.now += TIMEOUT_RETRY_MS  # the early look: the header is still OPEN on the store
        await tc.abort_expired_now()
        store.gate.set()  # the writer goes on: the COMMIT lands, and no client asks again
        assert await async_wait_for(lambda: store.landed())
        for _ in range(10):  # ten seconds of sweeps, far before the txn's 60 s deadline
            clock.now += TIMEOUT_RETRY_MS
            await tc.abort_expired_now()
        assert await async_wait_for(lambda: bool(sender.told))
        assert [(t.least, t.committed) for t in sender.told] == [(least, True)]


class ShardDown(MemoryStore):
    """Reads of the key ``down`` fail: the Oxia shard holding it is unavailable."""

    down: str | None = None

    async def get(self, key: str, **kw: Any) -> Any:
        if key == self.down:
            raise StoreUnavailableError("the shard of this key is unavailable")
        return await super().get(key, **kw)


async def test_a_coordinator_left_by_its_leader_is_taken_while_another_ones_record_cannot_be_read():
    # The periodic recheck was one try for every coordinator: the first whose leader record could not be
    # read ended the pass, and a coordinator after it whose leader had left was never taken.
    backend = MemoryBackend()
    down, other = ShardDown(backend), MemoryStore(backend)
    a = coordinator(down, "pulsar://a:1", partitions=2)
    b = coordinator(other, "pulsar://b:1", partitions=2)
    await a.start()
    await b.start()
    try:
        assert await async_wait_for(lambda: len(a._election.led) == 1 and len(b._election.led) == 1)
        (a_led,) = a._election.led
        down.down = layout.leader_path(a_led)
        await b.stop()
        await other.close()
        await async_wait_for(lambda: a.leads(1 - a_led), "a leader of the coordinator B left")
    finally:
        down.down = None
        await a.stop()


async def test_events_owed_by_a_crashed_leader_are_written_whatever_one_op_record_holds():
    # A new leader writes again the events a crashed one owed, txn by txn in id order: an op record that
    # names no segment made the first txn's publication fail as if the store were down, and the whole scan
    # started over, for good, before the next txn's events.
    store = FailEvents()
    tc = await started(store, FakeClock())
    old = tc.partition(0)
    bad = await old.new_txn(60_000, None)
    await store.put_sequential(layout.op_prefix(0, bad), b'{"kind":"WRITE","segment":"","ledgerId":1,"entryId":1}',
                               partition_key=layout.txn_key(0, bad),
                               secondary_indexes={layout.IDX_OPS_BY_TXN: layout.ops_by_txn_index_key(0, bad)})
    await old.end_txn(bad, commit=True, principal=None)
    good = await old.new_txn(60_000, None)
    await write_v5_op(store, good)
    store.failing = True
    with pytest.raises(StoreUnavailableError):
        await old.end_txn(good, commit=True, principal=None)
    store.failing = False
    old._unpublished.clear()  # as after a kill -9 between the CAS and the events
    await stepped_down_and_led_again(tc, old)
    expected = [f'{{"txnId":"0_{good}","decision":"COMMITTED"}}'.encode()]
    try:
        async def decided() -> bool:
            return await decision_events(store) == expected

        await async_wait_for(decided, "the good txn's decision event")
    finally:
        await tc.stop()


class GatedLeaderCreates(MemoryStore):
    """Creates of leader records wait for ``gate``: a campaign whose create is in flight."""

    def __init__(self, backend: MemoryBackend) -> None:
        super().__init__(backend)
        self.gate = asyncio.Event()
        self.gate.set()

    async def put(self, key: str, value: bytes, **kwargs: Any) -> Record:
        if key.startswith(layout.LEADER_PREFIX):
            await self.gate.wait()
        return await super().put(key, value, **kwargs)


async def test_a_coordinator_won_as_the_instance_stops_leaves_no_recovery_running(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # stop() cancelled the recovery task it found, then waited for the others while the election still ran:
    # a coordinator won meanwhile started a new recovery, which outlived the stop and scanned the closed store
    # every second, failing, for good (a review).
    monkeypatch.setattr(leadership, "RECHECK_INTERVAL_S", 0.05)
    backend = MemoryBackend()
    a_store, b_store = GatedLeaderCreates(backend), MemoryStore(backend)

    def config(url: str) -> CoordinatorConfig:
        return CoordinatorConfig(partitions=2, advertised_url=url, partition=PartitionConfig(id_block_size=10))

    b = TransactionCoordinator(b_store, config("pulsar://b:2"), Metrics("b"), FakeClock())
    await b.start()
    a = TransactionCoordinator(a_store, config("pulsar://a:1"), Metrics("a"), FakeClock())
    await a.start()
    await a.wait_recovered()
    assert await async_wait_for(lambda: len(a.led_partitions()) == 1 and len(b.led_partitions()) == 1)
    a_store.gate.clear()
    await b.stop()  # B leaves: A campaigns for B's coordinator, its create held
    await b_store.close()
    await asyncio.sleep(0.2)
    stopping = asyncio.create_task(a.stop())
    await asyncio.sleep(0)  # stop() is waiting for its first task
    a_store.gate.set()  # the create lands: A wins during its stop
    await stopping
    assert a._recovery_task is None or a._recovery_task.done()
    await a_store.close()


class NeverAcknowledges:
    """Participant brokers that never answer."""

    async def end_txn_on(self, *args: Any, **kwargs: Any) -> None:
        await asyncio.Event().wait()

    async def remind_txn_on(self, *args: Any, **kwargs: Any) -> bool:
        return False


async def test_a_stop_during_a_step_down_still_stops_the_partition_to_the_end() -> None:
    # The stop cancelled the election's task that was stopping the coordinator it had lost (already out of the
    # coordinator's map): that partition's deliveries ran on after stop() returned, its END_TXNs waited, its
    # outbox stayed counted (a review).
    store = FailEvents()
    config = CoordinatorConfig(partitions=1, timeout_sweep=False, partition=PartitionConfig(id_block_size=10))
    tc = TransactionCoordinator(store, config, Metrics("t"), FakeClock(), participant_sender=NeverAcknowledges())
    await tc.start()
    await tc.wait_recovered()
    old = tc.partition(0)
    least = await old.new_txn(60_000, None)
    await old.add_participants(least, None, [Participant(TOPIC)])
    delivered = await old.end_txn(least, commit=True, principal=None)  # its brokers not told yet
    assert delivered is not None
    await committed_without_events(store, old)  # one decision owes its events: the partition's stop writes them
    store.gate.clear()  # slowly
    await store.delete(layout.leader_path(0))  # the leader record goes (an Oxia session expired)
    assert await async_wait_for(lambda: not tc.leads(0))  # the step-down is under way, writing the events
    stopping = asyncio.create_task(tc.stop())  # SIGTERM meanwhile
    await asyncio.sleep(0.1)
    store.gate.set()
    await stopping
    outbox = old._undelivered.get(least)
    assert delivered.done() and (outbox is None or not outbox.tasks)
    assert old._undelivered not in tc.outboxes
    await store.close()
