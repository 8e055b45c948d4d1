"""Edge cases of the audit: snapshots read through Spark as on a cluster file system (hdfs://, s3a://), damaged
snapshot.json and tables, thresholds and generator times out of range, events no participant can apply."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tc_server.audit import cli, findings, generate, job
from tc_server.audit.job import EXIT_BAD_INPUT, EXIT_OK
from tc_server.audit.schema import (
    EVENTS_SCHEMA,
    HEADERS_SCHEMA,
    OPS_SCHEMA,
    PARTICIPANTS_SCHEMA,
    TC_SEQ_SCHEMA,
    snapshot_document,
    spark_schema,
    write_snapshot_json,
)
from tc_server.audit.writer import TableWriter

NOW = 1_767_225_600_000


def _table(root: Path, name: str, schema: pa.Schema, rows: list[dict[str, Any]]) -> None:
    w = TableWriter(root / name, schema)
    w.write(pa.Table.from_pylist(rows, schema=schema))
    w.close()


def _header(least: int, state: str, finalized: int | None, created: int = NOW - 5_000) -> dict[str, Any]:
    return {"txn_most": 0, "txn_least": least, "coordinator_id": 0, "state": state, "created_ms": created,
            "timeout_ms": 60_000, "deadline_ms": NOW + 55_000, "finalized_ms": finalized, "owner": None,
            "version": 1 if finalized is None else 2}


def _snapshot(root: Path, headers: list[dict[str, Any]], *, events: list[dict[str, Any]] | None = None,
              participants: list[dict[str, Any]] | None = None) -> Path:
    _table(root, "headers", HEADERS_SCHEMA, headers)
    _table(root, "ops", OPS_SCHEMA, [])
    _table(root, "tc_seq", TC_SEQ_SCHEMA, [{"coordinator_id": 0, "next": 100}])
    if events is not None:
        _table(root, "events", EVENTS_SCHEMA, events)
    if participants is not None:
        _table(root, "participants", PARTICIPANTS_SCHEMA, participants)
    write_snapshot_json(root, snapshot_document(taken_at_ms=NOW, source="hand", row_counts={}, rejects={}))
    return root


# -- decision_mismatch: every event for a header still OPEN, and every event that is no decision ------------


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_an_event_for_a_header_still_open_is_a_mismatch_whatever_its_decision_says(spark: Any) -> None:
    # findings.decision_mismatch's docstring (and docs/audit.md): "any decision for a header still OPEN" is a
    # mismatch, since a decision is published only once its header holds it. The rule only compared the
    # event's text with the header's state, so an event whose decision read "OPEN" for an OPEN header passed.
    headers = spark.createDataFrame([(0, 1, 0, "OPEN", 0, 60_000, 60_000, None, None, 1)],
                                    schema=spark_schema("headers"))
    events = spark.createDataFrame([(0, 1, "OPEN", "/txn/segment-events/a")], schema=spark_schema("events"))
    rows = findings.decision_mismatch(headers, events).collect()
    assert [(r["txn_least"], r["header_state"]) for r in rows] == [(1, "OPEN")]


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_a_published_event_that_is_no_decision_is_reported(spark: Any, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # The export keeps an event's decision verbatim (any string); the audit reported an event whose "decision"
    # is neither COMMITTED nor ABORTED nowhere when its txn's header was gone (GC): a damaged record a Pulsar 5
    # participant cannot apply, and the audit said "no violations".
    snap = _snapshot(tmp_path / "snap", [_header(1, "COMMITTED", NOW - 4_000)],
                     events=[{"txn_most": 0, "txn_least": 2, "decision": "GARBAGE",
                              "stream": "/txn/segment-events/x"}])
    code = cli.main(["--input", str(snap), "--output", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code != EXIT_OK, out


# -- remote input (hdfs://, s3a://: job._local_path -> None) ---------------------------------------------------


def _as_remote(monkeypatch: pytest.MonkeyPatch) -> None:
    # What run_audit does for an input on a cluster file system; Spark reads the same local path as it would
    # read hdfs://... (no pyarrow checks, snapshot.json and every table through Spark).
    monkeypatch.setattr(job, "_local_path", lambda location: None)


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_a_snapshot_on_a_cluster_file_system_can_be_audited(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # _read_remote_snapshot_doc reads snapshot.json with spark.read.option("wholetext", True).text(where):
    # DataFrameReader.text(wholetext=False) sets the option back to false, so rows[0][0] is the file's first
    # line, "{" (write_snapshot_json indents). Every audit of an hdfs:// / s3a:// snapshot - the documented
    # spark-submit deployment - was refused as bad input: "snapshot.json: cannot read: Expecting property name".
    snap = tmp_path / "snap"
    generate.generate_snapshot(snap, txns=200, seed=3)
    _as_remote(monkeypatch)
    summary = job.run_audit(spark, str(snap), str(tmp_path / "out"))
    assert summary["violation_total"] == 0 and summary["total_txns"] == 200


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_an_unreadable_participants_table_on_a_cluster_file_system_is_bad_input(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # For remote input _read_optional_table swallowed *any* exception reading the table's schema and returned an
    # empty table: a participants table whose file is damaged was audited as "no participant records"
    # (undelivered_decisions = 0, no violation). A damaged required table is bad input (exit 2) on the same
    # path, and locally the same damaged optional table is exit 2 too. (snapshot.json is read locally here, to
    # step around the wholetext defect above.)
    snap = _snapshot(tmp_path / "snap", [_header(1, "COMMITTED", NOW - 200_000, created=NOW - 300_000)],
                     participants=[{"txn_most": 0, "txn_least": 1, "topic": "persistent://t/n/a",
                                    "subscription": None}])
    part = snap / "participants" / "part-00000.parquet"
    data = part.read_bytes()
    part.write_bytes(data[:-12] + b"\x00" * 12)  # footer length and magic gone
    with pytest.raises(job.BadInputError):  # the local check finds it
        job.validate_local_snapshot(snap)
    doc = json.loads((snap / "snapshot.json").read_text())
    _as_remote(monkeypatch)
    monkeypatch.setattr(job, "_read_remote_snapshot_doc", lambda spark, root: doc)
    try:
        summary = job.run_audit(spark, str(snap), str(tmp_path / "out"))
    except job.BadInputError:
        return
    pytest.fail(f"audited as if it had no participant records: {summary['violations']}")


# -- exit codes: a damaged snapshot.json is bad input (2), not "the job failed" (3) ---------------------------


@pytest.mark.parametrize("damage", ["optional_tables_not_an_object", "nested_too_deep"])
def test_a_damaged_snapshot_json_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              damage: str) -> None:
    # docs/audit.md: exit 2 for bad input (missing snapshot.json, ...), 3 only when the job itself failed.
    # _export_rejects called .values() on optional_tables without checking it is an object (AttributeError),
    # and validate_local_snapshot did not catch json's RecursionError: both exited 3.
    snap = tmp_path / "snap"
    generate.generate_snapshot(snap, txns=10)
    doc = json.loads((snap / "snapshot.json").read_text())
    if damage == "optional_tables_not_an_object":
        doc["optional_tables"] = ["participants"]
        (snap / "snapshot.json").write_text(json.dumps(doc))
    else:
        (snap / "snapshot.json").write_text("[" * 100_000 + "]" * 100_000)
    code = cli.main(["--input", str(snap), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err


# -- thresholds large enough to overflow the job's arithmetic are refused: exit 2 ---------------------------


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_a_threshold_the_job_cannot_compute_with_is_refused_as_an_argument(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # main() refused negative --grace-s/--retention-s/--clock-skew-ms (exit 2) but not huge ones: deadline_ms +
    # grace overflowed under Spark's ANSI mode and the whole audit "failed" (exit 3) after starting Spark.
    snap = tmp_path / "snap"
    generate.generate_snapshot(snap, txns=20)
    code = cli.main(["--input", str(snap), "--output", str(tmp_path / "out"), "--grace-s", str(2**62)])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err


# -- generator: a --now-ms whose rows would fall before the epoch is refused ---------------------------------


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_generate_with_an_early_now_gives_a_snapshot_the_audit_reads(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `tc-audit generate --now-ms T` promises the audit then reports exactly the spec's counts; with T early
    # (1,000 s after the epoch) the gc_backlog rows got negative times, and the audit refused the snapshot
    # (exit 2). Such a --now-ms is refused now, naming the range; the range's first value works.
    assert cli.main(["generate", "--txns", "50", "--out", str(tmp_path / "early"), "--now-ms", "1000000",
                     "--anomalies", "gc_backlog=1"]) == job.EXIT_BAD_INPUT
    assert "--now-ms 1000000 is outside" in capsys.readouterr().err
    snap = tmp_path / "snap"
    assert cli.main(["generate", "--txns", "50", "--out", str(snap), "--now-ms", str(generate.NOW_MS_RANGE[0]),
                     "--anomalies", "gc_backlog=1"]) == 0
    code = cli.main(["--input", str(snap), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == job.EXIT_VIOLATIONS, err
