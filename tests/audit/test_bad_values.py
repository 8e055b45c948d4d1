"""The audit job on snapshots whose Parquet files are well-formed but whose values the format does not allow
(found by a review): exit 2 naming the table, column or field, not a clean audit or a failed job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tc_server.audit import cli
from tc_server.audit.job import EXIT_BAD_INPUT
from tc_server.audit.schema import (
    EVENTS_SCHEMA,
    HEADERS_SCHEMA,
    OPS_SCHEMA,
    TC_SEQ_SCHEMA,
    snapshot_document,
    write_snapshot_json,
)
from tc_server.audit.writer import TableWriter

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

NOW = 1_767_225_600_000


def _snapshot(root: Path, headers: list[dict[str, Any]], headers_schema: pa.Schema = HEADERS_SCHEMA,
              taken_at_ms: int = NOW) -> Path:
    counts = {}
    for name, schema, rows in (("headers", headers_schema, headers), ("ops", OPS_SCHEMA, []),
                               ("tc_seq", TC_SEQ_SCHEMA, [{"coordinator_id": 0, "next": 100}])):
        w = TableWriter(root / name, schema)
        w.write(pa.Table.from_pylist(rows, schema=schema))
        w.close()
        counts[name] = len(rows)
    write_snapshot_json(root, snapshot_document(taken_at_ms=taken_at_ms, source="hand", row_counts=counts,
                                                rejects={}))
    return root


def _header(**kw: Any) -> dict[str, Any]:
    row = {"txn_most": 0, "txn_least": 1, "coordinator_id": 0, "state": "COMMITTED", "created_ms": NOW - 5_000,
           "timeout_ms": 60_000, "deadline_ms": NOW + 55_000, "finalized_ms": NOW - 4_000, "owner": None,
           "version": 2}
    row.update(kw)
    return row


def _run(snap: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(["--input", str(snap), "--output", str(out)])
    return code, capsys.readouterr().err


def test_header_with_null_state_is_not_audited_as_healthy(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The contract says state is never null; the input check compares column types only, not
    # nullability or nulls. A header with a null state trips no finding (every predicate on it is null)
    # and the audit exits 0: "no violations".
    nullable = HEADERS_SCHEMA.set(3, HEADERS_SCHEMA.field("state").with_nullable(True))
    snap = _snapshot(tmp_path / "snap", [_header(), _header(txn_least=2, state=None)], nullable)
    code, err = _run(snap, tmp_path / "out", capsys)
    assert code == EXIT_BAD_INPUT and "1 null in column 'state'" in err, (code, err)


def test_snapshot_time_beyond_year_9999_is_bad_input(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # snapshot.json's taken_at_ms is only checked to be an int. A value past year 9999 runs the whole
    # Spark job, then report._utc raises ValueError: exit 3 "audit failed", no summary.json, and the
    # message names neither snapshot.json nor taken_at_ms.
    snap = _snapshot(tmp_path / "snap", [_header()], taken_at_ms=300_000_000_000_000)
    code, err = _run(snap, tmp_path / "out", capsys)
    assert code == EXIT_BAD_INPUT and "taken_at_ms 300000000000000 is out of range" in err, (code, err)


def test_huge_time_in_a_header_does_not_fail_the_job(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # deadline_ms near int64 max: open_past_deadline's deadline_ms + grace overflows under ANSI mode and
    # the whole audit dies (exit 3) over one row, instead of reporting it (illegal) or naming it (exit 2).
    big = 2**63 - 1000
    snap = _snapshot(tmp_path / "snap", [_header(), _header(txn_least=2, state="OPEN", finalized_ms=None,
                                                            deadline_ms=big)])
    code, err = _run(snap, tmp_path / "out", capsys)
    assert code == EXIT_BAD_INPUT and "outside 0 to year 9999 in column 'deadline_ms'" in err, (code, err)


def test_an_event_with_a_null_decision_is_bad_input(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The optional tables are checked as the required ones are: decision_mismatch, given an empty set of
    # decisions for that txn, failed the whole job (exit 3) under ANSI mode.
    snap = _snapshot(tmp_path / "snap", [_header()])
    nullable = EVENTS_SCHEMA.set(2, EVENTS_SCHEMA.field("decision").with_nullable(True))
    w = TableWriter(snap / "events", nullable)
    w.write(pa.Table.from_pylist([{"txn_most": 0, "txn_least": 1, "decision": None,
                                   "stream": "/txn/segment-events/x"}], schema=nullable))
    w.close()
    code, err = _run(snap, tmp_path / "out", capsys)
    assert code == EXIT_BAD_INPUT and "events' has values" in err and "null in column 'decision'" in err, (code, err)
