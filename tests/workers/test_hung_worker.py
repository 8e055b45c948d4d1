"""A worker that hangs (SIGSTOP: a blocked event loop) while clients commit on every coordinator."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from tc_server.bench.process import descendants_of
from tests.support.proc_state import alive
from tests.workers.helpers import (
    async_wait_for,
    worker_pids,
    workers_under_load,
)


async def test_a_hung_worker_is_replaced_and_the_service_recovers(tmp_path: Path) -> None:
    async with workers_under_load(tmp_path, commits_first=3, request_timeout_s=3.0) as (server, load):
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
        assert (await asyncio.to_thread(worker_pids, server))[0] == pids[0]
