"""Recovery keeps only each open txn's deadline and owner (issue 15: 500,000 open txns after a kill -9 must
fit the memory limit); the header of a recovered txn is read from the store on its first request. Here a
new leader recovers a few thousand open txns and they are still served exactly as before: ended by their
owner (and only by their owner or a superuser), retried idempotently, aborted when their deadline passes,
refused once timed out, and counted per principal. Memory store, test-controlled clock."""

from __future__ import annotations

import pytest

from tc_server.coordinator.errors import InvalidTxnStatus, NotAllowed, TransactionNotFound
from tc_server.coordinator.layout import Participant, TxnState
from tc_server.store.memory import MemoryBackend, MemoryStore
from tests.coordinator.test_partition import FakeClock, header, make

PER_OWNER = 600  # per owner and timeout: 2,400 open txns over 4 coordinators
SHORT_MS, LONG_MS = 10_000, 3_600_000


async def test_recovered_open_txns_are_served_and_time_out_as_before() -> None:
    backend, clock = MemoryBackend(), FakeClock()
    store = MemoryStore(backend)
    first = make(store, clock, block=1000)
    await first.start()
    opened: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for owner in ("alice", "bob"):
        for timeout_ms in (SHORT_MS, LONG_MS):
            opened[(owner, timeout_ms)] = [
                (i % 4, await first.partition(i % 4).new_txn(timeout_ms, owner)) for i in range(PER_OWNER)]
    await first.stop()
    await store.close()

    store = MemoryStore(backend)
    second = make(store, clock, block=1000, max_open_txns_per_principal=2 * PER_OWNER + 1)
    await second.start()
    try:
        await second.wait_recovered()
        assert sum(p.open_count for p in second.led_partitions()) == 4 * PER_OWNER
        assert second.open_by_principal.snapshot() == {"alice": 2 * PER_OWNER, "bob": 2 * PER_OWNER}

        # Ended by its owner, read from the store on this first request; retried: the same answer.
        most, least = opened[("alice", LONG_MS)][0]
        partition = second.partition(most)
        with pytest.raises(TransactionNotFound):
            await partition.end_txn(least, commit=True, principal="bob")  # not the owner
        await partition.end_txn(least, commit=True, principal="alice")
        await partition.end_txn(least, commit=True, principal="alice")
        with pytest.raises(InvalidTxnStatus):
            await partition.end_txn(least, commit=False, principal="alice")
        assert (await header(store, most, least)).state is TxnState.COMMITTED
        most, least = opened[("bob", LONG_MS)][1]
        await second.partition(most).add_participants(least, "ops", [], superuser=True)  # a superuser may act on it
        await second.partition(most).end_txn(least, commit=False, principal="ops", superuser=True)
        assert (await header(store, most, least)).state is TxnState.ABORTED
        assert second.open_by_principal.snapshot() == {"alice": 2 * PER_OWNER - 1, "bob": 2 * PER_OWNER - 1}
        # alice has room for two more (limit 2 x PER_OWNER + 1), then is refused.
        for _ in range(2):
            await second.partition(0).new_txn(LONG_MS, "alice")
        with pytest.raises(NotAllowed, match="principal 'alice' has 1201 open transactions"):
            await second.partition(1).new_txn(LONG_MS, "alice")

        # Past the short deadline: the recovered deadline queue aborts exactly the short ones.
        clock.now += SHORT_MS
        assert await second.abort_expired_now() == 2 * PER_OWNER
        for owner in ("alice", "bob"):
            for most, least in opened[(owner, SHORT_MS)][::97]:
                assert (await header(store, most, least)).state is TxnState.ABORTED
            most, least = opened[(owner, SHORT_MS)][5]
            with pytest.raises(InvalidTxnStatus):  # timed out: an ADD or a commit is refused
                await second.partition(most).add_participants(least, owner, [Participant("persistent://t/n/x")])
            most, least = opened[(owner, LONG_MS)][5]
            assert (await header(store, most, least)).state is TxnState.OPEN
        assert second.open_by_principal.snapshot() == {"alice": PER_OWNER + 1, "bob": PER_OWNER - 1}

        # Past the long deadline, a commit of a recovered txn finds it expired and aborts it.
        clock.now += LONG_MS
        most, least = opened[("bob", LONG_MS)][7]
        with pytest.raises(TransactionNotFound, match="timed out"):
            await second.partition(most).end_txn(least, commit=True, principal="bob")
        assert (await header(store, most, least)).state is TxnState.ABORTED
    finally:
        await second.stop()
        await store.close()
    # Stepping down gave every count back: the next leader counts them.
    assert second.open_by_principal.snapshot() == {}


async def test_a_partition_that_stepped_down_counts_nothing_more() -> None:
    """A coordinator lost while the recovery scan streams into it (or while a NEW_TXN waits for an id)
    must not add to the counts its stop() handed back: they would never be released."""
    store = MemoryStore(MemoryBackend())
    tc = make(store, FakeClock(), max_open_txns_per_principal=10)
    await tc.start()
    try:
        await tc.wait_recovered()
        partition = tc.partition(2)
        await partition.new_txn(LONG_MS, "alice")
        assert tc.open_by_principal.snapshot() == {"alice": 1}
        await partition.stop()
        assert tc.open_by_principal.snapshot() == {}
        partition.adopt_one(123, FakeClock().now + LONG_MS, "alice")
        assert tc.open_by_principal.snapshot() == {}
    finally:
        await tc.stop()
        await store.close()
