"""Stream a metadata store's transaction records into an audit snapshot (docs/audit.md).

The record families are scanned one after the other, each streamed into Parquet in batches of
``batch_rows``, so memory stays bounded however large the store is. A record that cannot be parsed is
written to ``rejects.jsonl`` with its key and the reason and counted; it never stops the export.

The scans are not one point-in-time read (no store offers that across shards), so their order is
chosen to keep concurrent activity from looking like a violation:

* ops before headers: a participant writes an op only while its txn's header exists, and GC deletes a
  header only after its ops are gone, so an op seen first finds its header in the later scan (no
  false ``orphan_ops``, but for one race: the op deleted right after it was read and its header then
  collected by GC before the headers scan, docs/audit.md); participant records before headers for the
  same reason (GC keeps a header while they remain, docs/participants.md); decision events before
  headers, as a decision is published only after its header holds it (no false ``decision_mismatch``
  with a header read as OPEN);
* tc-seq last: ``next`` only grows and an id is handed out only after its block was reserved, so every
  header seen earlier is below the ``next`` read later (no false ``id_reuse_risk``);
* ``taken_at_ms`` is the time the export *started*: a txn found overdue or past retention against
  that time was so when it was read, too.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from tc_server.audit.schema import (
    EVENTS,
    EVENTS_SCHEMA,
    HEADERS,
    HEADERS_SCHEMA,
    MAX_TIME_MS,
    OPS,
    OPS_SCHEMA,
    PARTICIPANTS,
    PARTICIPANTS_SCHEMA,
    REJECTS_JSONL,
    TC_SEQ,
    TC_SEQ_SCHEMA,
    snapshot_document,
    write_snapshot_json,
)
from tc_server.audit.writer import TableWriter
from tc_server.coordinator import layout
from tc_server.store.api import SEQUENCE_DIGITS, MetadataStore, Record

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1
# Redraw the progress line at most this often; a terminal does not need more.
_PROGRESS_INTERVAL_S = 0.2
# How much of a rejected value goes into rejects.jsonl: enough to recognise it, bounded.
_REJECT_VALUE_CHARS = 200


class RejectedRecord(ValueError):
    """A record that does not parse; the message is the reason written to rejects.jsonl."""


def _int64(doc: dict[str, Any], name: str, *, required: bool = True) -> int | None:
    value = doc.get(name)
    if value is None:
        if required:
            raise RejectedRecord(f"missing field {name!r}")
        return None
    # bool is an int in Python but not in JSON; a header with "createdMs": true is malformed.
    if isinstance(value, bool) or not isinstance(value, int):
        raise RejectedRecord(f"field {name!r} is not an integer: {value!r}")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise RejectedRecord(f"field {name!r} out of int64 range: {value}")
    return value


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # not JSON, an integer of thousands of digits, deep nesting
        raise RejectedRecord(f"value is not JSON this audit reads: {type(exc).__name__}: {str(exc)[:100]}") from exc
    if not isinstance(doc, dict):
        raise RejectedRecord(f"value is not a JSON object but {type(doc).__name__}")
    return doc


def _text(value: str) -> str:
    """A string as Parquet can hold it: a lone UTF-16 surrogate (valid in the JSON tc-server and Pulsar
    write, e.g. in an owner role) becomes U+FFFD instead of failing the whole export."""
    if value.isascii():
        return value
    return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _txn_id(text: str) -> tuple[int, int]:
    try:
        most, least = layout.parse_txn_key(text)
    except ValueError as exc:
        raise RejectedRecord(f"bad txn id {text!r}") from exc
    if not 0 <= most <= _INT32_MAX:
        # mostSigBits is the tcId, a small non-negative partition number.
        raise RejectedRecord(f"txn most bits {most} is not a coordinator id")
    if not _INT64_MIN <= least <= _INT64_MAX:
        raise RejectedRecord(f"txn least bits {least} out of int64 range")
    return most, least


def parse_header(record: Record) -> dict[str, Any]:
    """One headers row, from a header in Pulsar 5's form or tc-server's earlier one
    (docs/record-layout.md). Deliberately more lenient than ``TxnHeader.from_json``: an unknown state
    or an OPEN header with a finalized time is kept verbatim, because finding those is the audit's job."""
    most, least = _txn_id(record.key[len(layout.HEADER_PREFIX) :])
    try:
        doc = layout.load_json_object(record.value)
        created, timeout, finalized = layout.parse_header_times(doc)
    except ValueError as exc:
        raise RejectedRecord(str(exc)) from exc
    state = doc.get("state")
    if not isinstance(state, str):
        raise RejectedRecord(f"field 'state' is not a string: {state!r}")
    deadline = created + timeout
    # The deadline too: the job refuses a snapshot holding one past the bound (check_values).
    for name, value in (("created", created), ("timeout", timeout), ("finalized", finalized), ("deadline", deadline)):
        if value is not None and not 0 <= value <= MAX_TIME_MS:
            raise RejectedRecord(f"{name} time out of range (0 to year 9999): {value} ms")
    owner = doc.get("owner")
    if owner is not None and not isinstance(owner, str):
        raise RejectedRecord(f"field 'owner' is not a string: {owner!r}")
    return {
        "txn_most": most,
        "txn_least": least,
        "coordinator_id": most,
        "state": _text(state),  # a lone surrogate here failed the whole export's batch write
        "created_ms": created,
        "timeout_ms": timeout,
        "deadline_ms": deadline,
        "finalized_ms": finalized,
        "owner": None if owner is None else _text(owner),
        "version": record.version,
    }


