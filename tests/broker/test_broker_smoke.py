"""The real broker the other tests use (tests/support/pulsar_broker.py) starts and answers as a cluster does."""

from __future__ import annotations

import pytest

from tc_server.client import connect
from tests.support.pulsar_broker import ASSIGN_TOPIC, COORDINATORS, PulsarBroker

pytestmark = [pytest.mark.java, pytest.mark.slow]


async def test_broker_serves_sixteen_coordinators(pulsar_broker: PulsarBroker) -> None:
    # Our own wire client, over the Pulsar binary protocol, to the broker itself.
    client = await connect("127.0.0.1", pulsar_broker.port)
    try:
        answer = await client.partitioned_metadata(ASSIGN_TOPIC)
    finally:
        client.close()
    assert answer.error is None, answer
    assert answer.partitions == COORDINATORS


def test_partitioned_topic_becomes_ready(pulsar_broker: PulsarBroker) -> None:
    topic = "persistent://public/default/broker-smoke-ready"
    pulsar_broker.create_topic(topic, partitions=2)
    code, body = pulsar_broker.get_json("/admin/v2/persistent/public/default/broker-smoke-ready/partitions")
    assert (code, body["partitions"]) == (200, 2), body
    pulsar_broker.wait_partitions_ready(topic, 2)
