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

Candidates go a page at a time: the participant records of the whole page come from one range of
``idx:participants-by-coordinator`` per coordinator, op records are first looked for anywhere (one
record read from each place a txn's check looks; today's brokers write none, so that usually ends it,
otherwise each candidate is checked on its own as before), and the page's deletes go in one
write_batch, each still conditional on the header version scanned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import structlog

from tc_server.coordinator import layout
from tc_server.coordinator.events import publish_decision
from tc_server.coordinator.layout import TxnHeader, TxnState
from tc_server.metrics import Metrics
from tc_server.store.api import Delete, MetadataStore, Outcome, Record, StoreUnavailableError, exact_index_range

log = structlog.get_logger("tc_server.gc")

# Candidates handled together: one participants-index scan per coordinator in the page, one check
# for op records, one write_batch of deletes. Between two pages GC gives the event loop a turn: a
# backend that answers without suspending (memory) would otherwise hold it for the whole pass.
GC_PAGE = 128

# Where idx:ops-by-txn holds every op record indexed by Pulsar's key form (``/txn/op/<txn>``): each
# txn's exact range (layout.ops_by_txn_range) lies inside it, as a txn key sorts before "~".
_ALL_OPS_BY_TXN = (layout.OP_PREFIX, layout.OP_PREFIX + layout.INDEX_END)


@dataclass
class GcResult:
    deleted: int = 0
    republished: int = 0
    outstanding_ops: int = 0
    # Headers kept because participant records remain: brokers not yet told the decision (the outbox).
    undelivered: int = 0


@dataclass(frozen=True, slots=True)
class _Candidate:
    record: Record
    most: int
    least: int
    state: TxnState


async def collect_garbage(store: MetadataStore, metrics: Metrics, now_ms: int, retention_s: int) -> GcResult:
    """One GC pass over every coordinator's terminal headers older than the retention."""
    result = GcResult()
    horizon_ms = max(0, now_ms - retention_s * 1000)
    for state in (TxnState.COMMITTED, TxnState.ABORTED):
        # Each page is collected as the scan reaches it, so a pass holds one page of headers, not every
        # header past the retention (at 5,000 txns/s and the defaults, 1.5 million in a pass: ~600 MB).
        # The stores' scans go on from the last key they gave (keyset pages, or Oxia's snapshot), so
        # deleting what the scan already gave is safe. The index query's time is the scan's alone.
        scan_s = 0.0
        page: list[Record] = []
        started = time.perf_counter()
        for start, end in layout.final_state_ranges(state, horizon_ms):
            async for record in store.scan_index(layout.IDX_TXN_BY_FINAL_STATE, start, end):
                page.append(record)
                if len(page) == GC_PAGE:
                    scan_s += time.perf_counter() - started
                    await _collect_page(store, metrics, _candidates(page), result)
                    await asyncio.sleep(0)
                    page = []
                    started = time.perf_counter()
        scan_s += time.perf_counter() - started
        metrics.index_query.labels(layout.IDX_TXN_BY_FINAL_STATE).observe(scan_s)
        if page:
            await _collect_page(store, metrics, _candidates(page), result)
    metrics.outstanding_ops.set(result.outstanding_ops)
    if result.undelivered:
        log.info("gc kept headers whose participants were not all told", count=result.undelivered)
    if result.deleted or result.republished:
        log.info("gc pass", deleted=result.deleted, republished=result.republished,
                 outstanding_ops=result.outstanding_ops)
    return result


def _candidates(records: list[Record]) -> list[_Candidate]:
    found = []
    for record in records:
        try:
            most, least = layout.parse_header_path(record.key)
            state = TxnHeader.state_from_json(record.value)
        except ValueError as exc:
            log.warning("skipping unreadable header", key=record.key, error=str(exc))
            continue
        if state.terminal:  # an index entry out of step with its record: only a terminal header may go
            found.append(_Candidate(record, most, least, state))
    return found


