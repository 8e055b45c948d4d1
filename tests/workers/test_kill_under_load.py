"""SIGKILL of one worker and its store writer while clients commit on every coordinator (real processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from tc_server.bench.process import TcServerProcess, descendants_of
from tests.support.proc_state import alive
from tests.support.waiting import async_wait_for
from tests.workers.helpers import (
    COORDINATORS,
    worker_pids,
    workers_under_load,
)


def _worker_ready_metric(server: TcServerProcess, index: int) -> str | None:
    for line in server.get("/metrics")[1].decode().splitlines():
        if line.startswith(f'tc_server_worker_ready{{worker="{index}"}}'):
            return line.rsplit(" ", 1)[1]
    return None


async def test_a_worker_killed_with_its_writer_under_load_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    async with workers_under_load(tmp_path, commits_first=5) as (server, load):
        pids = await asyncio.to_thread(worker_pids, server)
        writers = descendants_of(pids[1])
        assert writers, "worker 1 has its store writer"
        os.killpg(pids[1], signal.SIGKILL)  # the worker and its writer together (a node's OOM kill of the group)
        killed_at = time.monotonic()

        # While it is down: the supervisor says so at once, the other worker goes on committing.
        await async_wait_for(lambda: server.status("/readyz") == 503, "supervisor /readyz 503 while worker 1 is down",
                             bound_s=5, step_s=0.2)
        await async_wait_for(lambda: all(load.since(i, killed_at) >= 3 for i in (0, 2)),
                             "worker 0's coordinators keep committing", bound_s=30)

        # Back: clients of coordinators 1 and 3 find the new worker 1 and commit again.
        await async_wait_for(lambda: all(load.since(i, killed_at) >= 3 for i in (1, 3)),
                             "coordinators 1 and 3 commit again after the restart")
        assert server.running()
        assert (await asyncio.to_thread(worker_pids, server))[0] == pids[0]
        assert not any(alive(pid) for pid in writers)
        await async_wait_for(lambda: _worker_ready_metric(server, 1) == "1.0", "tc_server_worker_ready 1 again",
                             step_s=0.2)
    # Ids handed out after the restart never repeat one acknowledged before it.
    for tc_id in range(COORDINATORS):
        leasts = [least for _, least, _ in load.committed[tc_id]]
        assert len(leasts) == len(set(leasts)), f"coordinator {tc_id} handed an id out twice"
