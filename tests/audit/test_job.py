"""The audit job on generated snapshots: every finding counted exactly, from the generator's spec."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tc_server.audit import cli, findings, generate, job
from tc_server.audit.job import EXIT_OK, EXIT_VIOLATIONS
from tc_server.audit.schema import VIOLATIONS

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SPEC = {
    "open_past_deadline": 5,
    "gc_backlog": 4,
    "orphan_ops": 3,
    "late_ops": 2,
    "id_reuse_risk": 5,  # both kinds: at/above next, and no tc-seq record at all
    "illegal_headers": 12,  # each of the six defects twice
}
# What the audit must report, written out from SPEC rather than taken from the generator.
EXPECTED = {
    "open_past_deadline": 5,
    "gc_backlog": 4,
    "gc_backlog_ops": 4 * generate.GC_BACKLOG_OPS_PER_TXN,
    "orphan_ops": 3,
    "late_ops": 2,
    "id_reuse_risk": 5,
    "illegal_headers": 12,
    "undelivered_decisions": 0,  # a generated snapshot has no participant records
    "decision_mismatch": 0,  # nor decision events
}
TXNS = 3_000


@pytest.fixture(scope="module")
def audited(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("anomalies")
    spec = ",".join(f"{k}={v}" for k, v in SPEC.items())
    assert cli.main(["generate", "--txns", str(TXNS), "--out", str(root / "snap"), "--anomalies", spec]) == 0
    code = cli.main(["--input", str(root / "snap"), "--output", str(root / "out")])
    summary = json.loads((root / "out" / "summary.json").read_text())
    return code, root / "out", summary


def test_exact_violation_counts(audited: tuple[int, Path, dict[str, Any]]) -> None:
    code, _, summary = audited
    assert code == EXIT_VIOLATIONS
    assert summary["violations"] == EXPECTED
    assert list(summary["violations"]) == list(VIOLATIONS)
    assert summary["total_txns"] == TXNS


def test_summary_contents(audited: tuple[int, Path, dict[str, Any]]) -> None:
    _, _, summary = audited
    counts = summary["counts_by_state"]
    assert {"OPEN", "COMMITTED", "ABORTED"} <= set(counts)
    assert sum(counts.values()) == TXNS
    assert counts["COMMITTING"] == 2  # the unknown-state illegal headers
    assert summary["params"] == {
        "now_ms": generate.DEFAULT_NOW_MS,
        "now_from": "snapshot taken_at_ms",
        "retention_s": 900,
        "gc_interval_s": 300,
        "grace_s": 60,
        "clock_skew_ms": 1000,
        "master": "local[2]",
    }
    for state in ("COMMITTED", "ABORTED"):
        latency = summary["latency_ms"][state]
        assert 0 <= latency["p50_ms"] <= latency["p90_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    assert summary["pinning"]["segments"] > 0
    rows = pq.read_table(Path(summary["snapshot"]["path"]) / "ops").num_rows
    assert summary["total_ops"] == rows


def test_finding_tables(audited: tuple[int, Path, dict[str, Any]]) -> None:
    _, out, _ = audited
    orphans = pq.read_table(out / "orphan_ops").to_pylist()
    assert all(row["txn_least"] >= 10**12 for row in orphans)
    illegal = pq.read_table(out / "illegal_headers").to_pylist()
    problems = sorted(p for row in illegal for p in row["problems"])
    assert problems == sorted(
        [
            "unknown_state",
            "open_with_finalized",
            "terminal_without_finalized",
            "finalized_before_created",
            "non_positive_timeout",
            "coordinator_id_mismatch",
        ]
        * 2
    )
    reuse = pq.read_table(out / "id_reuse_risk").to_pylist()
    assert sorted(r["reason"] for r in reuse) == ["at_or_above_next"] * 3 + ["no_tc_seq"] * 2
    gc_ops = pq.read_table(out / "gc_backlog_ops").to_pylist()
    assert sum(r["op_records"] for r in gc_ops) == EXPECTED["gc_backlog_ops"]
    for name in ("pinning", "counts_by_state", "latency_percentiles", "latency_histogram", "throughput"):
        assert pq.read_table(out / name).num_rows > 0, name


def test_report_has_charts(audited: tuple[int, Path, dict[str, Any]]) -> None:
    _, out, _ = audited
    html = (out / "report.html").read_text()
    assert html.count("<svg") >= 4
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    # Every chart is well-formed XML.
    start = 0
    while (start := html.find("<svg", start)) >= 0:
        end = html.index("</svg>", start) + len("</svg>")
        ET.fromstring(html[start:end])
        start = end


def test_clean_snapshot_exits_zero(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generate.generate_snapshot(tmp_path / "snap", txns=1_000, seed=11)
    code = cli.main(["--input", str(tmp_path / "snap"), "--output", str(tmp_path / "out")])
    assert code == EXIT_OK
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["violations"] == dict.fromkeys(VIOLATIONS, 0)
    assert "no violations" in capsys.readouterr().out


def test_corrupt_pages_behind_a_valid_footer(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The footer (all the pre-Spark check reads) is intact; the data pages are not, so only Spark finds
    # out, mid-job. Still bad input (2), named, and no Java stack trace on stdout.
    generate.generate_snapshot(tmp_path / "snap", txns=2_000)
    part = tmp_path / "snap" / "ops" / "part-00000.parquet"
    data = bytearray(part.read_bytes())
    data[200 : len(data) // 2] = b"\xab" * (len(data) // 2 - 200)
    part.write_bytes(bytes(data))
    code = cli.main(["--input", str(tmp_path / "snap"), "--output", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2
    assert "ops/part-00000.parquet: not readable" in captured.err
    assert captured.out == ""


def test_params_shift_findings(spark: Any, tmp_path: Path) -> None:
    # An hour later, every normal OPEN txn is past its deadline and every terminal one past retention:
    # --now-ms is honoured over the snapshot's time.
    generate.generate_snapshot(tmp_path / "snap", txns=200, seed=5)
    later = generate.DEFAULT_NOW_MS + 3_600_000
    code = cli.main(["--input", str(tmp_path / "snap"), "--output", str(tmp_path / "out"), "--now-ms", str(later)])
    assert code == EXIT_VIOLATIONS
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    counts = summary["counts_by_state"]
    assert summary["violations"]["open_past_deadline"] == counts["OPEN"]
    assert summary["violations"]["gc_backlog"] == counts["COMMITTED"] + counts["ABORTED"]


def test_terminal_headers_gc_has_not_had_its_pass_for_are_no_backlog(spark: Any, tmp_path: Path) -> None:
    # 400 s later the generated terminal headers were finalized up to ~1,200 s before: past the 900 s
    # retention, but GC deletes on its first pass after it (every 300 s) and the 60 s grace: a healthy
    # store, where "finalized_ms < now - retention" alone reported a backlog on every audit.
    generate.generate_snapshot(tmp_path / "snap", txns=200, seed=5)
    later = generate.DEFAULT_NOW_MS + 400_000
    cli.main(["--input", str(tmp_path / "snap"), "--output", str(tmp_path / "out"), "--now-ms", str(later)])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["violations"]["gc_backlog"] == 0
    assert summary["params"]["gc_interval_s"] == 300


def test_boundaries(spark: Any) -> None:
    """Strict inequalities at each threshold, and an unknown op create time is never "late"."""
    now, grace, retention = 1_000_000, 60_000, 900_000
    headers = spark.createDataFrame(
        [
            # (most, least, coord, state, created, timeout, deadline, finalized, owner, version)
            (0, 1, 0, "OPEN", now - 120_000, 60_000, now - grace, None, None, 1),  # exactly at grace
            (0, 2, 0, "OPEN", now - 120_001, 60_000, now - grace - 1, None, None, 1),  # 1 ms over
            (0, 3, 0, "COMMITTED", 0, 60_000, 60_000, now - retention, None, 2),  # exactly at retention
            (0, 4, 0, "ABORTED", 0, 60_000, 60_000, now - retention - 1, None, 2),  # 1 ms over
        ],
        schema=_schema("headers"),
    )
    ops = spark.createDataFrame(
        [
            (0, 3, 1, "WRITE", "s", None, 1, 1, 0),  # created unknown: not judged
            (0, 3, 2, "WRITE", "s", None, 1, 2, now - retention),  # at finalization: not late
            (0, 4, 1, "WRITE", "s", None, 1, 3, now - retention),  # after finalization: late
        ],
        schema=_schema("ops"),
    )
    tc_seq = spark.createDataFrame([(0, 4)], schema=_schema("tc_seq"))
    annotated = findings.annotate_ops(headers, ops)
    assert _ids(findings.open_past_deadline(headers, now_ms=now, grace_ms=grace)) == [(0, 2)]
    assert _ids(findings.gc_backlog(headers, now_ms=now, gc_due_ms=retention)) == [(0, 4)]
    assert [(r["txn_least"], r["seq"]) for r in findings.late_ops(annotated).collect()] == [(4, 1)]
    assert _ids(findings.id_reuse_risk(headers, tc_seq)) == [(0, 4)]  # least == next
    assert findings.orphan_ops(annotated).count() == 0
    assert findings.illegal_headers(headers).count() == 0


def test_runs_as_a_script() -> None:
    # spark-submit runs the file, not the module: its imports must work from a bare path.
    result = subprocess.run(
        [sys.executable, str(REPO / "tc_server" / "audit" / "job.py"), "--help"],
        cwd="/", capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "--retention-s" in result.stdout


def _schema(table: str) -> Any:
    from tc_server.audit.schema import spark_schema

    return spark_schema(table)


def _ids(df: Any) -> list[tuple[int, int]]:
    return sorted((r["txn_most"], r["txn_least"]) for r in df.collect())


def test_records_the_export_could_not_read_fail_the_audit_in_every_table() -> None:
    # Rejects were only counted (and those of participant records not even that): an audit of a store with
    # a damaged header, which the coordinator's scans skip too, said "no violations" and exited 0.
    snapshot = {"rejects": {"headers": 1, "ops": 0, "tc_seq": 0},
                "optional_tables": {"participants": {"rows": 3, "rejects": 1}}}
    assert job._export_rejects(snapshot) == 2
    summary = {"violations": {name: 0 for name in VIOLATIONS}, "total_txns": 5, "total_ops": 0,
               "duration_s": 1.0, "export_rejects": 2}
    code, line = job.outcome(summary)
    assert code == job.EXIT_VIOLATIONS and "2 records the export could not read" in line, line
    assert job.outcome({**summary, "export_rejects": 0}) == (job.EXIT_OK, line.split("; 2 records")[0])


def test_an_op_within_the_clock_skew_of_its_commit_is_not_late(spark: Any) -> None:
    # The op's create time is the store's clock, the commit's the coordinator's: an Oxia host a few ms
    # ahead made the op written just before END_TXN look late, and a healthy cluster failed the audit.
    headers = spark.createDataFrame([(0, 1, 0, "COMMITTED", 0, 60_000, 60_000, 10_000, None, 2)],
                                    schema=_schema("headers"))
    ops = spark.createDataFrame([(0, 1, 1, "WRITE", "s", None, 1, 1, 10_400),  # 400 ms "after" the commit
                                 (0, 1, 2, "WRITE", "s", None, 1, 2, 12_000)],  # 2 s after: late
                                schema=_schema("ops"))
    annotated = findings.annotate_ops(headers, ops)
    assert [r["seq"] for r in findings.late_ops(annotated).collect()] == [1, 2]  # no tolerance
    assert [r["seq"] for r in findings.late_ops(annotated, skew_ms=1000).collect()] == [2]


def test_published_decisions_that_disagree_with_their_header_or_each_other(spark: Any) -> None:
    # Before, the export read no event stream: a header saying ABORTED while a participant's stream said
    # COMMITTED (a decision changed after it was published) passed every audit.
    headers = spark.createDataFrame([(0, txn, 0, state, 0, 60_000, 60_000, final, None, 2) for txn, state, final in (
        (1, "COMMITTED", 10), (2, "ABORTED", 10), (3, "OPEN", None), (4, "COMMITTED", 10))],
        schema=_schema("headers"))
    events = spark.createDataFrame([
        (0, 1, "COMMITTED", "/txn/segment-events/a"), (0, 1, "COMMITTED", "/txn/segment-events/b"),  # agree
        (0, 2, "COMMITTED", "/txn/segment-events/a"),  # its header says ABORTED
        (0, 3, "ABORTED", "/txn/segment-events/a"),  # its header is still OPEN
        (0, 5, "COMMITTED", "/txn/segment-events/a"), (0, 5, "ABORTED", "/txn/subscription-events/a:s"),  # two
        (0, 6, "ABORTED", "/txn/segment-events/a"),  # no header (collected): no mismatch alone
    ], schema=_schema("events"))
    rows = {r["txn_least"]: (r["header_state"], r["decisions"], r["events"])
            for r in findings.decision_mismatch(headers, events).collect()}
    assert rows == {2: ("ABORTED", ["COMMITTED"], 1), 3: ("OPEN", ["ABORTED"], 1),
                    5: (None, ["ABORTED", "COMMITTED"], 2)}
