"""The synthetic snapshot generator, checked with pyarrow alone (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tc_server.audit import generate, schema
from tc_server.audit.job import validate_local_snapshot
from tc_server.audit.schema import HEADERS_SCHEMA, OPS_SCHEMA, TC_SEQ_SCHEMA


def test_parse_spec() -> None:
    counts = generate.parse_spec("open_past_deadline=5, orphan_ops=3,")
    assert counts == {name: 0 for name in generate.ANOMALIES} | {"open_past_deadline": 5, "orphan_ops": 3}
    assert generate.parse_spec("") == dict.fromkeys(generate.ANOMALIES, 0)


@pytest.mark.parametrize("spec", ["nope=1", "orphan_ops", "orphan_ops=x", "orphan_ops=-1", "gc_backlog_ops=2"])
def test_parse_spec_rejects(spec: str) -> None:
    with pytest.raises(ValueError, match="orphan_ops|nope|gc_backlog_ops"):
        generate.parse_spec(spec)


def test_expected_violations_derives_gc_backlog_ops() -> None:
    expected = generate.expected_violations({"gc_backlog": 3, "late_ops": 1})
    assert expected["gc_backlog"] == 3
    assert expected["gc_backlog_ops"] == 3 * generate.GC_BACKLOG_OPS_PER_TXN
    assert expected["late_ops"] == 1
    assert set(expected) == set(schema.VIOLATIONS)


def test_snapshot_shape(tmp_path: Path) -> None:
    spec = {"open_past_deadline": 2, "gc_backlog": 1, "orphan_ops": 4, "late_ops": 3, "id_reuse_risk": 5,
            "illegal_headers": 6}
    # A small chunk size so that several chunks (row groups) are written.
    doc = generate.generate_snapshot(tmp_path / "s", txns=2_000, anomalies=spec, seed=7, chunk_txns=300)
    assert validate_local_snapshot(tmp_path / "s")["taken_at_ms"] == generate.DEFAULT_NOW_MS
    assert json.loads((tmp_path / "s" / "snapshot.json").read_text()) == doc

    headers = pq.read_table(tmp_path / "s" / "headers")
    ops = pq.read_table(tmp_path / "s" / "ops")
    tc_seq = pq.read_table(tmp_path / "s" / "tc_seq")
    assert headers.schema == HEADERS_SCHEMA and ops.schema == OPS_SCHEMA and tc_seq.schema == TC_SEQ_SCHEMA
    assert headers.num_rows == 2_000
    assert doc["row_counts"] == {"headers": 2_000, "ops": ops.num_rows, "tc_seq": generate.DEFAULT_COORDINATORS}
    assert pq.ParquetFile(tmp_path / "s" / "headers" / "part-00000.parquet").metadata.num_row_groups > 1
    # Txn ids are unique; ~3 ops per txn.
    ids = set(zip(headers["txn_most"].to_pylist(), headers["txn_least"].to_pylist(), strict=True))
    assert len(ids) == headers.num_rows
    assert 2.5 < ops.num_rows / headers.num_rows < 3.5
    # deadline is always created + timeout.
    assert pc.all(pc.equal(headers["deadline_ms"], pc.add(headers["created_ms"], headers["timeout_ms"]))).as_py()


def test_same_seed_same_snapshot(tmp_path: Path) -> None:
    for name in ("a", "b"):
        generate.generate_snapshot(tmp_path / name, txns=500, anomalies={"late_ops": 2}, seed=3)
    for table in ("headers", "ops", "tc_seq"):
        assert pq.read_table(tmp_path / "a" / table).equals(pq.read_table(tmp_path / "b" / table))


def test_too_many_anomalies(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fewer than"):
        generate.generate_snapshot(tmp_path / "s", txns=3, anomalies={"gc_backlog": 2, "late_ops": 2})


def test_refuses_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "x").write_text("")
    with pytest.raises(FileExistsError):
        generate.generate_snapshot(tmp_path / "s", txns=3)
