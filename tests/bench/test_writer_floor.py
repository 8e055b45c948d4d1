"""``python -m tc_server.bench.writer_floor`` runs the real writer on a real SQLite file: a few pairs per
group size, one line each (its figures are the README's, never asserted here)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from tc_server.bench import writer_floor
from tc_server.store.embedded import DB_FILENAME


@pytest.mark.parametrize("shape", [[], ["--earlier-shape"]])
def test_it_prints_one_line_per_group_size(capsys: pytest.CaptureFixture[str], shape: list[str]) -> None:
    assert writer_floor.main(["--pairs", "40", "--group", "4", "--group", "16", *shape]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:]] == ["4", "16"]
    # CPU and wall time per pair, then the WAL pages per pair: each group wrote some.
    assert all(line.split()[1].endswith("us") and float(line.split()[3]) > 0 for line in lines[2:])


def test_page_size_makes_the_file_with_pages_of_that_size(tmp_path: Path) -> None:
    """``--page-size``: the file the pairs are written to has SQLite pages of that size (docs/performance.md,
    *Smaller pages*), and each group still wrote some."""
    cpu_us, wall_us, pages = writer_floor.run(tmp_path, 40, 4, page_size=1024)
    with closing(sqlite3.connect(tmp_path / DB_FILENAME)) as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 1024
    assert pages > 0