def parse_participant(record: Record) -> dict[str, Any]:
    """One participants row from ``/txn/participant/<most>_<least>/…`` (docs/record-layout.md)."""
    try:
        most, least = layout.parse_participant_path(record.key)
        participant = layout.Participant.from_json(record.value)
    except ValueError as exc:
        raise RejectedRecord(str(exc)) from exc
    for name, value in (("most", most), ("least", least)):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise RejectedRecord(f"txn id {name} out of int64 range: {value}")
    return {"txn_most": most, "txn_least": least, "topic": _text(participant.topic),
            "subscription": None if participant.subscription is None else _text(participant.subscription)}


def _without_sequence(key: str, what: str) -> tuple[str, int]:
    """A sequential key (the store's ``-<seq20>`` suffix) split into what precedes the suffix and its number."""
    before, sep, seq_text = key.rpartition("-")
    if not sep or len(seq_text) != SEQUENCE_DIGITS or not (seq_text.isascii() and seq_text.isdigit()):
        raise RejectedRecord(f"{what} key does not end in -<{SEQUENCE_DIGITS}-digit sequence>")
    return before, int(seq_text)


def parse_op(record: Record) -> dict[str, Any]:
    """One ops row from ``/txn/op/<most>_<least>-<seq20>``."""
    txn, seq = _without_sequence(record.key[len(layout.OP_PREFIX) :], "op")
    if seq > _INT64_MAX:
        raise RejectedRecord(f"op sequence {seq} out of int64 range")
    most, least = _txn_id(txn)
    try:
        op = layout.TxnOp.from_json(record.value)
    except ValueError as exc:
        raise RejectedRecord(str(exc)) from exc
    for name, value in (("ledgerId", op.ledger_id), ("entryId", op.entry_id)):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise RejectedRecord(f"field {name!r} out of int64 range: {value}")
    if record.created_ms > MAX_TIME_MS:
        # The store's own stamp (a shard leader's clock gone wild): one reject, not a snapshot the job refuses whole
        # (schema.py: the exporter rejects records outside the range; a review).
        raise RejectedRecord(f"the store's create time out of range (0 to year 9999): {record.created_ms} ms")
    return {
        "txn_most": most,
        "txn_least": least,
        "seq": seq,
        "kind": op.kind.value,
        "segment": _text(op.segment),
        "subscription": None if op.subscription is None else _text(op.subscription),
        "ledger_id": op.ledger_id,
        "entry_id": op.entry_id,
        "created_ms": max(record.created_ms, 0),
    }


