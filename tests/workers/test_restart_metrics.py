"""A worker killed with -9 and restarted by the supervisor starts its counters from 0. Nothing in its own scrape
said it restarted (a review's): no process_start_time_seconds, nor any process_* series, as the server's own
registries left prometheus_client's process collector out. A reset whose new value has grown past the old one
by the next scrape is invisible to rate() and increase(), and the memory before an out-of-memory kill was not
exported either."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.support.server_process import started
from tests.workers.helpers import scrape, worker_pids, workers_server


def test_a_restarted_worker_exports_its_new_start_time(tmp_path: Path) -> None:
    server = started(workers_server(tmp_path))
    try:
        before = scrape(server, 1)
        for series in ("process_start_time_seconds", "process_resident_memory_bytes", "process_open_fds"):
            assert series in before and series in scrape(server), series
        pids = worker_pids(server)
        os.killpg(pids[1], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while worker_pids(server)[1] in (None, pids[1]) or server.status("/readyz") != 200:
            assert time.monotonic() < deadline, "worker 1 not restarted and ready within 60 s"
            time.sleep(0.2)
        assert scrape(server, 1)["process_start_time_seconds"] > before["process_start_time_seconds"]
    finally:
        server.stop()
