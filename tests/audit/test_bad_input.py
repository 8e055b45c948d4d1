"""Bad snapshots exit 2 with a message naming the file and the problem, before any JVM starts."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tc_server.audit import cli, generate
from tc_server.audit.job import EXIT_BAD_INPUT


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    root = tmp_path / "snap"
    generate.generate_snapshot(root, txns=50)
    return root


def run(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["--input", str(snapshot), "--output", str(tmp_path / "out")])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(tmp_path / "nowhere", tmp_path, capsys)
    assert code == EXIT_BAD_INPUT
    assert "nowhere: no such snapshot directory" in err
    assert out == ""


def test_missing_snapshot_json(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (snapshot / "snapshot.json").unlink()
    code, _, err = run(snapshot, tmp_path, capsys)
    assert code == EXIT_BAD_INPUT
    assert "snapshot.json: missing" in err


def test_unsupported_format_version(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads((snapshot / "snapshot.json").read_text())
    doc["format_version"] = 99
    (snapshot / "snapshot.json").write_text(json.dumps(doc))
    code, _, err = run(snapshot, tmp_path, capsys)
    assert code == EXIT_BAD_INPUT
    assert "format_version 99 is not supported" in err


@pytest.mark.parametrize("count", ["3", -1, 1.5])
def test_a_rejects_count_that_is_not_a_count(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             count: object) -> None:
    # Before, int() of it after the whole Spark run (exit 3), or a negative count cancelling real rejects.
    doc = json.loads((snapshot / "snapshot.json").read_text())
    doc["rejects"]["ops"] = count
    (snapshot / "snapshot.json").write_text(json.dumps(doc))
    code, _, err = run(snapshot, tmp_path, capsys)
    assert code == EXIT_BAD_INPUT
    assert "a rejects count is not a non-negative integer" in err


def test_missing_table(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for f in (snapshot / "tc_seq").iterdir():
        f.unlink()
    (snapshot / "tc_seq").rmdir()
    code, _, err = run(snapshot, tmp_path, capsys)
    assert code == EXIT_BAD_INPUT
    assert "tc_seq: missing table 'tc_seq'" in err


def test_a_table_missing_rows_is_partial_input(snapshot: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # A part file lost in a copy: the audit judged the rows left and missed what the lost ones held (an
    # overdue txn; a review's). snapshot.json's row counts say how many there are.
    doc = json.loads((snapshot / "snapshot.json").read_text())
    doc["row_counts"]["headers"] += 1
    (snapshot / "snapshot.json").write_text(json.dumps(doc))
    code, _, err = run(snapshot, tmp_path, capsys)
    assert code == EXIT_BAD_INPUT
    assert f"table 'headers' has {doc['row_counts']['headers'] - 1} rows where snapshot.json says" in err


def test_a_missing_optional_table_with_rows_is_partial_input(snapshot: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # The participants table left out of a copy: the undelivered decisions it held vanished from the audit.
    doc = json.loads((snapshot / "snapshot.json").read_text())
    doc["optional_tables"] = {"participants": {"rows": 1, "rejects": 0}}
    (snapshot / "snapshot.json").write_text(json.dumps(doc))
    code, _, err = run(snapshot, tmp_path, capsys)
    assert code == EXIT_BAD_INPUT
    assert "missing table 'participants', which snapshot.json says has 1 rows" in err


def test_corrupt_parquet(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = snapshot / "ops" / "part-00001.parquet"
    bad.write_bytes(b"PAR1 this is not a parquet file at all")
    code, out, err = run(snapshot, tmp_path, capsys)
    assert code == EXIT_BAD_INPUT
    assert "part-00001.parquet: not a readable Parquet file" in err
    assert "at org.apache" not in out + err  # no Java stack trace


def test_truncated_parquet(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    part = snapshot / "headers" / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[:-100])
    code, _, err = run(snapshot, tmp_path, capsys)
    assert code == EXIT_BAD_INPUT
    assert "headers/part-00000.parquet: not a readable Parquet file" in err


def test_missing_column(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    part = snapshot / "headers" / "part-00000.parquet"
    table = pq.read_table(part).drop_columns(["state"])
    pq.write_table(table, part)
    code, _, err = run(snapshot, tmp_path, capsys)
    assert code == EXIT_BAD_INPUT
    assert "headers/part-00000.parquet: missing column 'state'" in err


def test_wrong_column_type(snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    part = snapshot / "tc_seq" / "part-00000.parquet"
    table = pq.read_table(part)
    table = table.set_column(1, "next", table["next"].cast(pa.string()))
    pq.write_table(table, part)
    code, _, err = run(snapshot, tmp_path, capsys)
    assert code == EXIT_BAD_INPUT
    assert "tc_seq/part-00000.parquet: column 'next' has type string, expected int64" in err


def test_generate_rejects_bad_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["generate", "--txns", "10", "--out", str(tmp_path / "g"), "--anomalies", "bogus=1"])
    assert code == EXIT_BAD_INPUT
    assert "bad anomaly 'bogus=1'" in capsys.readouterr().err
