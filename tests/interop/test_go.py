"""The official Go client (github.com/apache/pulsar-client-go) against tc-server.

Built by `make interop-go`; see tests/interop/go/main.go. The Go client keeps its coordinator client
private, so the TC error mapping is covered by the Java driver; here the Go client's own path is checked:
discovery, NEW_TXN/END_TXN on protocol version 20, its client-side state checks, and reconnecting.
"""

from __future__ import annotations

import pytest

from tests.interop.checks import check_concurrent, kill_restart
from tests.interop.conftest import Harness, TcServer, free_port

pytestmark = [pytest.mark.golang, pytest.mark.slow]


def test_concurrent_open_commit_abort(go_harness: Harness, tc_server: TcServer) -> None:
    run = go_harness.run("concurrent", service_url=tc_server.url, count=1000)
    check_concurrent(run, tc_server, 1000)


def test_timeout_then_commit(go_harness: Harness, tc_server: TcServer) -> None:
    result = go_harness.run("timeout", service_url=tc_server.url, txn_timeout_ms=2000, sleep_ms=6000).result
    # The Go client times the txn out on its own timer and refuses Commit locally.
    assert result["state_before_commit"] == "TIME_OUT", result
    assert result["commit"]["outcome"] == "pulsar.Error/InvalidStatus", result
    # The server's timeout sweep aborts it.
    assert tc_server.wait_status(result["most"], result["least"], "ABORTED") == "ABORTED"


def test_end_states(go_harness: Harness, tc_server: TcServer) -> None:
    result = go_harness.run("ends", service_url=tc_server.url).result
    outcomes = {name: step["outcome"] for name, step in result["steps"].items()}
    assert outcomes == {
        "commit": "ok",
        "abort": "ok",
        # Refused by the client's state machine, not sent.
        "commit_again": "pulsar.Error/InvalidStatus",
        "abort_after_commit": "pulsar.Error/InvalidStatus",
        "abort_again": "pulsar.Error/InvalidStatus",
    }, result
    assert result["state"] == "COMMITTED" and result["other_state"] == "ABORTED"
    assert tc_server.txn(result["most"], result["least"])[1]["status"] == "COMMITTED"
    assert tc_server.txn(result["other_most"], result["other_least"])[1]["status"] == "ABORTED"


def test_kill_restart_client_reconnects(go_harness: Harness, tc_server_factory, harness_process,
                                        tmp_path) -> None:
    server = tc_server_factory()
    server.start()
    summary = kill_restart(go_harness, server, harness_process, tmp_path)
    print("kill/restart:", summary)


def test_build_fails_without_server_then_succeeds(go_harness: Harness, tc_server_factory) -> None:
    port = free_port()
    failed = go_harness.run("build-only", service_url=f"pulsar://127.0.0.1:{port}", op_timeout_ms=3000).result
    assert failed["ok"] is False, failed
    print("build without a server failed after", failed["elapsed_ms"], "ms")  # bounded by the harness timeout
    server = tc_server_factory(port=port)
    server.start()
    built = go_harness.run("build-only", service_url=server.url).result
    assert built["ok"] is True, built
