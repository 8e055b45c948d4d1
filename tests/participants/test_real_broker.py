"""Decisions reach a real Pulsar 4.2.4 broker (docs/participants.md): END_TXN_ON_PARTITION after the CAS.

tc-server runs in front of the session's broker (``--upstream-url``); a stock Java client (the interop
harness's ``txn-produce`` scenario, pulsar-client 4.2.4) produces in one txn over the 4 partitions of a
fresh topic. The Python ``pulsar-client`` wheel (3.13) has no transaction API, so the C++ client path
cannot be driven from Python here. The broker-down test speaks the protocol itself (tc_server.client):
a txn needs no message for END_TXN_ON_PARTITION to be sent and acknowledged.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tc_server.bench.process import TcServerProcess
from tc_server.client import connect
from tests.interop.conftest import Harness, java_harness
from tests.participants.test_outbox import http_json
from tests.support.pulsar_broker import COORDINATORS, PulsarBroker
from tests.support.server_process import started, undelivered
from tests.support.txn_ack import assert_acks_applied
from tests.support.waiting import async_wait_for

__all__ = ["java_harness"]

pytestmark = [pytest.mark.java, pytest.mark.slow, pytest.mark.timeout(600)]

PARTITIONS = 4
COUNT = 8
HARNESS_TIMEOUT_S = 180
# How long the broker-down test lets END_TXN wait for the participants (--participant-wait-s).
SHORT_WAIT_S = 2
# Bound on re-delivery once the broker is back (a restart, then the topic's transaction buffer recovery).
REDELIVERY_BOUND_S = 180


def start_server(broker: PulsarBroker, workdir: Path, *extra_args: str) -> TcServerProcess:
    return started(TcServerProcess(workdir / "data", "--upstream-url", broker.url, "--coordinators",
                                   str(COORDINATORS), *extra_args, log_path=workdir / "tc-server.log"))


@pytest.fixture
def server(pulsar_broker: PulsarBroker, tmp_path: Path) -> Iterator[TcServerProcess]:
    server = start_server(pulsar_broker, tmp_path)
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


def ack_in_txn(harness: Harness, server: TcServerProcess, topic: str, action: str) -> dict[str, Any]:
    run = harness.run("txn-ack", timeout_s=HARNESS_TIMEOUT_S, service_url=server.url, topic=topic,
                      count=COUNT, action=action, receive_timeout_ms=30_000)
    if run.events("fatal") or not run.events("result"):
        pytest.fail(f"txn-ack failed: {run.lines[-3:]}\n{run.stderr_tail()}\n{server.log_tail()}")
    return run.result


@pytest.mark.parametrize("action", ["commit", "abort"])
def test_acks_in_a_txn_reach_the_subscription(pulsar_broker: PulsarBroker, java_harness: Harness,
                                              server: TcServerProcess, action: str) -> None:
    topic = fresh_topic(pulsar_broker)
    result = ack_in_txn(java_harness, server, topic, action)
    assert result["end"]["outcome"] == "ok", result["end"]
    assert_acks_applied(result, action, COUNT)
    assert undelivered(server) == []
    assert metric(server, 'tc_server_participant_requests_total{command="END_TXN_ON_SUBSCRIPTION",outcome="ok"}') >= 1


def metric(server: TcServerProcess, prefix: str) -> float:
    """The sum of the samples whose line starts with ``prefix`` (name and the labels given)."""
    status, body = server.get("/metrics")
    assert status == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines() if line.startswith(prefix))


async def test_end_txn_answers_after_the_wait_while_the_broker_is_down(pulsar_broker: PulsarBroker,
                                                                       tmp_path: Path) -> None:
    """The broker is stopped under END_TXN: answered after --participant-wait-s; then tc-server is
    SIGKILLed with the decision undelivered, the broker started, tc-server restarted on the same store:
    the new process re-drives the outbox and the broker acknowledges."""
    topic = fresh_topic(pulsar_broker)
    partition = f"{topic}-partition-0"
    server = start_server(pulsar_broker, tmp_path, "--participant-wait-s", str(SHORT_WAIT_S))
    client = await connect("127.0.0.1", server.port)
    try:
        opened = await client.new_txn(tc_id=3)
        assert opened.error is None, opened
        added = await client.add_partition(3, opened.least, partition)
        assert added.error is None, added
        pulsar_broker.stop()
        try:
            ended = await client.end_txn(3, opened.least, commit=True)
            # The decision is durable: answered with success once --participant-wait-s passed.
            assert ended.error is None, ended
            waiting = await asyncio.to_thread(undelivered, server)
            assert waiting == [{"txnId": f"(3,{opened.least})", "status": "COMMITTED",
                                "finalizedTimestamp": waiting[0]["finalizedTimestamp"],
                                "participants": [{"topic": partition}]}]
            failures = metric(server, 'tc_server_participant_requests_total{command="END_TXN_ON_PARTITION"') - \
                metric(server, 'tc_server_participant_requests_total{command="END_TXN_ON_PARTITION",outcome="ok"}')
            assert failures >= 1, "no failed attempt was counted while the broker was down"
            client.close()
            server.kill()  # the decision is in the store, its delivery only in the outbox
        finally:
            pulsar_broker.start()
        server.start()
        # Delivery goes on by itself once the broker is back.
        deadline = time.monotonic() + REDELIVERY_BOUND_S
        while await asyncio.to_thread(undelivered, server):
            assert time.monotonic() < deadline, f"not delivered after the broker came back\n{server.log_tail()}"
            await asyncio.sleep(0.5)
        assert metric(server, 'tc_server_participant_requests_total{command="END_TXN_ON_PARTITION",outcome="ok"}') == 1
    finally:
        client.close()
        server.stop()


async def test_an_operator_drops_the_participant_of_a_deleted_namespace(pulsar_broker: PulsarBroker,
                                                                         tmp_path: Path) -> None:
    """A participant's namespace is deleted before the commit reaches it: no broker can ever be told, and
    the txn holds its coordinator's low watermark for good. The admin drop forgets that participant
    (docs/participants.md); the txn leaves the outbox, and nothing else is touched."""
    namespace = f"public/gone-{uuid.uuid4().hex[:8]}"
    pulsar_broker.create_namespace(namespace, {})
    topic = f"persistent://{namespace}/orders"
    pulsar_broker.create_topic(topic)
    server = start_server(pulsar_broker, tmp_path, "--participant-wait-s", str(SHORT_WAIT_S))
    client = await connect("127.0.0.1", server.port)
    try:
        opened = await client.new_txn(tc_id=5)
        assert (await client.add_partition(5, opened.least, topic)).error is None
        for path in (f"/admin/v2/persistent/{namespace}/orders", f"/admin/v2/namespaces/{namespace}"):
            code, body = pulsar_broker.request("DELETE", path)
            assert code in (200, 204), (path, code, body)
        assert (await client.end_txn(5, opened.least, commit=True)).error is None  # after the wait
        assert [entry["txnId"] for entry in await asyncio.to_thread(undelivered, server)] == [f"(5,{opened.least})"]
        # A delivery attempt has failed, or will: the counter is read until it says so (an attempt still
        # under way when END_TXN answered counts once it ends).
        failed = 'tc_server_participant_requests_total{command="END_TXN_ON_PARTITION",outcome="'
        await async_wait_for(lambda: metric(server, failed) - metric(server, failed + 'ok"}') >= 1,
                             "a failed delivery attempt counted", step_s=0.2)

        drop = (f"{server.admin_url}/admin/v3/transactions/undelivered/5/{opened.least}/drop?"
                + urllib.parse.urlencode({"topic": topic}))
        status, body = await asyncio.to_thread(http_json, drop, "POST")
        assert (status, body["participantsLeft"]) == (200, 0), body
        deadline = time.monotonic() + 30
        while await asyncio.to_thread(undelivered, server):
            assert time.monotonic() < deadline, server.log_tail()
            await asyncio.sleep(0.2)
        assert "participant dropped by an operator" in server.log_path.read_text()
    finally:
        client.close()
        server.stop()

