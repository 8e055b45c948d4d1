"""Decision fan-out: after the header CAS, one event per distinct participant (design §4).

Participants (``MetadataTransactionBuffer`` and the pending-ack store) subscribe to their own event
streams and re-read the header when an event arrives, so an event must never be written before the
CAS that decided it; writing one twice is harmless.
"""

from __future__ import annotations

import time

import structlog

from tc_server.coordinator import layout
from tc_server.coordinator.layout import OpKind, TxnOp, TxnState
from tc_server.metrics import Metrics
from tc_server.store.api import MetadataStore, Put

log = structlog.get_logger("tc_server.coordinator")


async def participants(
    store: MetadataStore, metrics: Metrics, most: int, least: int
) -> tuple[set[str], set[tuple[str, str]], int]:
    """The distinct written segments, the distinct (segment, subscription) acks, and the number of
    op records, found through ``idx:ops-by-txn``."""
    key = layout.txn_key(most, least)
    start, end = layout.exact_index_range(key)
    started = time.perf_counter()
    segments: set[str] = set()
    subscriptions: set[tuple[str, str]] = set()
    count = 0
    async for record in store.scan_index(layout.IDX_OPS_BY_TXN, start, end, partition_key=key):
        count += 1
        try:
            op = TxnOp.from_json(record.value)
        except ValueError as exc:
            # A participant wrote something unreadable: it cannot learn the decision from us
            # either way, so say so loudly and still publish to the others.
            log.warning("unreadable op record", key=record.key, error=str(exc))
            continue
        if op.kind is OpKind.WRITE:
            segments.add(op.segment)
        elif op.subscription is not None:
            subscriptions.add((op.segment, op.subscription))
    metrics.index_query.labels(layout.IDX_OPS_BY_TXN).observe(time.perf_counter() - started)
    return segments, subscriptions, count


async def publish_decision(
    store: MetadataStore, metrics: Metrics, most: int, least: int, decision: TxnState
) -> int:
    """Append the decision to every participant's event stream; returns the number of op records."""
    segments, subscriptions, count = await participants(store, metrics, most, least)
    event = layout.event_json(most, least, decision)
    batch = [
        Put(layout.segment_events_prefix(s), event, partition_key=layout.enc(s), sequential=True)
        for s in sorted(segments)
    ] + [
        Put(
            layout.subscription_events_prefix(s, sub),
            event,
            partition_key=layout.subscription_partition_key(s, sub),
            sequential=True,
        )
        for s, sub in sorted(subscriptions)
    ]
    if batch:
        await store.write_batch(batch)
        metrics.op_writes.labels("event").inc(len(batch))
    return count
