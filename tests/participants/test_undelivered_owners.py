"""A principal's undelivered decisions count toward it on every path that puts a decided txn in the outbox (a
review of the counting found two that did not: an END_TXN retried before recovery, and participant records
landing after another leader's decision), and leave its count exactly once (a drop by key)."""
from __future__ import annotations

import asyncio

import pytest

from tc_server.coordinator.layout import Participant
from tc_server.coordinator.partition import CoordinatorPartition, PartitionConfig
from tc_server.coordinator.principals import OpenByPrincipal
from tc_server.metrics import Metrics
from tc_server.store import open_store
from tests.coordinator.test_partition import FakeClock
from tests.support.waiting import async_wait_for

TOPIC = "persistent://public/default/t-partition-0"


def _partition(store, principals: OpenByPrincipal, clock: FakeClock, name: str) -> CoordinatorPartition:
    # No sender: a decision stays in the outbox (undelivered) with its records.
    return CoordinatorPartition(0, store, PartitionConfig(id_block_size=10, max_open_txns_per_principal=10),
                                Metrics(name), clock, sweep_timeouts=False, sender=None,
                                open_by_principal=principals)


async def _committed_undelivered(store, clock: FakeClock) -> int:
    first = OpenByPrincipal(10)
    previous = _partition(store, first, clock, "previous")
    await previous.recover_outbox()
    least = await previous.new_txn(60_000, "mallory")
    await previous.add_participants(least, "mallory", [Participant(TOPIC)])
    await previous.end_txn(least, commit=True, principal="mallory")
    assert first.owes("mallory")
    await previous.stop()
    assert not first.owes("mallory")
    return least


async def assert_owed_after_recovery(new: CoordinatorPartition, least: int, principals: OpenByPrincipal) -> None:
    """``new`` recovers its outbox: ``least`` is in it, and counted toward mallory, its owner."""
    await new.recover_outbox()
    assert least in new.undelivered()
    try:
        assert principals.owes("mallory"), "mallory's undelivered decision is counted toward no one"
    finally:
        await new.stop()


async def test_recovered_undelivered_decision_counts_toward_its_owner() -> None:
    """Control: recovered by the outbox scan, the decision counts toward the owner its header names."""
    store = await open_store("memory", data_dir="")
    clock = FakeClock()
    await _committed_undelivered(store, clock)
    principals = OpenByPrincipal(10)
    new = _partition(store, principals, clock, "new")
    await new.recover_outbox()
    assert principals.owes("mallory")
    await new.stop()
    assert not principals.owes("mallory")


async def test_end_txn_retry_before_recovery_still_counts_toward_its_owner() -> None:
    """An END_TXN retry (ALREADY) that reaches the new leader before its outbox scan starts the delivery itself
    (_delivered_early), and the scan then skips the txn: the outbox entry was made with no owner, so the owner's
    undelivered decision counted toward nothing (neither its per-principal limit nor owes())."""
    store = await open_store("memory", data_dir="")
    clock = FakeClock()
    least = await _committed_undelivered(store, clock)
    principals = OpenByPrincipal(10)
    new = _partition(store, principals, clock, "new")
    await new.end_txn(least, commit=True, principal="mallory")  # the client's retry, before recovery
    await assert_owed_after_recovery(new, least, principals)


async def test_unreadable_record_holds_and_its_drop_by_key_releases_the_owner_once() -> None:
    """A recovered decision with an unreadable participant record counts toward its owner until that record is
    dropped by key, then exactly once less."""
    from tc_server.coordinator.layout import TxnHeader, TxnState
    from tests.hostile.test_damaged_records import header_put, now_ms, participant_put
    from tests.participants.test_outbox import RecordingSender

    store = await open_store("memory", data_dir="")
    now = now_ms()
    header = TxnHeader(TxnState.ABORTED, now - 2000, 60_000, now - 1000, owner="mallory")
    good, bad = Participant(TOPIC), Participant("persistent://public/default/bad")
    await store.write_batch([header_put(0, 5, header.to_json(), final=(TxnState.ABORTED, now - 1000)),
                             participant_put(0, 5, good), participant_put(0, 5, bad, b'{"topic": 42}')])
    principals = OpenByPrincipal(10)
    sender = RecordingSender()
    partition = CoordinatorPartition(0, store, PartitionConfig(id_block_size=10), Metrics("x"), FakeClock(),
                                     sweep_timeouts=False, sender=sender, open_by_principal=principals)
    try:
        await partition.recover_outbox()
        await sender.first_told(100)
        await asyncio.sleep(0.1)
        assert 5 in partition.undelivered()
        assert principals._undelivered == {"mallory": 1}
        assert await partition.drop_participant(5, bad.path(0, 5)) == 0
        await async_wait_for(lambda: 5 not in partition.undelivered())
        assert 5 not in partition.undelivered()
        assert principals._undelivered == {}
    finally:
        await partition.stop()
    assert principals._undelivered == {}


class _DecideDuringRecordWrite:
    """The new leader's store: before its participant records land, the previous leader commits the txn."""

    def __init__(self, store, decide) -> None:
        self._store, self._decide = store, decide

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def write_batch(self, ops, *args, **kwargs):
        if self._decide is not None:
            decide, self._decide = self._decide, None
            await decide()
        return await self._store.write_batch(ops, *args, **kwargs)


async def test_records_landing_after_another_leaders_decision_count_toward_the_owner() -> None:
    """_record's "decided while these records were being written" path started the delivery with no owner, and
    the outbox scan then skips the txn: the owner's undelivered decision counted toward no one."""
    from tc_server.coordinator.errors import InvalidTxnStatus

    store = await open_store("memory", data_dir="")
    clock = FakeClock()
    old_principals = OpenByPrincipal(10)
    previous = _partition(store, old_principals, clock, "previous")
    await previous.recover_outbox()
    least = await previous.new_txn(60_000, "mallory")
    principals = OpenByPrincipal(10)
    new = _partition(store, principals, clock, "new")
    new._store = _DecideDuringRecordWrite(store, lambda: previous.end_txn(least, commit=True, principal="mallory"))
    with pytest.raises(InvalidTxnStatus):
        await new.add_participants(least, "mallory", [Participant(TOPIC)])
    await previous.stop()
    await assert_owed_after_recovery(new, least, principals)
