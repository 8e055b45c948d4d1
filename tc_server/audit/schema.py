"""The audit snapshot format: what ``export`` and ``generate`` write and the audit job reads.

A snapshot is a directory::

    snapshot.json          format version, taken_at_ms, source, row counts (written LAST: a directory
                           without it is an incomplete export)
    headers/part-*.parquet one row per ``/txn/id/<most>_<least>`` record
    ops/part-*.parquet     one row per ``/txn/op/<most>_<least>-<seq20>`` record
    tc_seq/part-*.parquet  one row per ``/txn/tc-seq/<tcId>`` record
    rejects.jsonl          records the exporter could not parse (key, reason); optional

Each table is a directory so that a large table can be several files (Spark reads a directory as one
table and splits it by row group). The schemas below are the contract; both the pyarrow and the Spark
form are spelled out so that neither is inferred from data. Readers ignore extra columns (a newer
writer may add some) and reject missing columns and changed types, naming the file.

docs/audit.md describes the same format for people.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

FORMAT_NAME = "tc-audit-snapshot"
# Bump on any incompatible change of the tables below; the job refuses other versions.
FORMAT_VERSION = 1

SNAPSHOT_JSON = "snapshot.json"
REJECTS_JSONL = "rejects.jsonl"
HEADERS = "headers"
OPS = "ops"
TC_SEQ = "tc_seq"
TABLES = (HEADERS, OPS, TC_SEQ)
# tc-server's participant records of today's brokers (docs/participants.md). Optional: snapshots taken
# before tc-server recorded participants, and generated ones, have none; then the table is empty.
PARTICIPANTS = "participants"
# The decisions published to Pulsar 5's participants (``/txn/segment-events/…``, ``/txn/subscription-events/…``).
# Optional: snapshots taken before the audit read them, and generated ones, have none.
EVENTS = "events"
OPTIONAL_TABLES = (PARTICIPANTS, EVENTS)

# The times a snapshot may hold, in epoch ms: 0 up to the end of year 9999 (what an ISO instant can say).
# Bounded well inside int64 so that the job's arithmetic (deadline + grace, now - finalized) cannot
# overflow: Spark runs with ANSI mode on, where an overflow fails the whole job. The exporter rejects
# records outside it; the job refuses a snapshot that holds one (made by other means).
MAX_TIME_MS = 253_402_300_799_999
# The time columns of each table, each within [0, MAX_TIME_MS].
TIME_COLUMNS = {"headers": ("created_ms", "timeout_ms", "deadline_ms", "finalized_ms"), "ops": ("created_ms",)}

# The states PIP-473 defines; anything else in a header is reported by ``illegal_headers``.
KNOWN_STATES = ("OPEN", "COMMITTED", "ABORTED")
TERMINAL_STATES = ("COMMITTED", "ABORTED")
OP_KINDS = ("WRITE", "ACK")

HEADERS_SCHEMA = pa.schema(
    [
        pa.field("txn_most", pa.int64(), nullable=False),
        pa.field("txn_least", pa.int64(), nullable=False),
        # Always == txn_most when exported (TxnId.mostSigBits is the tcId); kept as its own column so
        # that a foreign or hand-made snapshot that disagrees is caught by ``illegal_headers``.
        pa.field("coordinator_id", pa.int32(), nullable=False),
        # Verbatim from the record, unknown values included: hiding them would hide what the audit seeks.
        pa.field("state", pa.string(), nullable=False),
        pa.field("created_ms", pa.int64(), nullable=False),
        pa.field("timeout_ms", pa.int64(), nullable=False),
        # created_ms + timeout_ms, the key of idx:txn-by-deadline.
        pa.field("deadline_ms", pa.int64(), nullable=False),
        pa.field("finalized_ms", pa.int64(), nullable=True),
        pa.field("owner", pa.string(), nullable=True),
        # The store's record version (opaque; only compared for equality).
        pa.field("version", pa.int64(), nullable=False),
    ]
)

OPS_SCHEMA = pa.schema(
    [
        pa.field("txn_most", pa.int64(), nullable=False),
        pa.field("txn_least", pa.int64(), nullable=False),
        # The store's 20-digit sequential suffix of the key.
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("segment", pa.string(), nullable=False),
        pa.field("subscription", pa.string(), nullable=True),
        pa.field("ledger_id", pa.int64(), nullable=False),
        pa.field("entry_id", pa.int64(), nullable=False),
        # The store's create time of the record (Oxia Version.created_timestamp); 0 when unknown.
        pa.field("created_ms", pa.int64(), nullable=False),
    ]
)

TC_SEQ_SCHEMA = pa.schema(
    [
        pa.field("coordinator_id", pa.int32(), nullable=False),
        # The first id not yet reserved by that coordinator (``{"next": N}``).
        pa.field("next", pa.int64(), nullable=False),
    ]
)

PARTICIPANTS_SCHEMA = pa.schema(
    [
        pa.field("txn_most", pa.int64(), nullable=False),
        pa.field("txn_least", pa.int64(), nullable=False),
        # A partition the txn produced to, or the topic of a subscription it acked on.
        pa.field("topic", pa.string(), nullable=False),
        pa.field("subscription", pa.string(), nullable=True),
    ]
)

EVENTS_SCHEMA = pa.schema(
    [
        pa.field("txn_most", pa.int64(), nullable=False),
        pa.field("txn_least", pa.int64(), nullable=False),
        # The event's decision, verbatim (COMMITTED or ABORTED when well-formed).
        pa.field("decision", pa.string(), nullable=False),
        # The event's key without its sequence: which segment's (or segment:subscription's) stream it is in.
        pa.field("stream", pa.string(), nullable=False),
    ]
)

ARROW_SCHEMAS: dict[str, pa.Schema] = {HEADERS: HEADERS_SCHEMA, OPS: OPS_SCHEMA, TC_SEQ: TC_SEQ_SCHEMA,
                                       PARTICIPANTS: PARTICIPANTS_SCHEMA, EVENTS: EVENTS_SCHEMA}


def spark_schema(table: str) -> Any:
    """The Spark ``StructType`` of ``table``, written out field by field (not derived from the
    pyarrow schema) so that the contract is readable in one place for each engine.

    Spark marks every column read from Parquet nullable, so nullability here is documentation."""
    # Imported here so that exporting a snapshot does not need pyspark.
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    schemas = {
        HEADERS: StructType(
            [
                StructField("txn_most", LongType(), False),
                StructField("txn_least", LongType(), False),
                StructField("coordinator_id", IntegerType(), False),
                StructField("state", StringType(), False),
                StructField("created_ms", LongType(), False),
                StructField("timeout_ms", LongType(), False),
                StructField("deadline_ms", LongType(), False),
                StructField("finalized_ms", LongType(), True),
                StructField("owner", StringType(), True),
                StructField("version", LongType(), False),
            ]
        ),
        OPS: StructType(
            [
                StructField("txn_most", LongType(), False),
                StructField("txn_least", LongType(), False),
                StructField("seq", LongType(), False),
                StructField("kind", StringType(), False),
                StructField("segment", StringType(), False),
                StructField("subscription", StringType(), True),
                StructField("ledger_id", LongType(), False),
                StructField("entry_id", LongType(), False),
                StructField("created_ms", LongType(), False),
            ]
        ),
        TC_SEQ: StructType(
            [
                StructField("coordinator_id", IntegerType(), False),
                StructField("next", LongType(), False),
            ]
        ),
        PARTICIPANTS: StructType(
            [
                StructField("txn_most", LongType(), False),
                StructField("txn_least", LongType(), False),
                StructField("topic", StringType(), False),
                StructField("subscription", StringType(), True),
            ]
        ),
        EVENTS: StructType(
            [
                StructField("txn_most", LongType(), False),
                StructField("txn_least", LongType(), False),
                StructField("decision", StringType(), False),
                StructField("stream", StringType(), False),
            ]
        ),
    }
    return schemas[table]


def part_file_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def snapshot_document(
    *,
    taken_at_ms: int,
    source: str,
    row_counts: dict[str, int],
    rejects: dict[str, int],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The content of ``snapshot.json``. ``taken_at_ms`` is the audit's default "now"."""
    doc: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "taken_at_ms": taken_at_ms,
        "source": source,
        "row_counts": {name: row_counts.get(name, 0) for name in TABLES},
        "rejects": {name: rejects.get(name, 0) for name in TABLES},
    }
    if extra:
        doc.update(extra)
    return doc


def write_snapshot_json(out_dir: Path, doc: dict[str, Any]) -> None:
    # Written through a temporary name and renamed, so that a reader never sees half a file and
    # the presence of snapshot.json means the export finished.
    tmp = out_dir / (SNAPSHOT_JSON + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(out_dir / SNAPSHOT_JSON)


# Every finding the audit job counts as a violation, in the order the summary and the report list
# them; gc_backlog_ops (the op records of the gc_backlog txns) follows from gc_backlog.
VIOLATIONS = (
    "open_past_deadline",
    "gc_backlog",
    "gc_backlog_ops",
    "orphan_ops",
    "late_ops",
    "id_reuse_risk",
    "illegal_headers",
    "undelivered_decisions",
    "decision_mismatch",
)
