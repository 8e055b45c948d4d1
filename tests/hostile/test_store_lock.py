"""The embedded store's lock lives on the database file itself (issue 15): deleting every other file
in the data directory does not let a second process in, and the lock dies with its process.
Real processes."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tc_server.bench.process import TcServerProcess
from tc_server.store.embedded import DB_FILENAME

# A second process that wrongly starts is stopped by this bound (the failure this test looks for).
REFUSAL_BOUND_S = 30.0


@pytest.fixture
def first(tmp_path: Path) -> Iterator[TcServerProcess]:
    server = TcServerProcess(tmp_path / "data").start()
    yield server
    server.kill()


def second_start(data_dir: Path) -> subprocess.CompletedProcess[str]:
    second = TcServerProcess(data_dir)
    try:
        return subprocess.run(second.argv, capture_output=True, text=True, timeout=REFUSAL_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail("a second tc-server started on a data directory a running one holds")


def test_a_second_process_is_refused_even_after_the_other_files_are_deleted(first: TcServerProcess) -> None:
    # The reflex after "is in use": delete whatever looks like a lock file. Only the database stays.
    for path in first.data_dir.iterdir():
        if path.name != DB_FILENAME and not path.name.startswith(DB_FILENAME + "-"):
            path.unlink()
    done = second_start(first.data_dir)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2, lines
    assert len(lines) == 1 and "in use" in lines[0] and str(first.data_dir / DB_FILENAME) in lines[0], lines
    assert first.running() and first.status("/readyz") == 200


def test_the_lock_dies_with_its_process(first: TcServerProcess) -> None:
    first.kill()  # SIGKILL: no unlock code runs
    first.start()
    assert first.status("/readyz") == 200
