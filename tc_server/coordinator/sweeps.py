"""Garbage collection of ended transactions (docs/semantics.md §6, PIP-473's GC sweep).

A terminal header older than the retention is deleted (CAS on its version) once no op records of
the txn remain. Where op records remain, a participant has not finished applying the decision, so
the decision is published again instead: GC never deletes op records and never loses a decision
(lesson from apache/pulsar PR #25693's review). Timeouts are not swept here: each led partition keeps
its own deadline queue (partition.py), which aborts within a second instead of Pulsar's 60 s sweep.

"No op records remain" is checked in the txn's own key range ``/txn/op/<most>_<least>-…`` on its
shard, not only through ``idx:ops-by-txn``: a participant's records found by neither must never be
left without their header, because a participant that finds ops without a header treats the txn as
ABORTED (PIP-473), and a committed txn would be lost. Candidates come from both key forms of
``idx:txn-by-final-state`` (docs/record-layout.md, "Upgrading from the earlier tc-server layout").
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog

from tc_server.coordinator import layout
from tc_server.coordinator.events import publish_decision
from tc_server.coordinator.layout import TxnHeader, TxnState
from tc_server.metrics import Metrics
from tc_server.store.api import BadVersionError, MetadataStore

log = structlog.get_logger("tc_server.gc")

# Headers examined between two turns of the event loop.
GC_YIELD_EVERY = 64


@dataclass
class GcResult:
    deleted: int = 0
    republished: int = 0
    outstanding_ops: int = 0
    # Headers kept because participant records remain: brokers not yet told the decision (the outbox).
    undelivered: int = 0


async def collect_garbage(store: MetadataStore, metrics: Metrics, now_ms: int, retention_s: int) -> GcResult:
    """One GC pass over every coordinator's terminal headers older than the retention."""
    result = GcResult()
    horizon_ms = max(0, now_ms - retention_s * 1000)
    for state in (TxnState.COMMITTED, TxnState.ABORTED):
        started = time.perf_counter()
        expired = [
            record
            for start, end in layout.final_state_ranges(state, horizon_ms)
            async for record in store.scan_index(layout.IDX_TXN_BY_FINAL_STATE, start, end)
        ]
        metrics.index_query.labels(layout.IDX_TXN_BY_FINAL_STATE).observe(time.perf_counter() - started)
        for count, record in enumerate(expired, 1):
            if count % GC_YIELD_EVERY == 0:
                # A backend that answers without suspending (memory) would otherwise hold the event
                # loop for the whole pass: seconds of stalled requests with ~100,000 expired headers.
                await asyncio.sleep(0)
            try:
                most, least = layout.parse_header_path(record.key)
                header = TxnHeader.from_json(record.value)
            except ValueError as exc:
                log.warning("skipping unreadable header", key=record.key, error=str(exc))
                continue
            if not header.state.terminal:
                continue  # an index entry out of step with its record: only a terminal header may go
            if await _has_participant_records(store, most, least):
                # The header plus its participant records are the outbox (docs/participants.md):
                # deleting the header would leave brokers that were never told the decision.
                result.undelivered += 1
                continue
            ops = await publish_decision(store, metrics, most, least, header.state, by_key_range=True)
            if ops:
                result.republished += 1
                result.outstanding_ops += ops
                continue
            try:
                await store.delete(
                    record.key, expected_version=record.version, partition_key=layout.txn_key(most, least)
                )
                result.deleted += 1
            except BadVersionError:
                pass  # changed since the scan; the next pass looks again
    metrics.outstanding_ops.set(result.outstanding_ops)
    if result.undelivered:
        log.info("gc kept headers whose participants were not all told", count=result.undelivered)
    if result.deleted or result.republished:
        log.info("gc pass", deleted=result.deleted, republished=result.republished,
                 outstanding_ops=result.outstanding_ops)
    return result


async def _has_participant_records(store: MetadataStore, most: int, least: int) -> bool:
    # Read to the end (a txn has few participants) so that no backend is left with an open scan.
    found = [record.key async for record in
             store.scan_prefix(layout.participants_prefix(most, least), partition_key=layout.txn_key(most, least))]
    return bool(found)
