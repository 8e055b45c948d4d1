"""The official Java client (org.apache.pulsar:pulsar-client 4.x) and Go client against ``tc-server run
--workers 2``: their service URL is the port both workers share; they find each coordinator's worker by
LOOKUP (tc_server/workers.py); the Java client keeps committing while a worker is killed with SIGKILL and
restarted by the supervisor (tc_server/supervisor.py).

Built by `make interop-java` / `make interop-go`; the scenarios are in tests/interop/java (TcInterop.java)
and tests/interop/go/main.go.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.interop.conftest import COORDINATORS, Harness, HarnessRun, RunningHarness, TcServer

pytestmark = [pytest.mark.java, pytest.mark.slow]

WORKERS = 2
RESTART_BOUND_S = 60.0


def header(server: TcServer, most: int, least: int) -> tuple[int, Any]:
    """The header as its coordinator's worker shows it on its own admin port."""
    return server.get_json(f"/admin/v3/transactions/transactionMetadata/{most}/{least}", timeout_s=10,
                           worker=most % WORKERS)


def check_spread(run: HarnessRun, server: TcServer, count: int) -> None:
    """Every txn succeeded, every coordinator was used, and each header is in its coordinator's worker's
    store (each worker has its own: a header found there was written by that worker)."""
    txns = run.events("txn")
    assert len(txns) == count and all(t["outcome"] == "ok" for t in txns), run.stderr_tail()
    assert {t["most"] for t in txns} == set(range(COORDINATORS))
    wrong = []
    for t in txns:
        want = "COMMITTED" if t["action"] == "commit" else "ABORTED"
        code, body = header(server, t["most"], t["least"])
        if code != 200 or body["status"] != want:
            wrong.append((t, code, body))
    assert not wrong, wrong[:5]


def test_java_client_uses_every_coordinator_through_the_shared_port(java_harness: Harness,
                                                                     tc_server_factory: Any) -> None:
    server = tc_server_factory(extra_args=["--workers", str(WORKERS)]).start()
    run = java_harness.run("concurrent", service_url=server.url, count=400)
    assert run.result["coordinators"] == COORDINATORS
    assert None not in run.result["handler_connections"]
    check_spread(run, server, 400)


@pytest.mark.golang
def test_go_client_uses_every_coordinator_through_the_shared_port(go_harness: Harness,
                                                                   tc_server_factory: Any) -> None:
    server = tc_server_factory(extra_args=["--workers", str(WORKERS)]).start()
    check_spread(go_harness.run("concurrent", service_url=server.url, count=400), server, 400)


def test_java_client_keeps_committing_while_a_worker_is_killed(
        java_harness: Harness, tc_server_factory: Any, harness_process: list[RunningHarness], tmp_path: Path) -> None:
    server = tc_server_factory(extra_args=["--workers", str(WORKERS)]).start()
    stop = tmp_path / "stop-commit-loop"
    loop = java_harness.spawn("commit-loop", service_url=server.url, until_file=stop, op_timeout_ms=20_000)
    harness_process.append(loop)
    loop.wait_for("ready", 1, 60)
    loop.wait_for("committed", 50, 60)
    _, ready = server.get_json("/readyz")
    killed = ready["workers"][1]["pid"]
    os.kill(killed, signal.SIGKILL)
    killed_at = len(loop.lines)
    deadline = time.monotonic() + RESTART_BOUND_S
    while True:
        code, ready = server.get_json("/readyz")
        if code == 200 and ready["workers"][1]["pid"] != killed:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"worker 1 not back within {RESTART_BOUND_S:.0f} s: {ready}\n{server.log_tail()}")
        time.sleep(0.2)
    restarted_at = len(loop.lines)
    after = loop.wait_for("committed", 100, 90, after=restarted_at)
    stop.touch()
    assert loop.finish(60) == 0, loop.stderr_tail()
    # The loop round-robins over every coordinator: after the restart it committed on worker 1's too.
    assert {c["most"] % WORKERS for c in after} == {0, 1}, after[:10]
    committed = [(c["most"], c["least"]) for c in loop.lines if c["event"] == "committed"]
    assert len(set(committed)) == len(committed), "a txn id was handed out twice across the restart"
    lost = [(most, least) for most, least in committed if header(server, most, least)[1].get("status") != "COMMITTED"]
    assert not lost, f"acknowledged commits not COMMITTED after the worker's SIGKILL: {lost[:5]}"
    print(f"commit loop: {len(committed)} committed, {killed_at} lines before the kill, "
          f"{sum(1 for line in loop.lines if line['event'] == 'error')} client errors during the outage")
