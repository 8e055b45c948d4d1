"""GC never deletes a header while an op record of its txn exists (docs/record-layout.md, "GC never
deletes a header that has op records"), on every store the conformance suite runs on.

The data loss this guards against was measured with a real Pulsar 5 broker: its participant indexed
its op records under ``/txn/op/<txn>``, tc-server looked them up under ``<txn>``, found none, and GC
deleted the COMMITTED header; after a restart the participant found ops without a header, treated the
txn as ABORTED, and the committed messages were never delivered. Here op records are planted as a
participant writes them, with Pulsar's index keys, with a key form the index lookup does not match,
and with no index entry at all: in every case GC must keep the header and publish the decision again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from tc_server.coordinator import layout
from tc_server.coordinator.layout import OpKind, Participant, TxnHeader, TxnOp, TxnState
from tc_server.coordinator.sweeps import GC_PAGE, collect_garbage
from tc_server.metrics import Metrics
from tc_server.store.api import Delete, MetadataStore, Put, WriteResult

SEGMENT = "segment://public/default/orders/0"
CREATED_MS = 1_795_447_209_230
FINALIZED_MS = CREATED_MS + 1_000
RETENTION_S = 900
AFTER_RETENTION_MS = FINALIZED_MS + RETENTION_S * 1000 + 1


async def put_header(store: MetadataStore, most: int, least: int, state: TxnState) -> None:
    header = TxnHeader(state, CREATED_MS, 60_000, finalized_ms=FINALIZED_MS)
    await store.put(layout.header_path(most, least), header.to_json(), partition_key=layout.txn_key(most, least),
                    secondary_indexes=header.index_entries())


def pulsar_index(op: TxnOp, most: int, least: int) -> Mapping[str, str]:
    return op.index_entries(most, least)


def bare_index(op: TxnOp, most: int, least: int) -> Mapping[str, str]:
    """An ops-by-txn key without the parent path (what tc-server used to look up): the lookup by
    Pulsar's key form does not see it."""
    return {layout.IDX_OPS_BY_TXN: layout.txn_key(most, least)}


def no_index(op: TxnOp, most: int, least: int) -> Mapping[str, str]:
    return {}


INDEX_FORMS = {"pulsar-index": pulsar_index, "bare-index": bare_index, "no-index": no_index}


async def put_op(store: MetadataStore, most: int, least: int, index_form: str) -> str:
    """An op record as a participant appends it: ``/txn/op/<txn>-<seq>``, partition key = txn key."""
    op = TxnOp(OpKind.WRITE, SEGMENT, 12, 3)
    record = await store.put_sequential(layout.op_prefix(most, least), op.to_json(),
                                        partition_key=layout.txn_key(most, least),
                                        secondary_indexes=INDEX_FORMS[index_form](op, most, least))
    return record.key


async def events(store: MetadataStore) -> list[bytes]:
    return [r.value async for r in store.scan_prefix(layout.segment_events_prefix(SEGMENT) + "-",
                                                     partition_key=layout.enc(SEGMENT))]


@pytest.mark.parametrize("index_form", sorted(INDEX_FORMS))
async def test_gc_keeps_a_committed_header_while_an_op_record_exists(store: MetadataStore, index_form: str) -> None:
    await put_header(store, 1, 0, TxnState.COMMITTED)
    op_key = await put_op(store, 1, 0, index_form)
    metrics = Metrics("gc-safety")

    result = await collect_garbage(store, metrics, AFTER_RETENTION_MS, RETENTION_S)

    header = await store.get(layout.header_path(1, 0), partition_key="1_0")
    assert header is not None, "GC deleted a COMMITTED header whose op record remains"
    assert TxnHeader.from_json(header.value).state is TxnState.COMMITTED
    assert (result.deleted, result.republished, result.outstanding_ops) == (0, 1, 1)
    # The decision is published again, where the participant reads it.
    assert await events(store) == [b'{"txnId":"1_0","decision":"COMMITTED"}']

    # Once the participant has applied the decision and removed its op record, the next pass deletes.
    assert await store.delete(op_key, partition_key="1_0")
    result = await collect_garbage(store, metrics, AFTER_RETENTION_MS, RETENTION_S)
    assert (result.deleted, result.republished) == (1, 0)
    assert await store.get(layout.header_path(1, 0), partition_key="1_0") is None


