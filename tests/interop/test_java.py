"""The official Java client (org.apache.pulsar:pulsar-client 4.x) against tc-server.

Built by `make interop-java`; see tests/interop/java/src/main/java/org/tcserver/interop/TcInterop.java
for what each scenario does on the client side.
"""

from __future__ import annotations

import pytest

from tests.interop.checks import check_concurrent, kill_restart
from tests.interop.conftest import COORDINATORS, Harness, TcServer, free_port

pytestmark = [pytest.mark.java, pytest.mark.slow]

EXC = "org.apache.pulsar.client.api.transaction.TransactionCoordinatorClientException$"


def test_concurrent_open_commit_abort(java_harness: Harness, tc_server: TcServer) -> None:
    run = java_harness.run("concurrent", service_url=tc_server.url, count=1000)
    result = run.result
    # build() returns only after every handler connected (TransactionCoordinatorClientImpl.start).
    assert result["coordinators"] == COORDINATORS
    assert None not in result["handler_connections"]
    check_concurrent(run, tc_server, 1000)


def test_timeout_then_commit(java_harness: Harness, tc_server: TcServer) -> None:
    result = java_harness.run("timeout", service_url=tc_server.url, txn_timeout_ms=2000, sleep_ms=6000).result
    # TransactionImpl's own timer moved the txn to TIME_OUT: commit() fails without reaching the server.
    assert result["commit"]["outcome"] == EXC + "InvalidTxnStatusException", result
    assert result["state_after_commit"] == "TIME_OUT"
    # END_TXN(COMMIT) sent by the TC client for the timed-out txn: the server refuses it as Pulsar's coordinator
    # does, TransactionNotFound (Flink's sink takes InvalidTxnStatus for "already committed"; docs/semantics.md)...
    assert result["tc_commit"]["outcome"] == EXC + "TransactionNotFoundException", result
    # ...and aborting what is already aborted is the idempotent success.
    assert result["tc_abort"]["outcome"] == "ok", result
    assert tc_server.wait_status(result["most"], result["least"], "ABORTED") == "ABORTED"


def test_tc_client_errors_keep_the_connection(java_harness: Harness, tc_server: TcServer) -> None:
    result = java_harness.run("tc-errors", service_url=tc_server.url).result
    steps = result["steps"]
    outcomes = {name: step["outcome"] for name, step in steps.items()}
    assert outcomes == {
        "commit": "ok",
        "commit_again": "ok",  # END_TXN is idempotent: the client re-sends it after a reconnect
        "abort_after_commit": EXC + "InvalidTxnStatusException",
        "commit_unknown": EXC + "TransactionNotFoundException",
        "abort_unknown": EXC + "TransactionNotFoundException",
        "commit_unknown_tc": EXC + "MetaStoreHandlerNotExistsException",  # never leaves the client
        "new_txn_commit": "ok",
    }, steps
    # Every answer came back typed and routed: an ERROR frame or a wrong txnid_most_bits would have
    # surfaced as a TimeoutException instead of the exceptions above. No handler changed connection.
    assert None not in result["connections_before"]
    assert result["connections_before"] == result["connections_after"]
    assert tc_server.txn(result["most"], result["least"])[1]["status"] == "COMMITTED"
    assert tc_server.txn(result["most"], result["unknown_least"])[0] == 404
    assert tc_server.txn(result["next_most"], result["next_least"])[1]["status"] == "COMMITTED"


def test_kill_restart_client_reconnects(java_harness: Harness, tc_server_factory, harness_process,
                                        tmp_path) -> None:
    server = tc_server_factory()
    server.start()
    summary = kill_restart(java_harness, server, harness_process, tmp_path)
    print("kill/restart:", summary)


def test_build_fails_without_server_then_succeeds(java_harness: Harness, tc_server_factory) -> None:
    port = free_port()
    nowhere = f"pulsar://127.0.0.1:{port}"
    failed = java_harness.run("build-only", service_url=nowhere, op_timeout_ms=3000).result
    assert failed["ok"] is False
    assert failed["error"]["class"] == "org.apache.pulsar.client.api.PulsarClientException", failed
    # It gave up by itself (the harness run is bounded by its subprocess timeout, so a hang fails
    # the test); how long it took is reported, not asserted: timing belongs in benchmarks.
    print("build without a server failed after", failed["elapsed_ms"], "ms")
    server = tc_server_factory(port=port)
    server.start()
    built = java_harness.run("build-only", service_url=server.url).result
    assert built["ok"] is True, built
    assert built["coordinators"] == COORDINATORS
