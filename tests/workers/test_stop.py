"""SIGTERM and SIGKILL to the supervisor of ``--workers 2`` while clients commit, or while a worker hangs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from tc_server.bench.process import TcServerProcess, descendants_of
from tests.support.proc_state import alive
from tests.support.server_process import started
from tests.support.waiting import async_wait_for
from tests.workers.helpers import (
    worker_pids,
    workers_server,
    workers_under_load,
)


async def test_sigterm_under_load_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    async with workers_under_load(tmp_path, commits_first=20) as (server, _):
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(server.proc.wait, 30)  # a bound on a hang, not a measure
        assert code == 0, server.log_tail()
        # Every worker drained and stopped by itself: none was left for the bound's kill.
        assert "workers not stopped within the bound" not in server.log_path.read_text(), server.log_tail()


@contextlib.contextmanager
def worker_1_hung(base: Path) -> Iterator[tuple[TcServerProcess, list[int], list[int]]]:
    """A ``--workers 2`` server whose worker 1 is stopped (SIGSTOP: a blocked event loop): the server, its
    workers' pids, and every process of theirs (their store writers too). Killed after the block if it runs."""
    server = started(workers_server(base))
    try:
        pids = worker_pids(server)
        family = [pid for worker in pids for pid in (worker, *descendants_of(worker))]
        os.kill(pids[1], signal.SIGSTOP)
        yield server, pids, family
    finally:
        server.kill()


def stopping_said(server: TcServerProcess) -> tuple[int, bool] | None:
    """(status, ready) of the supervisor's /readyz once its problems say it is stopping; None before."""
    with contextlib.suppress(OSError):
        code, body = server.get_json("/readyz", timeout_s=1.0)
        if isinstance(body, dict) and any("stopping" in problem for problem in body.get("problems", [])):
            return code, body["ready"]
    return None


async def test_sigterm_with_a_hung_worker_stops_within_the_bound(tmp_path: Path) -> None:
    with worker_1_hung(tmp_path) as (server, _, family):
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        # Not ready from the stop's start, saying why (a review: the last poll's answers were repeated for up to
        # a poll and a probe more, while the workers no longer took connections).
        said = await async_wait_for(lambda: stopping_said(server), "the supervisor's /readyz says it is stopping",
                                    bound_s=10.0, step_s=0.1)
        assert said == (503, False), said
        code = await asyncio.to_thread(server.proc.wait, 40)  # a bound on a hang, not a measure
        assert code == 0, server.log_tail()
        # The stopped worker was killed at the stop's bound (supervisor.WORKER_STOP_S), not waited for.
        assert "workers not stopped within the bound; killing them" in server.log_path.read_text(), server.log_tail()
        assert not any(alive(pid) for pid in family), "a worker or a writer outlived the supervisor"
        started(server)  # ports and store locks free at once
        assert server.stop() == 0


async def test_a_killed_supervisor_with_a_hung_worker_can_be_started_again_at_once(tmp_path: Path) -> None:
    with worker_1_hung(tmp_path) as (server, pids, family):
        for writer in descendants_of(pids[0]):
            os.kill(writer, signal.SIGSTOP)  # worker 0's writer frozen too (a stalled disk)
        server.kill()
        await async_wait_for(lambda: not any(alive(pid) for pid in family), "every worker and writer gone",
                             bound_s=10)
        started(server)
        assert server.stop() == 0


# A supervisor whose admin server's stop fails with EIO once it has stopped (the workers are its children, run as
# usual: the patch is this process's own).
SUPERVISOR_FAILING_ADMIN_STOP = """
import errno, sys
from tc_server.admin.http import AdminServer
stopped = AdminServer.stop
async def stop_then_fail(self):
    await stopped(self)
    raise OSError(errno.EIO, "Input/output error")
AdminServer.stop = stop_then_fail
from tc_server.cli import main
sys.exit(main())
"""


def test_a_supervisor_stop_that_fails_is_said_as_such_not_as_a_failure_to_start(tmp_path: Path) -> None:
    # It said "tc-server: cannot start: [Errno 5] Input/output error", exit 2 (a setting or a file is wrong).
    server = started(TcServerProcess(tmp_path / "data", "--workers", "2", "--coordinators", "4",
                                     command=[sys.executable, "-c", SUPERVISOR_FAILING_ADMIN_STOP],
                                     log_path=tmp_path / "server.log"))
    pids = worker_pids(server)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(40) == 1, server.log_tail()  # a bound on a hang, not a measure
    assert not any(alive(pid) for pid in pids), "a worker outlived the supervisor"
    last = server.log_path.read_text().strip().splitlines()[-1]
    assert "tc-server: the stop did not finish: OSError: [Errno 5] Input/output error" in last, server.log_tail()
    assert "cannot start" not in server.log_path.read_text(), server.log_tail()