async def test_gc_keeps_an_aborted_header_with_an_unindexed_op_record(store: MetadataStore) -> None:
    await put_header(store, 2, 5, TxnState.ABORTED)
    await put_op(store, 2, 5, "no-index")
    result = await collect_garbage(store, Metrics("gc-safety"), AFTER_RETENTION_MS, RETENTION_S)
    assert (result.deleted, result.republished) == (0, 1)
    assert await store.get(layout.header_path(2, 5), partition_key="2_5") is not None
    assert await events(store) == [b'{"txnId":"2_5","decision":"ABORTED"}']


async def test_gc_range_check_is_the_txns_own(store: MetadataStore) -> None:
    # 1_1's op key range "/txn/op/1_1-" must not take in 1_10's op records (nor the other way round):
    # 1_1 has none and goes, 1_10 keeps its header.
    await put_header(store, 1, 1, TxnState.COMMITTED)
    await put_header(store, 1, 10, TxnState.COMMITTED)
    await put_op(store, 1, 10, "no-index")
    result = await collect_garbage(store, Metrics("gc-safety"), AFTER_RETENTION_MS, RETENTION_S)
    assert (result.deleted, result.republished) == (1, 1)
    assert await store.get(layout.header_path(1, 1), partition_key="1_1") is None
    assert await store.get(layout.header_path(1, 10), partition_key="1_10") is not None


async def test_gc_waits_for_the_retention(store: MetadataStore) -> None:
    await put_header(store, 3, 0, TxnState.COMMITTED)
    result = await collect_garbage(store, Metrics("gc-safety"), FINALIZED_MS + 1000, RETENTION_S)
    assert (result.deleted, result.republished) == (0, 0)
    assert await store.get(layout.header_path(3, 0), partition_key="3_0") is not None


# -- GC handles its candidates a page at a time (sweeps.GC_PAGE): one participants-index scan per
# coordinator, one op-record check, one write_batch of deletes per page. These cases sit on the edges.


async def put_participant(store: MetadataStore, most: int, least: int) -> None:
    """A participant record as ADD_PARTITION_TO_TXN writes it (partition.py), index entry included."""
    participant = Participant("persistent://public/default/orders-partition-0")
    await store.put(participant.path(most, least), participant.to_json(), partition_key=layout.txn_key(most, least),
                    secondary_indexes={layout.IDX_PARTICIPANTS_BY_COORDINATOR:
                                       layout.participants_by_coordinator_key(most, least)})


async def headers_left(store: MetadataStore, ids: list[tuple[int, int]]) -> set[tuple[int, int]]:
    return {(most, least) for most, least in ids
            if await store.get(layout.header_path(most, least), partition_key=layout.txn_key(most, least))}


async def test_gc_pages_keep_exactly_the_headers_with_participant_or_op_records(store: MetadataStore) -> None:
    # More candidates than one page, over two coordinators whose padded ids share no prefix trap (1
    # and 10): the kept txns sit on both sides of the first page boundary and at both ends of a
    # coordinator's id span, where the per-coordinator index range starts and ends.
    ids = [(1, least) for least in range(GC_PAGE + 20)] + [(10, least) for least in range(1, 40)]
    for most, least in ids:
        await put_header(store, most, least, TxnState.COMMITTED if least % 2 else TxnState.ABORTED)
    with_participants = [(1, 0), (1, GC_PAGE - 1), (1, GC_PAGE), (1, GC_PAGE + 19), (10, 1), (10, 39)]
    for most, least in with_participants:
        await put_participant(store, most, least)
    await put_participant(store, 10, 40)  # a txn that is no candidate (no header): changes nothing
    await put_op(store, 1, GC_PAGE + 1, "no-index")

    result = await collect_garbage(store, Metrics("gc-safety"), AFTER_RETENTION_MS, RETENTION_S)

    assert await headers_left(store, ids) == {*with_participants, (1, GC_PAGE + 1)}
    assert (result.deleted, result.undelivered, result.republished, result.outstanding_ops) == (
        len(ids) - len(with_participants) - 1, len(with_participants), 1, 1)


