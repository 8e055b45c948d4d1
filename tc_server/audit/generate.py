"""Synthetic audit snapshots of any size with an exact number of each anomaly (docs/audit.md).

Normal transactions look like a healthy store seen at ``now_ms``: terminal headers finalized within
the GC retention (a real store holds nothing older), OPEN ones well before their deadline, ops written
between creation and finalization, ids below their coordinator's ``next``. With the job's default
parameters (retention 900 s, grace 60 s, now = the snapshot's ``taken_at_ms``) they trip no finding.

Each anomaly is a set of extra rows built to trip exactly its own finding and no other, so the
expected counts follow from the spec alone (:func:`expected_violations`):

====================  ==========================================================================
open_past_deadline    OPEN header, deadline 9+ minutes before now; one op
gc_backlog            terminal header finalized ~33 minutes before now, with
                      :data:`GC_BACKLOG_OPS_PER_TXN` ops (those make up ``gc_backlog_ops``)
orphan_ops            an op record whose txn has no header (one op per made-up txn id)
late_ops              a committed txn with one op written before and one *after* its finalization
id_reuse_risk         a committed header at or above its coordinator's ``next`` (even ones) or on a
                      coordinator with no tc-seq record (odd ones); no ops
illegal_headers       one of six defects in turn: unknown state, OPEN with a finalized time, terminal
                      without one, finalized before created, zero timeout, coordinator_id != most
====================  ==========================================================================

Normal rows are generated vectorized with pyarrow compute in chunks and written as Parquet row groups
as they are made, so memory is bounded by the chunk size at any ``txns`` (numpy is not a dependency).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tc_server.audit.schema import (
    HEADERS,
    HEADERS_SCHEMA,
    MAX_TIME_MS,
    OPS,
    OPS_SCHEMA,
    TC_SEQ,
    TC_SEQ_SCHEMA,
    VIOLATIONS,
    snapshot_document,
    write_snapshot_json,
)
from tc_server.audit.writer import TableWriter

ANOMALIES = ("open_past_deadline", "gc_backlog", "orphan_ops", "late_ops", "id_reuse_risk", "illegal_headers")
GC_BACKLOG_OPS_PER_TXN = 2
# 2026-01-01T00:00:00Z: a fixed default keeps generated snapshots byte-for-byte reproducible.
DEFAULT_NOW_MS = 1_767_225_600_000
# Pulsar's default number of coordinators (`initialize-transaction-coordinator-metadata`).
DEFAULT_COORDINATORS = 16
# The job defaults the generated rows are kept clear of (docs/semantics.md §6 GC retention; sweep grace).
ASSUMED_RETENTION_MS = 900_000
ASSUMED_GRACE_MS = 60_000
# Txns per vectorized chunk (one row group of headers, ~3x as many ops): ~100 MB of Arrow buffers.
CHUNK_TXNS = 500_000

_MAX_OPS_PER_TXN = 5  # 1..5, mean 3
_SEGMENTS = [f"persistent://public/default/topic-{t}/segment-{s}" for t in range(32) for s in range(2)]
_SUBSCRIPTIONS = [f"sub-{i}" for i in range(4)]
_OWNERS: list[str | None] = [*(f"app-{i}" for i in range(8)), None]
_ORPHAN_LEAST_BASE = 10**12
# Ledger ids roll every 10 minutes per segment, as a managed ledger would; entry = ms within it.
_LEDGER_SPAN_MS = 600_000
# The --now-ms taken: the rows' times reach an hour before it (6 ledger spans), and must stay in the snapshot
# format's range (0 to year 9999, schema.MAX_TIME_MS).
NOW_MS_RANGE = (86_400_000, MAX_TIME_MS - 86_400_000)


def parse_spec(spec: str | None) -> dict[str, int]:
    """``"open_past_deadline=5,orphan_ops=3"`` → counts for every anomaly (0 when absent).

    Raises ValueError naming the bad item."""
    counts = dict.fromkeys(ANOMALIES, 0)
    if not spec:
        return counts
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in counts:
            names = ", ".join(ANOMALIES)
            raise ValueError(f"bad anomaly {item!r}; expected NAME=COUNT with NAME one of {names}")
        try:
            count = int(value)
        except ValueError:
            raise ValueError(f"bad count in {item!r}") from None
        if count < 0:
            raise ValueError(f"negative count in {item!r}")
        counts[name] = count
    return counts


def expected_violations(anomalies: Mapping[str, int]) -> dict[str, int]:
    """The violation counts the audit must report for a snapshot generated with ``anomalies``."""
    expected = {name: anomalies.get(name, 0) for name in VIOLATIONS if name != "gc_backlog_ops"}
    expected["gc_backlog_ops"] = GC_BACKLOG_OPS_PER_TXN * anomalies.get("gc_backlog", 0)
    # Generated snapshots have no participants table (docs/participants.md): nothing undelivered.
    expected["undelivered_decisions"] = 0
    expected["decision_mismatch"] = 0  # nor an events table
    return {name: expected[name] for name in VIOLATIONS}


def _header_anomaly_count(anomalies: Mapping[str, int]) -> int:
    return sum(anomalies[name] for name in ANOMALIES if name != "orphan_ops")


class _Ids:
    """Sequential txn ids: the g-th txn is (g % C, g // C), as a round-robin client would get them."""

    def __init__(self, coordinators: int) -> None:
        self.c = coordinators

    def most(self, g: int) -> int:
        return g % self.c

    def least(self, g: int) -> int:
        return g // self.c


def _i64(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return pc.cast(values, pa.int64())


def _floor_times(u: pa.Array, span: int | pa.Array) -> pa.Array:
    """floor(u * span) as int64, u in [0, 1)."""
    return _i64(pc.floor(pc.multiply(u, span)))


def _normal_chunk(
    g0: int, n: int, *, seed: int, chunk_no: int, now_ms: int, coordinators: int, arange: pa.Array
) -> tuple[pa.Table, pa.Table]:
    def rnd(stream: int, size: int) -> pa.Array:
        # One independent, reproducible stream per (seed, chunk, purpose).
        return pc.random(size, initializer=(seed * 1_000_003 + chunk_no) * 16 + stream)

    g = pc.add(arange.slice(0, n), g0)
    least = pc.divide(g, coordinators)
    most = pc.subtract(g, pc.multiply(least, coordinators))
    u_state, u_created, u_latency, u_timeout, u_owner = (rnd(i, n) for i in range(5))
    is_open = pc.less(u_state, 0.05)
    is_commit = pc.less(u_state, 0.75)
    state = pc.if_else(is_open, "OPEN", pc.if_else(is_commit, "COMMITTED", "ABORTED"))
    # OPEN: created within the last 50 s, timeout >= 60 s, so the deadline is still ahead.
    # Terminal: created 30..800 s ago, finalized within 20 s: inside the 900 s retention, before now.
    created = pc.if_else(
        is_open,
        pc.subtract(now_ms - 1_000, _floor_times(u_created, 49_000)),
        pc.subtract(now_ms - 30_000, _floor_times(u_created, 770_000)),
    )
    timeout = pc.if_else(pc.less(u_timeout, 0.7), 60_000, 120_000)
    # Cubed uniform: most txns end within a second or two, a long tail up to 20 s.
    latency = pc.add(_floor_times(pc.multiply(pc.multiply(u_latency, u_latency), u_latency), 19_995), 5)
    finalized = pc.if_else(is_open, pa.scalar(None, pa.int64()), pc.add(created, latency))
    owners = pa.array(_OWNERS, pa.string())
    owner = pc.take(owners, _floor_times(u_owner, len(_OWNERS)))
    headers = pa.table(
        {
            "txn_most": most,
            "txn_least": least,
            "coordinator_id": pc.cast(most, pa.int32()),
            "state": state,
            "created_ms": created,
            "timeout_ms": _i64(timeout),
            "deadline_ms": pc.add(created, timeout),
            "finalized_ms": finalized,
            "owner": owner,
            # One CAS for OPEN → terminal.
            "version": _i64(pc.if_else(is_open, 1, 2)),
        },
        schema=HEADERS_SCHEMA,
    )

    # Ops: _MAX_OPS_PER_TXN candidate slots per txn, keep the first k (1..5) of each.
    k = pc.add(_floor_times(rnd(5, n), _MAX_OPS_PER_TXN), 1)
    slots = arange.slice(0, n * _MAX_OPS_PER_TXN)
    txn = pc.divide(slots, _MAX_OPS_PER_TXN)
    slot = pc.subtract(slots, pc.multiply(txn, _MAX_OPS_PER_TXN))
    keep = pc.less(slot, pc.take(k, txn))
    txn = pc.filter(txn, keep)
    slot = pc.filter(slot, keep)
    m = len(txn)
    u_kind, u_seg, u_time, u_sub = (rnd(6 + i, m) for i in range(4))
    t_created = pc.take(created, txn)
    # Written while the txn was open: between creation and finalization (or now, for OPEN ones).
    t_end = pc.take(pc.if_else(is_open, now_ms, finalized), txn)
    op_created = pc.add(t_created, _floor_times(u_time, pc.subtract(t_end, t_created)))
    is_write = pc.less(u_kind, 0.6)
    seg_idx = _floor_times(u_seg, len(_SEGMENTS))
    rel = pc.subtract(op_created, now_ms - 6 * _LEDGER_SPAN_MS)
    ledger_no = pc.divide(rel, _LEDGER_SPAN_MS)
    subs = pc.take(pa.array(_SUBSCRIPTIONS, pa.string()), _floor_times(u_sub, len(_SUBSCRIPTIONS)))
    ops = pa.table(
        {
            "txn_most": pc.take(most, txn),
            "txn_least": pc.take(least, txn),
            # Oxia's first sequential key under a prefix ends in ...0001.
            "seq": pc.add(slot, 1),
            "kind": pc.if_else(is_write, "WRITE", "ACK"),
            "segment": pc.take(pa.array(_SEGMENTS, pa.string()), seg_idx),
            "subscription": pc.if_else(is_write, pa.scalar(None, pa.string()), subs),
            "ledger_id": pc.add(pc.multiply(pc.add(seg_idx, 1), 1000), ledger_no),
            "entry_id": pc.subtract(rel, pc.multiply(ledger_no, _LEDGER_SPAN_MS)),
            "created_ms": op_created,
        },
        schema=OPS_SCHEMA,
    )
    return headers, ops


def _header(
    ids: _Ids,
    g: int,
    state: str,
    created: int,
    timeout: int,
    finalized: int | None,
    *,
    most: int | None = None,
    least: int | None = None,
    coordinator_id: int | None = None,
) -> dict[str, Any]:
    most = ids.most(g) if most is None else most
    least = ids.least(g) if least is None else least
    return {
        "txn_most": most,
        "txn_least": least,
        "coordinator_id": most if coordinator_id is None else coordinator_id,
        "state": state,
        "created_ms": created,
        "timeout_ms": timeout,
        "deadline_ms": created + timeout,
        "finalized_ms": finalized,
        "owner": "anomaly",
        "version": 1 if finalized is None else 2,
    }


def _op(most: int, least: int, seq: int, created: int, k: int) -> dict[str, Any]:
    seg_idx = k % len(_SEGMENTS)
    return {
        "txn_most": most,
        "txn_least": least,
        "seq": seq,
        "kind": "WRITE",
        "segment": _SEGMENTS[seg_idx],
        "subscription": None,
        "ledger_id": 900_000 + seg_idx,
        "entry_id": k * 10 + seq,
        "created_ms": created,
    }


def _anomaly_rows(
    anomalies: Mapping[str, int], g0: int, *, now_ms: int, coordinators: int, next_ids: list[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Headers and ops of every anomaly; header ids continue the normal sequence from ``g0``."""
    ids = _Ids(coordinators)
    headers: list[dict[str, Any]] = []
    ops: list[dict[str, Any]] = []
    g = g0

    for k in range(anomalies["open_past_deadline"]):
        created = now_ms - 600_000 - k % 1000
        headers.append(_header(ids, g, "OPEN", created, 60_000, None))
        ops.append(_op(ids.most(g), ids.least(g), 1, created + 1_000, k))
        g += 1

    for k in range(anomalies["gc_backlog"]):
        created = now_ms - 2_000_000 - k % 1000
        state = "COMMITTED" if k % 2 == 0 else "ABORTED"
        headers.append(_header(ids, g, state, created, 60_000, created + 10_000))
        for seq in range(1, GC_BACKLOG_OPS_PER_TXN + 1):
            ops.append(_op(ids.most(g), ids.least(g), seq, created + seq * 1_000, k))
        g += 1

    for k in range(anomalies["late_ops"]):
        created = now_ms - 100_000
        headers.append(_header(ids, g, "COMMITTED", created, 60_000, created + 10_000))
        ops.append(_op(ids.most(g), ids.least(g), 1, created + 5_000, k))
        ops.append(_op(ids.most(g), ids.least(g), 2, created + 50_000, k))  # 40 s after the commit
        g += 1

    for k in range(anomalies["illegal_headers"]):
        created = now_ms - 100_000
        variant = k % 6
        if variant == 0:
            headers.append(_header(ids, g, "COMMITTING", created, 60_000, None))
        elif variant == 1:
            created = now_ms - 10_000
            headers.append(_header(ids, g, "OPEN", created, 60_000, now_ms - 5_000))
        elif variant == 2:
            headers.append(_header(ids, g, "ABORTED", created, 60_000, None))
        elif variant == 3:
            headers.append(_header(ids, g, "COMMITTED", created, 60_000, now_ms - 200_000))
        elif variant == 4:
            headers.append(_header(ids, g, "COMMITTED", created, 0, created + 1_000))
        else:
            headers.append(
                _header(ids, g, "COMMITTED", created, 60_000, created + 1_000, coordinator_id=ids.most(g) + 1)
            )
        g += 1

    for k in range(anomalies["id_reuse_risk"]):
        created = now_ms - 100_000
        if k % 2 == 0:
            c = (k // 2) % coordinators
            most, least = c, next_ids[c] + k
        else:
            # A coordinator id beyond the configured ones: no tc-seq record at all.
            most, least = coordinators, k
        headers.append(_header(ids, 0, "COMMITTED", created, 60_000, created + 1_000, most=most, least=least))

    for k in range(anomalies["orphan_ops"]):
        ops.append(_op(k % coordinators, _ORPHAN_LEAST_BASE + k, 1, now_ms - 1_000, k))

    return headers, ops


def generate_snapshot(
    out_dir: Path,
    *,
    txns: int,
    anomalies: Mapping[str, int] | None = None,
    seed: int = 0,
    now_ms: int = DEFAULT_NOW_MS,
    coordinators: int = DEFAULT_COORDINATORS,
    chunk_txns: int = CHUNK_TXNS,
    show_progress: bool | None = None,
) -> dict[str, Any]:
    """Write a snapshot of ``txns`` headers (normal ones plus every anomaly that has a header) to
    ``out_dir`` (must be absent or empty). Returns the snapshot.json document.

    Raises ValueError when the anomalies need more headers than ``txns``, FileExistsError when
    ``out_dir`` holds files."""
    counts = dict.fromkeys(ANOMALIES, 0)
    counts.update(anomalies or {})
    if set(counts) != set(ANOMALIES):
        raise ValueError(f"unknown anomalies: {sorted(set(counts) - set(ANOMALIES))}")
    if coordinators < 1:
        raise ValueError("coordinators must be >= 1")
    if not NOW_MS_RANGE[0] <= now_ms <= NOW_MS_RANGE[1]:
        # Every generated time lies within an hour of now: earlier, some came out negative, and the audit refused
        # the snapshot it was meant to report on.
        raise ValueError(f"--now-ms {now_ms} is outside {NOW_MS_RANGE[0]} to {NOW_MS_RANGE[1]} (a day after the "
                         "epoch to a day before year 9999)")
    normal = txns - _header_anomaly_count(counts)
    if normal < 0:
        raise ValueError(f"--txns {txns} is fewer than the {_header_anomaly_count(counts)} anomalous headers")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"snapshot directory {out_dir} is not empty")
    out_dir.mkdir(parents=True, exist_ok=True)
    if show_progress is None:
        show_progress = sys.stderr.isatty()

    headers_out = TableWriter(out_dir / HEADERS, HEADERS_SCHEMA)
    ops_out = TableWriter(out_dir / OPS, OPS_SCHEMA)
    # 0, 1, 2, ... once; every chunk takes a zero-copy slice of it.
    ones = pa.repeat(pa.scalar(1, pa.int64()), chunk_txns * _MAX_OPS_PER_TXN)
    arange = pc.subtract(pc.cumulative_sum(ones), 1)
    start = time.monotonic()
    for chunk_no, g0 in enumerate(range(0, normal, chunk_txns)):
        n = min(chunk_txns, normal - g0)
        h, o = _normal_chunk(
            g0, n, seed=seed, chunk_no=chunk_no, now_ms=now_ms, coordinators=coordinators, arange=arange
        )
        headers_out.write(h)
        ops_out.write(o)
        if show_progress:
            rate = (g0 + n) / max(time.monotonic() - start, 1e-9)
            sys.stderr.write(f"\rgenerate: {g0 + n:,}/{normal:,} normal txns ({rate:,.0f} txns/s)")
            sys.stderr.flush()
    if show_progress:
        sys.stderr.write("\n")

    # Every sequentially numbered header (normal and anomalous, except id_reuse_risk) is below next.
    sequential = normal + _header_anomaly_count(counts) - counts["id_reuse_risk"]
    next_ids = []
    for c in range(coordinators):
        used = (sequential - c + coordinators - 1) // coordinators if sequential > c else 0
        # An unused remainder of the last reserved block (0..100 ids), as after a leader change.
        next_ids.append(used + (c * 37) % 101)
    a_headers, a_ops = _anomaly_rows(
        counts, normal, now_ms=now_ms, coordinators=coordinators, next_ids=next_ids
    )
    headers_out.write(pa.Table.from_pylist(a_headers, schema=HEADERS_SCHEMA))
    ops_out.write(pa.Table.from_pylist(a_ops, schema=OPS_SCHEMA))
    headers_out.close()
    ops_out.close()
    tc_seq_out = TableWriter(out_dir / TC_SEQ, TC_SEQ_SCHEMA)
    tc_seq_out.write(
        pa.table(
            {
                "coordinator_id": pa.array(range(coordinators), pa.int32()),
                "next": pa.array(next_ids, pa.int64()),
            },
            schema=TC_SEQ_SCHEMA,
        )
    )
    tc_seq_out.close()

    doc = snapshot_document(
        taken_at_ms=now_ms,
        source="generated",
        row_counts={HEADERS: headers_out.rows, OPS: ops_out.rows, TC_SEQ: tc_seq_out.rows},
        rejects={},
        extra={
            "generator": {
                "txns": txns,
                "seed": seed,
                "coordinators": coordinators,
                "anomalies": counts,
                "expected_violations": expected_violations(counts),
                "assumes": {"retention_s": ASSUMED_RETENTION_MS // 1000, "grace_s": ASSUMED_GRACE_MS // 1000},
            }
        },
    )
    write_snapshot_json(out_dir, doc)
    return doc
