"""Timeouts under ``--workers 2``: a worker killed with ``kill -9`` while its txns are open comes back and
aborts them at their deadline (its own store, its own deadline queue); the other worker's txns time out
meanwhile as usual."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tc_server.bench.process import TcServerProcess
from tests.support.routed_txns import txns_on_coordinators
from tests.support.server_process import started

pytestmark = pytest.mark.slow

COORDINATORS = 4
WORKERS = 2
TTL_MS = 4_000
BOUND_S = 60.0


def status_of(server: TcServerProcess, most: int, least: int) -> str | None:
    try:
        code, body = server.get_json(f"/admin/v3/transactions/transactionMetadata/{most}/{least}", timeout_s=10,
                                     worker=most % WORKERS)
    except OSError:
        return None
    return body.get("status") if code == 200 else None


async def test_a_worker_killed_with_open_txns_aborts_them_once_back(tmp_path: Path) -> None:
    server = started(TcServerProcess(tmp_path / "data", "--workers", str(WORKERS), "--coordinators",
                                     str(COORDINATORS), log_path=tmp_path / "server.log"))
    try:
        opened = await txns_on_coordinators(server.port, COORDINATORS, [0, 1, 2, 3] * 3, commit=None, ttl_ms=TTL_MS)
        _, ready = server.get_json("/readyz")
        victim = ready["workers"][1]["pid"]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + BOUND_S
        left = set(opened)
        while left and time.monotonic() < deadline:
            left = {txn for txn in left if status_of(server, *txn) != "ABORTED"}
            time.sleep(0.3)
        assert not left, (sorted(left), server.log_tail())
    finally:
        assert server.stop() == 0
