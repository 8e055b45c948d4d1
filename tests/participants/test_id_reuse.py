"""Txn ids do not repeat across coordinators (coordinator/ids.py). A broker remembers the ids it saw aborted
(its transaction buffer's aborted-txn set, kept in its snapshot for as long as the data is kept) and drops
every message of such an id from dispatch.

The cluster used Pulsar's own coordinator (clients pointed at the broker); one txn was aborted on topic T.
The operator switches the clients to tc-server (docs/participants.md, "One coordinator per cluster").
tc-server's ids started at 0 too: its first txn on the same coordinator had the same id, produced on T and
committed, and the broker dropped the committed messages as aborted. The same with tc-server alone, across
two stores in front of the same brokers.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.txn_support import HARNESS_TIMEOUT_S
from tests.interop.conftest import Harness, java_harness
from tests.participants.test_real_broker import start_server
from tests.support.pulsar_broker import PulsarBroker

__all__ = ["java_harness"]

pytestmark = [pytest.mark.java, pytest.mark.slow, pytest.mark.timeout(600)]

COUNT = 5


def produce(harness: Harness, service_url: str, topic: str, action: str) -> dict[str, Any]:
    run = harness.run("txn-produce", timeout_s=HARNESS_TIMEOUT_S, service_url=service_url, topic=topic,
                      count=COUNT, action=action, visible_wait_ms=500, receive_timeout_ms=15_000)
    if run.events("fatal") or not run.events("result"):
        pytest.fail(f"txn-produce failed: {run.lines[-3:]}\n{run.stderr_tail()}")
    return run.result


def produce_on_a_new_store(broker: PulsarBroker, workdir: Path, harness: Harness, topic: str,
                           action: str) -> dict[str, Any]:
    """One txn of COUNT messages on ``topic``, ended by ``action``, through a tc-server on a new store."""
    workdir.mkdir()
    server = start_server(broker, workdir)
    try:
        return produce(harness, server.url, topic, action)
    finally:
        server.stop()

def test_committed_messages_survive_a_switch_from_the_brokers_coordinator(
        pulsar_broker: PulsarBroker, java_harness: Harness, tmp_path: Path) -> None:
    topic = f"persistent://public/default/switch-{uuid.uuid4().hex[:8]}"
    pulsar_broker.create_topic(topic, 1)
    pulsar_broker.wait_partitions_ready(topic, 1)
    # Before the switch: the brokers' own coordinator, one aborted txn on the topic.
    before = produce(java_harness, pulsar_broker.url, topic, "abort")
    assert before["end"]["outcome"] == "ok", before
    # After the switch: tc-server is the only coordinator; a committed txn on the same topic.
    after = produce_on_a_new_store(pulsar_broker, tmp_path / "tc-server", java_harness, topic, "commit")
    assert after["end"]["outcome"] == "ok", after
    same_id = (before["most"], before["least"]) == (after["most"], after["least"])
    assert sorted(after["received_after_end"]) == sorted(f"txn-{i}" for i in range(COUNT)), (
        f"committed txn ({after['most']},{after['least']}) lost its messages; the brokers' coordinator had "
        f"aborted ({before['most']},{before['least']}) on the topic (same id: {same_id})")


def test_committed_messages_survive_a_new_coordinator_store(pulsar_broker: PulsarBroker, java_harness: Harness,
                                                            tmp_path: Path) -> None:
    """The same with tc-server alone: a new store (a fresh deployment, a move from the embedded store to
    Oxia, a lost data directory) in front of the same brokers, whose ids started at 0 again."""
    topic = f"persistent://public/default/new-store-{uuid.uuid4().hex[:8]}"
    pulsar_broker.create_topic(topic, 1)
    pulsar_broker.wait_partitions_ready(topic, 1)
    before = produce_on_a_new_store(pulsar_broker, tmp_path / "first", java_harness, topic, "abort")
    assert before["end"]["outcome"] == "ok", before
    after = produce_on_a_new_store(pulsar_broker, tmp_path / "second", java_harness, topic, "commit")
    assert after["end"]["outcome"] == "ok", after
    assert sorted(after["received_after_end"]) == sorted(f"txn-{i}" for i in range(COUNT)), (
        f"committed txn ({after['most']},{after['least']}) lost its messages; the previous store's "
        f"({before['most']},{before['least']}) had been aborted on the topic")
