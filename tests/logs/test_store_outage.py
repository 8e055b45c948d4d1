"""The embedded store's directory going read-only under a running tc-server (a real read-only bind mount,
tests/support/disk.py, needs root): what the log says while it lasts."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.logs.support import named
from tests.store.test_disk_trouble import load
from tests.support.disk import bind_mounted, remount, tmpfs, writer_pid
from tests.support.server_process import ServerProcess, started

OUTAGE_S = 5.0


async def test_a_read_only_store_is_not_an_error_line_per_write(tmp_path: Path) -> None:
    # Each write on the read-only file fails (store_commit_failed, one line a second), the writer exits
    # after answering it, as designed, and the next write started a new one. Each such exit was logged
    # store_writer_lost at error level, without a limiter, why="it closed the channel": ~10 error
    # lines a second under a light load, none saying the disk is read-only.
    with tmpfs(tmp_path / "mnt", "64m") as mnt:
        data = mnt / "data"
        server = started(ServerProcess(data, "--coordinators", "1", "--request-timeout-s", "2",
                                       log_path=tmp_path / "tc.log"))
        try:
            assert set(await load(server.port, 0.5)) == {None}
            with bind_mounted(data):
                remount(data, read_only=True)
                assert server.proc is not None
                os.kill(writer_pid(server.proc.pid), signal.SIGKILL)
                began = time.monotonic()
                await load(server.port, OUTAGE_S)
                lasted = time.monotonic() - began
                remount(data, read_only=False)
        finally:
            server.kill()
    lost = named(tmp_path / "tc.log", "store_writer_lost")
    # One for the writer killed, then at most one a second (as store_commit_failed).
    assert len(lost) <= lasted + 3, (f"{len(lost)} store_writer_lost error lines in {lasted:.1f} s; "
                                     f"e.g. {lost[-1]}")
