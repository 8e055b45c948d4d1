"""A worker that hangs (SIGSTOP: a blocked event loop) while clients commit on every coordinator."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from tc_server.bench.process import descendants_of
from tests.support.logged import json_objects
from tests.support.proc_state import alive
from tests.support.server_process import started
from tests.support.waiting import async_wait_for
from tests.workers.helpers import (
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
        await async_wait_for(lambda: server.status("/readyz") == 503, "supervisor /readyz 503", bound_s=10, step_s=0.2)
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


# A supervisor that takes a worker for hung after 20 s of silence before it is ready (WORKER_START_SILENT_S, 60 s):
# the patch is this process's own; its workers run as usual. It holds for every worker's start, the healthy ones
# too, whose admin port binds only once the store is open and the coordinators recovered: 6 s, then 10 s, could
# fail a slow start on a loaded machine (three test processes, some starting JVM brokers).
QUICK_S = 20.0
QUICK_TO_KILL_SILENT_STARTS = f"""
import sys
from tc_server import supervisor
supervisor.WORKER_START_SILENT_S = {QUICK_S}
from tc_server.cli import main
sys.exit(main())
"""


@pytest.mark.timeout(240)
def test_a_worker_that_hangs_before_it_ever_answers_is_replaced(tmp_path: Path) -> None:
    # Stopped (SIGSTOP) as soon as its process exists, long before its admin port binds: it never answered a
    # probe. It was left so for good (the supervisor's /readyz 503 forever, its /healthz 200, so no container
    # restart either), as only a worker that had been ready was ever taken for hung.
    server = workers_server(tmp_path)
    server.command = [sys.executable, "-c", QUICK_TO_KILL_SILENT_STARTS]
    server.start(wait=False)
    stopped: int | None = None
    try:
        assert server.proc is not None
        deadline = time.monotonic() + 30
        while (stopped := _worker_pid(server.proc.pid, 1)) is None:
            assert time.monotonic() < deadline, "worker 1 was never started"
            time.sleep(0.005)
        os.kill(stopped, signal.SIGSTOP)
        # Killed after supervisor.WORKER_START_SILENT_S (QUICK_S here) and restarted: the service gets ready.
        server.wait_ready(timeout_s=120)
        assert not alive(stopped)
        killed = [line for line in json_objects(server.log_path.read_text().splitlines())
                  if line.get("event") == "worker not answering; killing it"]
        assert [(line["pid"], line["answered_since_start"]) for line in killed] == [(stopped, False)], killed
    finally:
        server.kill()
        if stopped is not None and alive(stopped):  # stopped before it asked to die with the supervisor
            os.kill(stopped, signal.SIGKILL)


class IdleConnections:
    """A local client that keeps ``count`` idle connections open to ``port``, opening a new one for each that
    closes (a sidecar's or a scraper's keep-alive pool), from a thread."""

    def __init__(self, port: int, count: int) -> None:
        self._port, self._count = port, count
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> IdleConnections:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        held: list[socket.socket] = []
        while not self._stop.is_set():
            for sock in list(held):
                try:
                    if sock.recv(1, socket.MSG_DONTWAIT) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                held.remove(sock)
                sock.close()
            while len(held) < self._count:
                sock = socket.socket()
                try:
                    sock.connect(("127.0.0.1", self._port))
                except OSError:
                    sock.close()
                    break
                held.append(sock)
            time.sleep(0.02)
        for sock in held:
            sock.close()


@pytest.mark.timeout(240)
async def test_a_worker_whose_admin_port_is_full_of_local_connections_is_not_killed_as_hung(tmp_path: Path) -> None:
    # Its admin port takes 32 connections from one address: idle local ones took the restarted worker's every
    # slot, each probe was taken and closed at once, and the supervisor counted that as silence and killed the
    # healthy worker, again after each restart (a review). A connection closed at once is an event loop that runs.
    server = workers_server(tmp_path)
    server.command = [sys.executable, "-c", QUICK_TO_KILL_SILENT_STARTS]
    started(server)
    try:
        pids = worker_pids(server)
        with IdleConnections(server.admin_port + 2, 40):  # worker 1's admin port
            os.kill(pids[1], signal.SIGKILL)
            assert server.proc is not None
            supervisor_pid = server.proc.pid
            await async_wait_for(lambda: _worker_pid(supervisor_pid, 1) not in (None, pids[1]), "worker 1 restarted",
                                 bound_s=30, step_s=0.2)
            restarted = _worker_pid(supervisor_pid, 1)
            assert restarted is not None
            await async_wait_for(lambda: "admin connection refused" in server.log_path.read_text(),
                                 "the restarted worker's admin port full", bound_s=30, step_s=0.2)
            await asyncio.sleep(1.5 * QUICK_S)  # longer than the silence it would have been killed for
            assert alive(restarted), server.log_tail()
            assert "worker not answering; killing it" not in server.log_path.read_text(), server.log_tail()
        await async_wait_for(lambda: server.status("/readyz") == 200, "ready once the idle connections are gone",
                             bound_s=30, step_s=0.2)
        assert worker_pids(server)[1] == restarted
    finally:
        server.kill()


@pytest.mark.timeout(300)
def test_a_start_silent_for_good_stops_the_supervisor_saying_so(tmp_path: Path) -> None:
    # A start that never answers (an embedded store whose open takes longer than the bound, here a worker stopped
    # as soon as it exists) was killed and restarted for good: the kills are SIGKILLs, not counted as failed
    # starts, and nothing said why the worker never came up (a review).
    server = workers_server(tmp_path)
    server.command = [sys.executable, "-c", QUICK_TO_KILL_SILENT_STARTS]
    server.start(wait=False)
    stopped: set[int] = set()
    try:
        assert server.proc is not None
        deadline = time.monotonic() + 240  # three starts of QUICK_S each, and the backoffs between them
        while server.proc.poll() is None:
            assert time.monotonic() < deadline, "the supervisor never gave up"
            pid = _worker_pid(server.proc.pid, 1)
            if pid is not None and pid not in stopped:
                os.kill(pid, signal.SIGSTOP)
                stopped.add(pid)
            time.sleep(0.005)
        assert server.proc.returncode == 1, server.log_tail()
        assert len(stopped) == 3, stopped  # MAX_START_FAILURES
        last = server.log_path.read_text().strip().splitlines()[-1]
        assert (f"tc-server: worker 1 of 2 failed to start 3 times in a row: its admin port answered nothing for "
                f"{QUICK_S:.0f} s while it started") in last, server.log_tail()
    finally:
        server.kill()
        for pid in stopped:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
