"""Decisions reach a real Pulsar 4.2.4 broker (docs/participants.md): END_TXN_ON_PARTITION after the CAS.

tc-server runs in front of the session's broker (``--upstream-url``); a stock Java client (the interop
harness's ``txn-produce`` scenario, pulsar-client 4.2.4) produces in one txn over the 4 partitions of a
fresh topic. The Python ``pulsar-client`` wheel (3.13) has no transaction API, so the C++ client path
cannot be driven from Python here.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tc_server.bench.process import TcServerProcess
from tests.interop.conftest import Harness, java_harness
from tests.support.front_door import start_front_door
from tests.support.pulsar_broker import PulsarBroker

__all__ = ["java_harness"]

pytestmark = [pytest.mark.java, pytest.mark.slow, pytest.mark.timeout(600)]

PARTITIONS = 4
COUNT = 8
HARNESS_TIMEOUT_S = 180


@pytest.fixture
def server(pulsar_broker: PulsarBroker, tmp_path: Path) -> Any:
    server = start_front_door(pulsar_broker.url, tmp_path)
    yield server
    server.stop()


def fresh_topic(broker: PulsarBroker) -> str:
    topic = f"persistent://public/default/participants-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, PARTITIONS)
    broker.wait_partitions_ready(topic, PARTITIONS)
    return topic


def produce(harness: Harness, server: TcServerProcess, topic: str, action: str) -> dict[str, Any]:
    run = harness.run("txn-produce", timeout_s=HARNESS_TIMEOUT_S, service_url=server.url, topic=topic,
                      count=COUNT, action=action, visible_wait_ms=1000, receive_timeout_ms=30_000)
    if run.events("fatal") or not run.events("result"):
        pytest.fail(f"txn-produce failed: {run.lines[-3:]}\n{run.stderr_tail()}\n{server.log_tail()}")
    return run.result


def undelivered(server: TcServerProcess) -> Any:
    status, body = server.get_json("/admin/v3/transactions/undelivered")
    assert status == 200, body
    return body


def test_commit_is_visible_once_commit_returns(pulsar_broker: PulsarBroker, java_harness: Harness,
                                               server: TcServerProcess) -> None:
    topic = fresh_topic(pulsar_broker)
    result = produce(java_harness, server, topic, "commit")
    assert result["partitions"] == PARTITIONS
    assert result["end"]["outcome"] == "ok", result["end"]
    assert result["visible_before_end"] == [], "a txn's messages were visible before its commit"
    assert sorted(result["received_after_end"]) == sorted(f"txn-{i}" for i in range(COUNT))
    # No read horizon is left pinned: a plain message on every partition arrives.
    assert sorted(result["received_with_markers"]) == sorted(result["markers_sent"])
    # END_TXN answered after every broker acknowledged: the outbox of this txn is already empty.
    assert undelivered(server) == []
    # Each of the 4 partitions got one END_TXN_ON_PARTITION, acknowledged.
    status, metrics = server.get("/metrics")
    assert status == 200
    assert 'tc_server_participant_requests_total{command="END_TXN_ON_PARTITION",outcome="ok"} 4.0' in \
        metrics.decode()


def test_abort_is_never_delivered_and_later_messages_are(pulsar_broker: PulsarBroker, java_harness: Harness,
                                                          server: TcServerProcess) -> None:
    topic = fresh_topic(pulsar_broker)
    result = produce(java_harness, server, topic, "abort")
    assert result["end"]["outcome"] == "ok", result["end"]
    assert result["visible_before_end"] == []
    assert result["received_after_end"] == []
    # The plain messages sent after the abort arrive, and none of the aborted ones with them.
    assert sorted(result["received_with_markers"]) == sorted(result["markers_sent"])
    assert undelivered(server) == []
