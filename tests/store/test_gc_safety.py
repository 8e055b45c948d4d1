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

from collections.abc import Mapping

import pytest

from tc_server.coordinator import layout
from tc_server.coordinator.layout import OpKind, TxnHeader, TxnOp, TxnState
from tc_server.coordinator.sweeps import collect_garbage
from tc_server.metrics import Metrics
from tc_server.store.api import MetadataStore

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
