"""What a real Pulsar 4.2.4 broker answers when a participant's topic changes between ADD_* and the delivery
of the decision: unloaded, grown, force-deleted, its subscription deleted, terminated. Each test starts its
own tc-server (embedded store) in front of the session broker and drives the stock Java client (interop
harness) or the raw protocol (tc_server.client.connect)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tc_server.bench.process import TcServerProcess
from tc_server.client import connect
from tests.e2e.txn_support import HARNESS_TIMEOUT_S, OP_TIMEOUT_MS
from tests.interop.conftest import Harness, RunningHarness, java_harness
from tests.participants.test_real_broker import start_server
from tests.support.pulsar_broker import PulsarBroker, split_topic
from tests.support.server_process import undelivered

__all__ = ["java_harness"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def wait_delivered(server: TcServerProcess, bound_s: float) -> Any:
    deadline = time.monotonic() + bound_s
    left = undelivered(server)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = undelivered(server)
    return left


def fresh_topic(broker: PulsarBroker, partitions: int, namespace: str = "public/default") -> str:
    topic = f"persistent://{namespace}/changes-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions)
    if partitions:
        broker.wait_partitions_ready(topic, partitions)
    return topic


def admin_topic_path(topic: str) -> str:
    tenant, namespace, local = split_topic(topic)
    return f"/admin/v2/persistent/{tenant}/{namespace}/{urllib.parse.quote(local)}"


@pytest.fixture
def server(pulsar_broker: PulsarBroker, tmp_path: Path) -> Iterator[TcServerProcess]:
    server = start_server(pulsar_broker, tmp_path, "--participant-wait-s", "20")
    yield server
    server.stop()


def produce_paused(harness: Harness, server: TcServerProcess, topic: str, tmp_path: Path,
                   count: int = 8) -> tuple[RunningHarness, Path, Path]:
    before_end, after_end = tmp_path / "commit-now", tmp_path / "receive-now"
    run = harness.spawn("txn-produce", service_url=server.url, topic=topic, count=count, action="commit",
                        pause_before_end=before_end, pause_after_end=after_end, op_timeout_ms=OP_TIMEOUT_MS,
                        visible_wait_ms=500, receive_timeout_ms=30_000)
    produced = run.wait_for("produced", 1, HARNESS_TIMEOUT_S)[0]
    assert produced["visible_before_end"] == [], produced
    return run, before_end, after_end


# A change the broker makes to the topic while the txn is open (its admin request: method, path, body).
WHILE_OPEN = {
    "unloaded": ("PUT", "/unload", None),
    "partitions-grew": ("POST", "/partitions", 4),
}


@pytest.mark.java
@pytest.mark.parametrize("change", sorted(WHILE_OPEN))
def test_a_commit_after_the_topic_changed_is_visible_once_commit_returns(
        pulsar_broker: PulsarBroker, java_harness: Harness, server: TcServerProcess, tmp_path: Path,
        change: str) -> None:
    topic = fresh_topic(pulsar_broker, 2)
    run, before_end, after_end = produce_paused(java_harness, server, topic, tmp_path)
    try:
        method, path, body = WHILE_OPEN[change]
        code, answer = pulsar_broker.request(method, admin_topic_path(topic) + path, body)
        assert code in (200, 204), (code, answer)
        started_at = time.monotonic()
        before_end.touch()
        ended = run.wait_for("ended", 1, HARNESS_TIMEOUT_S)[0]
        took = time.monotonic() - started_at
        assert ended["end"]["outcome"] == "ok", ended
        # The acknowledged participants' records are deleted right after END_TXN's answer: soon, not at once.
        assert wait_delivered(server, 10) == [], (took, server.log_tail())
        after_end.touch()
        assert run.finish(HARNESS_TIMEOUT_S) == 0, run.stderr_tail()
        result = run.wait_for("result", 1, 5)[0]
        assert sorted(result["received_after_end"]) == sorted(f"txn-{i}" for i in range(8)), result
    finally:
        before_end.touch()
        after_end.touch()
        run.terminate()


async def commit_after(broker: PulsarBroker, tmp_path: Path, topic: str, change: tuple[str, str], *, tc_id: int,
                       subscription: str | None = None, wait_s: int = 5,
                       bound_s: float = 20) -> tuple[TcServerProcess, Any]:
    """A txn of coordinator ``tc_id`` adds ``topic`` (or its ``subscription``), the broker's admin API then
    makes ``change`` (method, path under the topic), and the txn commits: (the tc-server, stopped, and what
    it still had undelivered ``bound_s`` after the commit)."""
    server = start_server(broker, tmp_path, "--participant-wait-s", str(wait_s))
    client = await connect("127.0.0.1", server.port)
    try:
        opened = await client.new_txn(tc_id=tc_id)
        added = await (client.add_partition(tc_id, opened.least, topic) if subscription is None
                       else client.add_subscription(tc_id, opened.least, topic, subscription))
        assert added.error is None, added
        method, path = change
        code, body = broker.request(method, admin_topic_path(topic) + path)
        assert code in (200, 204), (code, body)
        assert (await client.end_txn(tc_id, opened.least, commit=True)).error is None
        return server, await asyncio.to_thread(wait_delivered, server, bound_s)
    finally:
        client.close()
        server.stop()


def loaded_topic(broker: PulsarBroker) -> str:
    topic = fresh_topic(broker, 0)
    code, body = broker.request("GET", admin_topic_path(topic) + "/stats")  # the broker loads it
    assert code == 200, (code, body)
    return topic


async def test_a_topic_deleted_before_the_commit_is_not_held_forever(pulsar_broker: PulsarBroker,
                                                                     tmp_path: Path) -> None:
    topic = loaded_topic(pulsar_broker)
    server, left = await commit_after(pulsar_broker, tmp_path, topic, ("DELETE", "?force=true"), tc_id=2)
    assert left == [], (left, server.log_tail())


async def test_a_subscription_deleted_before_the_commit_is_not_held_forever(pulsar_broker: PulsarBroker,
                                                                            tmp_path: Path) -> None:
    topic = fresh_topic(pulsar_broker, 0)
    code, body = pulsar_broker.request("PUT", admin_topic_path(topic) + "/subscription/sub-a")
    assert code in (200, 204), (code, body)
    server, left = await commit_after(pulsar_broker, tmp_path, topic, ("DELETE", "/subscription/sub-a"), tc_id=4,
                                      subscription="sub-a")
    assert left == [], (left, server.log_tail())


async def test_a_terminated_topic_is_reported_as_a_refusal_not_retried_quietly(pulsar_broker: PulsarBroker,
                                                                                tmp_path: Path) -> None:
    """A topic terminated between ADD and END_TXN: the broker answers PersistenceError
    (ManagedLedgerTerminatedException) to every END_TXN_ON_PARTITION for as long as the topic exists. It was
    retried as a passing failure, info lines only, every 5 s for ever, the txn holding its coordinator's low
    watermark; it is a refusal: a warning naming the topic, retried slowly (docs/participants.md)."""
    topic = loaded_topic(pulsar_broker)
    server, left = await commit_after(pulsar_broker, tmp_path, topic, ("POST", "/terminate"), tc_id=6, wait_s=3,
                                      bound_s=12)
    lines = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
    about = [line for line in lines if line.get("topic") == topic and "END_TXN" in line.get("event", "")]
    warnings = [line for line in about if line.get("level") in ("warning", "error")]
    assert left == [] or warnings, (
        f"undelivered after 12 s: {left}; {len(about)} lines about the topic, levels "
        f"{sorted({line['level'] for line in about})}, last: {about[-1] if about else None}")
