"""A worker that hangs (SIGSTOP: a blocked event loop) while clients commit on every coordinator."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from tc_server.bench.process import descendants_of
from tests.support.logged import json_objects
from tests.support.proc_state import alive
from tests.workers.helpers import (
    async_wait_for,
    worker_pids,
    workers_server,
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


def _worker_pid(supervisor_pid: int, index: int) -> int | None:
    """Worker ``index``'s pid, from the command lines of the supervisor's children (its /readyz is not up
    yet while the workers start)."""
    for pid in descendants_of(supervisor_pid):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"--worker-index" in argv and argv[argv.index(b"--worker-index") + 1] == str(index).encode():
                return pid
    return None


@pytest.mark.timeout(240)
def test_a_worker_that_hangs_before_it_ever_answers_is_replaced(tmp_path: Path) -> None:
    # Stopped (SIGSTOP) as soon as its process exists, long before its admin port binds: it never answered a
    # probe. It was left so for good (the supervisor's /readyz 503 forever, its /healthz 200, so no container
    # restart either), as only a worker that had been ready was ever taken for hung.
    server = workers_server(tmp_path)
    server.start(wait=False)
    stopped: int | None = None
    try:
        assert server.proc is not None
        deadline = time.monotonic() + 30
        while (stopped := _worker_pid(server.proc.pid, 1)) is None:
            assert time.monotonic() < deadline, "worker 1 was never started"
            time.sleep(0.005)
        os.kill(stopped, signal.SIGSTOP)
        # Killed after supervisor.WORKER_START_SILENT_S (60 s) and restarted: the service gets ready.
        server.wait_ready(timeout_s=180)
        assert not alive(stopped)
        killed = [line for line in json_objects(server.log_path.read_text().splitlines())
                  if line.get("event") == "worker not answering; killing it"]
        assert [(line["pid"], line["answered_since_start"]) for line in killed] == [(stopped, False)], killed
    finally:
        server.kill()
        if stopped is not None and alive(stopped):  # stopped before it asked to die with the supervisor
            os.kill(stopped, signal.SIGKILL)