async def _collect_page(store: MetadataStore, metrics: Metrics, page: list[_Candidate], result: GcResult) -> None:
    """The safety rules of the module docstring for one page, with a few store calls for the whole
    page instead of four per header (issue 13: GC cost as much CPU per collected txn as the pair)."""
    with_participants = await _txns_with_participant_records(store, page)
    # Op records are written only by v5 participants, and only until they have applied the decision:
    # usually there are none in the whole store, and then none of the page has any. Otherwise each
    # candidate is checked in its own index range and key range, as publish_decision does.
    ops_anywhere = await _any_op_record(store)
    deletes = []
    for candidate in page:
        # The events first, also for a txn whose participant records keep its header below: its v5
        # participants must not wait for today's brokers (one down, or refusing tc-server's role).
        ops = 0
        if ops_anywhere:
            try:
                ops = await publish_decision(store, metrics, candidate.most, candidate.least, candidate.state,
                                             by_key_range=True)
            except (StoreUnavailableError, TimeoutError):
                raise  # the store: the pass ends, and the next one starts over
            except Exception as exc:  # noqa: BLE001 - this header only: kept, and the pass goes on
                log.warning("republishing a decision failed; its header is kept", txn=f"({candidate.most},"
                            f"{candidate.least})", error=repr(exc))
                continue
            if ops:
                result.republished += 1
                result.outstanding_ops += ops
        if (candidate.most, candidate.least) in with_participants:
            # The header plus its participant records are the outbox (docs/participants.md):
            # deleting the header would leave brokers that were never told the decision.
            result.undelivered += 1
            continue
        if ops:
            continue
        # Conditional on the version scanned: a header changed since the scan stays for the next pass.
        # An op record written after the check above does not change the header's version: only the
        # short time from that check to this page's batch separates them (as it separated the
        # per-header check from its delete before pages), for a txn that ended a retention ago.
        deletes.append(Delete(candidate.record.key, expected_version=candidate.record.version,
                              partition_key=layout.txn_key(candidate.most, candidate.least)))
    if deletes:
        outcomes = await store.write_batch(deletes)
        result.deleted += sum(1 for outcome in outcomes if outcome.outcome is Outcome.OK)


async def _txns_with_participant_records(store: MetadataStore, page: list[_Candidate]) -> set[tuple[int, int]]:
    """The page's txns that still have participant records: one scan of
    ``idx:participants-by-coordinator`` per coordinator over the span of the page's ids (every
    participant record carries that entry, layout.py), instead of a prefix scan per header."""
    spans: dict[int, tuple[int, int]] = {}
    found: set[tuple[int, int]] = set()
    for candidate in page:
        if candidate.most < 0 or candidate.least < 0:
            # No padded index key sorts like a negative id: look in the txn's own prefix.
            if await _has_participant_records(store, candidate.most, candidate.least):
                found.add((candidate.most, candidate.least))
            continue
        low, high = spans.get(candidate.most, (candidate.least, candidate.least))
        spans[candidate.most] = (min(low, candidate.least), max(high, candidate.least))
    for most, (low, high) in spans.items():
        start = layout.participants_by_coordinator_key(most, low)
        end = exact_index_range(layout.participants_by_coordinator_key(most, high))[1]
        async for record in store.scan_index(layout.IDX_PARTICIPANTS_BY_COORDINATOR, start, end):
            try:
                found.add(layout.parse_participant_path(record.key))
            except ValueError as exc:
                log.warning("unreadable participant record key", key=record.key, error=str(exc))
    return found


async def _any_op_record(store: MetadataStore) -> bool:
    """Whether any op record exists: in a txn's key range (``/txn/op/<txn>-…``, the children of
    ``/txn/op/``) or under Pulsar's ops-by-txn index key. Every place publish_decision(by_key_range)
    looks for one txn lies inside these two scans, so False means no candidate has an op record."""
    return (await _not_empty(store.scan_prefix(layout.OP_PREFIX))
            or await _not_empty(store.scan_index(layout.IDX_OPS_BY_TXN, *_ALL_OPS_BY_TXN)))


async def _not_empty(records: AsyncIterator[Record]) -> bool:
    """Reads one record at most, then closes the scan (an Oxia scan cancels its stream)."""
    try:
        return await anext(records, None) is not None
    finally:
        if isinstance(records, AsyncGenerator):
            await records.aclose()


async def _has_participant_records(store: MetadataStore, most: int, least: int) -> bool:
    # Read to the end (a txn has few participants) so that no backend is left with an open scan.
    found = [record.key async for record in
             store.scan_prefix(layout.participants_prefix(most, least), partition_key=layout.txn_key(most, least))]
    return bool(found)
