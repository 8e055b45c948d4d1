"""Decision fan-out: after the header CAS, one event per distinct participant (docs/semantics.md §4).

Participants (``MetadataTransactionBuffer`` and the pending-ack store) subscribe to their own event
streams and re-read the header when an event arrives, so an event must never be written before the
CAS that decided it; writing one twice is harmless. Keys and values: docs/record-layout.md.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import structlog

from tc_server.coordinator import layout
from tc_server.coordinator.layout import OpKind, TxnOp, TxnState
from tc_server.metrics import LoopHistogramChild, Metrics
from tc_server.store.api import MetadataStore, Put, Record

log = structlog.get_logger("tc_server.coordinator")


@dataclass
class Participants:
    """What a txn's op records name: the distinct written segments, the distinct (segment,
    subscription) acks, and the keys of the op records themselves."""

    segments: set[str] = field(default_factory=set)
    subscriptions: set[tuple[str, str]] = field(default_factory=set)
    op_keys: set[str] = field(default_factory=set)

    def add(self, record: Record) -> None:
        if record.key in self.op_keys:
            return
        self.op_keys.add(record.key)
        try:
            op = TxnOp.from_json(record.value)
        except ValueError as exc:
            # A participant wrote something unreadable: it cannot learn the decision from us
            # either way, so say so loudly and still publish to the others. The record still
            # counts: GC must not delete the header under it.
            log.warning("unreadable op record", key=record.key, error=str(exc))
            return
        if not op.segment:
            # No event stream to write to (its put would be refused, and every publication with it, GC's
            # and a new leader's included, failed as if the store were down): as unreadable, it counts.
            log.warning("unreadable op record", key=record.key, error="it names no segment")
            return
        if op.kind is OpKind.WRITE:
            self.segments.add(op.segment)
        elif op.subscription is not None:
            self.subscriptions.add((op.segment, op.subscription))


@functools.lru_cache(maxsize=16)
def _ops_scan_seconds(metrics: Metrics) -> LoopHistogramChild:
    """The ``idx:ops-by-txn`` child of the index-query histogram, resolved once per Metrics rather
    than per END_TXN (a labels() call builds a tuple and looks it up)."""
    return metrics.index_query.labels(layout.IDX_OPS_BY_TXN)


async def participants(
    store: MetadataStore, metrics: Metrics, most: int, least: int, *, by_key_range: bool = False
) -> Participants:
    """The txn's op records found through ``idx:ops-by-txn`` under the key Pulsar's participants
    write (``/txn/op/<most>_<least>``, docs/record-layout.md), as Pulsar's coordinator finds them.

    ``by_key_range`` also reads the txn's own key range ``/txn/op/<most>_<least>-…`` on its shard
    (partition key = txn key): every op record of the txn lies there whatever index entries its
    writer gave it (an older participant wrote none, a differently keyed one would be invisible to
    the index), so a caller about to delete the header must look there (GC does)."""
    key = layout.txn_key(most, least)
    found = Participants()
    started = time.perf_counter()
    # Ask first whether there is anything to read: almost always nothing is, and on Oxia the question
    # is a get sent with the other END_TXNs' of the same moment, where a scan is a call of its own
    # (store/oxia/index_probes.py).
    if by_key_range or await store.index_has(layout.IDX_OPS_BY_TXN, layout.ops_by_txn_index_key(most, least),
                                             partition_key=key):
        async for record in store.scan_index(layout.IDX_OPS_BY_TXN, *layout.ops_by_txn_range(most, least),
                                             partition_key=key):
            found.add(record)
    _ops_scan_seconds(metrics).observe(time.perf_counter() - started)
    if by_key_range:
        async for record in store.scan_prefix(layout.op_records_prefix(most, least), partition_key=key):
            found.add(record)
    return found


async def publish_decision(
    store: MetadataStore, metrics: Metrics, most: int, least: int, decision: TxnState, *,
    by_key_range: bool = False,
) -> int:
    """Append the decision to every participant's event stream; returns the number of op records
    found (see :func:`participants` for ``by_key_range``)."""
    found = await participants(store, metrics, most, least, by_key_range=by_key_range)
    if not found.segments and not found.subscriptions:
        return len(found.op_keys)  # nobody to tell (today's brokers have their own path: docs/participants.md)
    event = layout.event_json(most, least, decision)
    batch = [
        Put(layout.segment_events_prefix(s), event, partition_key=layout.enc(s), sequential=True)
        for s in sorted(found.segments)
    ] + [
        Put(
            layout.subscription_events_prefix(s, sub),
            event,
            partition_key=layout.subscription_partition_key(s, sub),
            sequential=True,
        )
        for s, sub in sorted(found.subscriptions)
    ]
    if batch:
        await store.write_batch(batch)
        metrics.op_writes.labels("event").inc(len(batch))
    return len(found.op_keys)
