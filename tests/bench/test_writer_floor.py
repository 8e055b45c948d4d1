"""``python -m tc_server.bench.writer_floor`` runs the real writer on a real SQLite file: a few pairs per
group size, one line each (its figures are the README's, never asserted here)."""

from __future__ import annotations

import pytest

from tc_server.bench import writer_floor


def test_it_prints_one_line_per_group_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert writer_floor.main(["--pairs", "40", "--group", "4", "--group", "16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:]] == ["4", "16"]
    assert all(line.rstrip().endswith("us") for line in lines[2:])