def parse_event(record: Record) -> dict[str, Any]:
    """One events row from ``/txn/segment-events/<enc(segment)>-<seq20>`` or
    ``/txn/subscription-events/<enc(segment)>:<enc(subscription)>-<seq20>`` (``TxnEvent``:
    ``{"txnId":"<most>_<least>","decision":…}``); the stream is the key without its sequence."""
    stream, _ = _without_sequence(record.key, "event")
    doc = _json_object(record.value)
    txn, decision = doc.get("txnId"), doc.get("decision")
    if not isinstance(txn, str):
        raise RejectedRecord(f"field 'txnId' is not a string: {txn!r}")
    if not isinstance(decision, str):
        raise RejectedRecord(f"field 'decision' is not a string: {decision!r}")
    most, least = _txn_id(txn)
    return {"txn_most": most, "txn_least": least, "decision": _text(decision), "stream": _text(stream)}


def parse_tc_seq(record: Record) -> dict[str, Any]:
    text = record.key[len(layout.TC_SEQ_PREFIX) :]
    if not (text.isascii() and text.isdigit()) or len(text) > 10 or int(text) > _INT32_MAX:
        raise RejectedRecord(f"bad coordinator id {text!r}")
    if text != str(int(text)):
        # The coordinator reads /txn/tc-seq/3 only: /txn/tc-seq/03 taken for it hid a coordinator without
        # its sequence record (whose ids start again, from the clock's floor) from id_reuse_risk.
        raise RejectedRecord(f"non-canonical coordinator id {text!r}")
    doc = _json_object(record.value)
    next_id = _int64(doc, "next")
    return {"coordinator_id": int(text), "next": next_id}


class _Progress:
    """A one-line ``\\r`` counter on a terminal; silent otherwise."""

    def __init__(self, stream: IO[str] | None) -> None:
        self._stream = stream
        self._start = time.monotonic()
        self._last = 0.0
        self.counts: dict[str, int] = {OPS: 0, PARTICIPANTS: 0, EVENTS: 0, HEADERS: 0, TC_SEQ: 0, "rejects": 0}

    def tick(self, *, force: bool = False) -> None:
        if self._stream is None:
            return
        now = time.monotonic()
        if not force and now - self._last < _PROGRESS_INTERVAL_S:
            return
        self._last = now
        c = self.counts
        rows = sum(c.values())
        rate = rows / max(now - self._start, 1e-9)
        self._stream.write(
            f"\rexport: ops {c[OPS]:,}  headers {c[HEADERS]:,}  tc-seq {c[TC_SEQ]:,}  "
            f"rejects {c['rejects']:,}  participants {c[PARTICIPANTS]:,}  events {c[EVENTS]:,}  "
            f"({rate:,.0f} rows/s)"
        )
        self._stream.flush()

    def done(self) -> None:
        if self._stream is not None:
            self.tick(force=True)
            self._stream.write("\n")
            self._stream.flush()


async def _export_family(
    records: AsyncIterator[Record],
    table: str,
    schema: pa.Schema,
    parse: Callable[[Record], dict[str, Any]],
    writer: TableWriter,
    rejects: IO[str],
    progress: _Progress,
    batch_rows: int,
) -> int:
    """Stream one key family into ``writer``; returns the number of rejected records."""
    batch: list[dict[str, Any]] = []
    rejected = 0
    async for record in records:
        try:
            batch.append(parse(record))
        except RejectedRecord as exc:
            rejected += 1
            progress.counts["rejects"] += 1
            value = record.value.decode("utf-8", errors="replace")[:_REJECT_VALUE_CHARS]
            line = {"table": table, "key": record.key, "reason": str(exc), "value": value}
            rejects.write(json.dumps(line, sort_keys=True) + "\n")
            continue
        progress.counts[table] += 1
        if len(batch) >= batch_rows:
            writer.write(pa.Table.from_pylist(batch, schema=schema))
            batch = []
        progress.tick()
    if batch:
        writer.write(pa.Table.from_pylist(batch, schema=schema))
    writer.close()
    return rejected


