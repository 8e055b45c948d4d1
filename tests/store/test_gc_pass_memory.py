"""Long runs: a GC pass must not hold every collectable header in memory at once.

Under sustained load with the defaults (--gc-interval-s 300, --gc-retention-s 900) each pass collects about
rate x 300 s headers. sweeps.collect_garbage read every candidate of the pass into one list before working
through it a page (128) at a time, so the pass's peak memory grew with the backlog: ~0.4 KB per header
(+80 MB for 200,000; at 5,000 txn/s a default pass is 1.5 million headers, ~600 MB on top of the server's
steady state). It now collects each page as the scan reaches it, as the store's scans and recovery stream
theirs (issue 15)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tc_server.bench.gc_pass import fill
from tc_server.bench.process import rss_bytes_of
from tc_server.store import open_store
from tests.support.server_process import ServerProcess, started

pytestmark = pytest.mark.slow

HEADERS = 200_000
# What one pass may add to the server's peak RSS: a paged pass holds a page of candidates (and SQLite its
# page cache), a few MB; the whole candidate list is ~80 MB here.
PASS_BOUND_BYTES = 32 * 1024 * 1024


async def test_a_gc_pass_over_a_large_backlog_keeps_memory_bounded(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = await open_store("embedded", data_dir=str(data))
    try:
        await fill(store, HEADERS)  # ended headers, long past any retention, no op or participant records
    finally:
        await store.close()
    server = started(ServerProcess(data, "--gc-retention-s", "0", "--gc-interval-s", "8"))
    try:
        time.sleep(3)  # started and idle, before the first pass
        assert server.proc is not None
        before = rss_bytes_of(server.proc.pid, "VmHWM")
        deadline = time.monotonic() + 90
        while '"gc pass"' not in server.log_tail(10):
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.5)
        after = rss_bytes_of(server.proc.pid, "VmHWM")
        assert f'"deleted": {HEADERS}' in server.log_tail(10)
        assert after - before < PASS_BOUND_BYTES, (f"peak RSS {before / 1e6:.0f} MB before the pass, "
                                                   f"{after / 1e6:.0f} MB after it")
    finally:
        server.stop()