async def test_gc_keeps_a_header_that_changed_between_the_check_and_the_delete(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The deletes are conditional on the version GC scanned: a header written again after the scan
    # (here just before the page's write_batch reaches the store, as a concurrent writer would) stays,
    # and the rest of the batch still goes.
    for least in range(3):
        await put_header(store, 4, least, TxnState.COMMITTED)
    write_batch = store.write_batch

    async def header_rewritten_first(ops: Sequence[Put | Delete]) -> list[WriteResult]:
        monkeypatch.setattr(store, "write_batch", write_batch)
        await put_header(store, 4, 1, TxnState.COMMITTED)
        return await write_batch(ops)

    monkeypatch.setattr(store, "write_batch", header_rewritten_first)
    result = await collect_garbage(store, Metrics("gc-safety"), AFTER_RETENTION_MS, RETENTION_S)

    assert await headers_left(store, [(4, 0), (4, 1), (4, 2)]) == {(4, 1)}
    assert result.deleted == 2
    # The next pass sees the new version and collects it.
    result = await collect_garbage(store, Metrics("gc-safety"), AFTER_RETENTION_MS, RETENTION_S)
    assert (result.deleted, await headers_left(store, [(4, 1)])) == (1, set())


async def test_gc_keeps_every_header_of_a_page_when_an_op_record_is_indexed_only(store: MetadataStore) -> None:
    # An op record found only through Pulsar's ops-by-txn index key (its primary key outside the txn's
    # key range) still keeps its txn's header: the page falls back to each candidate's own checks.
    await put_header(store, 5, 1, TxnState.COMMITTED)
    await put_header(store, 5, 2, TxnState.COMMITTED)
    op = TxnOp(OpKind.WRITE, SEGMENT, 12, 3)
    await store.put("/txn/op/elsewhere-5_2", op.to_json(), partition_key="5_2",
                    secondary_indexes=op.index_entries(5, 2))
    result = await collect_garbage(store, Metrics("gc-safety"), AFTER_RETENTION_MS, RETENTION_S)
    assert await headers_left(store, [(5, 1), (5, 2)]) == {(5, 2)}
    assert (result.deleted, result.republished) == (1, 1)


async def test_the_ops_by_txn_range_of_a_coordinator_holds_its_op_records_only(store: MetadataStore) -> None:
    """What a next leader scans for the events a crashed leader owed (partition._publish_owed_events):
    coordinator 1's op records, with Pulsar's index keys, and none of coordinators 0, 10 or 11's, on every
    store (Oxia compares ``<secondary>\\x01<primary>``; coordinator 10's keys start ``/txn/op/10_``)."""
    mine = {await put_op(store, 1, least, "pulsar-index") for least in (0, 7, 123, -5)}
    for most in (0, 10, 11):
        await put_op(store, most, 7, "pulsar-index")
    start, end = layout.ops_by_txn_coordinator_range(1)
    found = [record.key async for record in store.scan_index(layout.IDX_OPS_BY_TXN, start, end)]
    assert sorted(found) == sorted(mine)
    assert sorted(layout.parse_op_key(key) for key in found) == [(1, -5), (1, 0), (1, 7), (1, 123)]


async def test_an_op_record_naming_no_segment_keeps_its_header_and_stops_nothing_else(store: MetadataStore) -> None:
    # A participant's op record with "segment": "" (the store's contents can be wrong) passed as readable;
    # its event put was refused (InvalidOperationError, a StoreError), and every GC pass ended at that
    # header as if the store were down: nothing after it was ever collected.
    await put_header(store, 0, 1, TxnState.COMMITTED)
    await store.put_sequential(layout.op_prefix(0, 1), b'{"kind":"WRITE","segment":"","ledgerId":1,"entryId":1}',
                               partition_key=layout.txn_key(0, 1),
                               secondary_indexes={layout.IDX_OPS_BY_TXN: layout.ops_by_txn_index_key(0, 1)})
    for least in range(2, 6):
        await put_header(store, 0, least, TxnState.COMMITTED)
    await collect_garbage(store, Metrics("gc-no-segment"), AFTER_RETENTION_MS, RETENTION_S)
    kept = [least for least in range(1, 6)
            if await store.get(layout.header_path(0, least), partition_key=layout.txn_key(0, least))]
    assert kept == [1]