async def export_snapshot(
    store: MetadataStore,
    out_dir: Path,
    *,
    source: str,
    show_progress: bool | None = None,
    batch_rows: int = 50_000,
) -> dict[str, int]:
    """Write the store's txn records as a snapshot in ``out_dir`` (created; must be absent or empty).

    ``source`` names the store kind in snapshot.json. ``show_progress``: a counter on stderr; None
    shows it when stderr is a terminal. Returns the row counts ``{"headers", "ops", "tc_seq",
    "rejects"}``.

    Raises FileExistsError if ``out_dir`` holds files, and whatever the store raises
    (StoreUnavailableError...): a failed export leaves no snapshot.json behind, so it is never audited.
    """
    if batch_rows <= 0:
        raise ValueError(f"batch_rows must be positive, got {batch_rows}")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"export directory {out_dir} is not empty")
    out_dir.mkdir(parents=True, exist_ok=True)
    if show_progress is None:
        show_progress = sys.stderr.isatty()
    progress = _Progress(sys.stderr if show_progress else None)
    taken_at_ms = time.time_ns() // 1_000_000

    participants = layout.participants_by_coordinator_range(None)
    families: list[tuple[Callable[[], AsyncIterator[Record]], str, Callable[[Record], dict[str, Any]], pa.Schema]] = [
        # Order matters; see the module docstring.
        (lambda: store.scan_prefix(layout.OP_PREFIX), OPS, parse_op, OPS_SCHEMA),
        # Under /txn/participant/<txn>/, a level deeper than a prefix scan lists: found through its index.
        (lambda: store.scan_index(layout.IDX_PARTICIPANTS_BY_COORDINATOR, *participants), PARTICIPANTS,
         parse_participant, PARTICIPANTS_SCHEMA),
        # Events before headers too: a decision is published only once its header holds it.
        (lambda: _chained(store.scan_prefix(layout.SEGMENT_EVENTS_PREFIX),
                          store.scan_prefix(layout.SUBSCRIPTION_EVENTS_PREFIX)), EVENTS, parse_event, EVENTS_SCHEMA),
        (lambda: store.scan_prefix(layout.HEADER_PREFIX), HEADERS, parse_header, HEADERS_SCHEMA),
        (lambda: store.scan_prefix(layout.TC_SEQ_PREFIX), TC_SEQ, parse_tc_seq, TC_SEQ_SCHEMA),
    ]
    rows: dict[str, int] = {}
    rejects: dict[str, int] = {}
    rejects_path = out_dir / REJECTS_JSONL
    with rejects_path.open("w") as rejects_file:
        for scan, table, parse, schema in families:
            writer = TableWriter(out_dir / table, schema)
            rejects[table] = await _export_family(
                scan(), table, schema, parse, writer, rejects_file, progress, batch_rows
            )
            rows[table] = writer.rows
    progress.done()
    total_rejects = sum(rejects.values())
    if total_rejects == 0:
        rejects_path.unlink()
    optional = {table: {"rows": rows[table], "rejects": rejects[table]} for table in (PARTICIPANTS, EVENTS)}
    write_snapshot_json(
        out_dir, snapshot_document(taken_at_ms=taken_at_ms, source=source, row_counts=rows, rejects=rejects,
                                   extra={"optional_tables": optional})
    )
    return {HEADERS: rows[HEADERS], OPS: rows[OPS], TC_SEQ: rows[TC_SEQ], "rejects": total_rejects}


async def _chained(*scans: AsyncIterator[Record]) -> AsyncIterator[Record]:
    for scan in scans:
        async for record in scan:
            yield record


def main(argv: list[str] | None = None) -> int:
    """``python -m tc_server.audit.export ARGS``: ``tc-server export ARGS`` (tc_server/cli.py), one export
    with one set of checks whichever way it is started."""
    from tc_server.cli import main as cli_main

    return cli_main(["export", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
