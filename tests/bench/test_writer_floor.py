"""``python -m tc_server.bench.writer_floor`` runs the real writer on a real SQLite file: a few pairs per
group size, one line each (its figures are the README's, never asserted here)."""

from __future__ import annotations

import pytest

from tc_server.bench import writer_floor


@pytest.mark.parametrize("shape", [[], ["--earlier-shape"]])
def test_it_prints_one_line_per_group_size(capsys: pytest.CaptureFixture[str], shape: list[str]) -> None:
    assert writer_floor.main(["--pairs", "40", "--group", "4", "--group", "16", *shape]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:]] == ["4", "16"]
    # CPU and wall time per pair, then the WAL pages per pair: each group wrote some.
    assert all(line.split()[1].endswith("us") and float(line.split()[3]) > 0 for line in lines[2:])
