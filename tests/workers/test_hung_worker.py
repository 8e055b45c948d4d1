"""A worker that hangs (SIGSTOP: a blocked event loop) while clients commit on every coordinator."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from tc_server.bench.process import descendants_of
from tests.support.proc_state import alive
from tests.support.server_process import started
from tests.workers.helpers import (
    COORDINATORS,
    Load,
    async_wait_for,
    not_committed,
    sample_of,
    worker_pids,
    workers_server,
)


async def test_a_hung_worker_is_replaced_and_the_service_recovers(tmp_path: Path) -> None:
    server = started(workers_server(tmp_path, "--id-block-size", "10"))
    load = Load(server.port, request_timeout_s=3.0)
    try:
        load.start()
        await async_wait_for(lambda: all(len(load.committed[i]) >= 3 for i in range(COORDINATORS)),
                             "commits on every coordinator")
        pids = await asyncio.to_thread(worker_pids, server)
        writers = descendants_of(pids[1])
        os.kill(pids[1], signal.SIGSTOP)
        stopped_at = time.monotonic()
        await async_wait_for(lambda: server.status("/readyz") == 503, "supervisor /readyz 503", bound_s=10)
        await async_wait_for(lambda: all(load.since(i, stopped_at) >= 3 for i in (0, 2)),
                             "worker 0's coordinators keep committing", bound_s=30)
        # Killed (with its writer) after WORKER_HUNG_S and restarted; its coordinators serve again.
        await async_wait_for(lambda: all(load.since(i, stopped_at) >= 3 for i in (1, 3)),
                             "coordinators 1 and 3 commit again", bound_s=90, step_s=0.5)
        assert not alive(pids[1]) and not any(alive(pid) for pid in writers)
        assert "worker not answering; killing it" in server.log_path.read_text()
        _, ready = await asyncio.to_thread(server.get_json, "/readyz")
        assert ready["workers"][0]["pid"] == pids[0]
    finally:
        await load.stop()
    try:
        lost = await asyncio.to_thread(not_committed, server, sample_of(load))
        assert not lost, f"acknowledged commits not COMMITTED: {lost[:10]}"
    finally:
        assert server.stop() == 0, server.log_tail()
