"""Decisions for a partition whose bundle was unloaded after tc-server last delivered to it: tc-server
remembers the old owner, the topic is loaded nowhere (an unload leaves it so until a client looks it up
and connects), and the decision must still reach it. Driven with tc-server's own wire client (a txn needs
no message for END_TXN_ON_* to be sent and acknowledged), on the two-broker cluster."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Callable

import pytest

from tc_server.bench.process import TcServerProcess
from tc_server.client import connect
from tests.cluster.cluster import TwoBrokerCluster, put_following
from tests.cluster.support import participant_requests, spread_topic, wait_outbox_empty
from tests.support.server_process import undelivered

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SUB = "held"
BOUND_S = 60.0


@pytest.mark.parametrize("participant", ["partition", "subscription"])
async def test_decision_reaches_a_partition_unloaded_since_the_last_delivery(
        cluster: TwoBrokerCluster, tc_front: Callable[..., TcServerProcess], participant: str) -> None:
    """A first txn teaches tc-server that B owns the partition; the bundle is then unloaded (plain unload:
    the topic is closed on B and loaded nowhere); a second txn on the same participant is committed. The
    outbox must empty within tens of seconds, every attempt ending in an acknowledgement."""
    topic, owners = spread_topic(cluster, f"unloaded-{participant[:4]}", 4)
    partition = next(p for p, url in owners.items() if url == cluster.b.url)
    tenant, ns, local = partition.removeprefix("persistent://").split("/", 2)
    code, body = put_following(
        cluster.admin(), f"/admin/v2/persistent/{tenant}/{ns}/{urllib.parse.quote(local, safe='')}/subscription/{SUB}")
    assert code in (200, 204, 409), (code, body)
    server = tc_front("both", "--participant-wait-s", "2")
    client = await connect("127.0.0.1", server.port)
    try:
        async def one_txn() -> None:
            opened = await client.new_txn(tc_id=2)
            assert opened.error is None, opened
            added = (await client.add_partition(2, opened.least, partition) if participant == "partition"
                     else await client.add_subscription(2, opened.least, partition, SUB))
            assert added.error is None, added
            ended = await client.end_txn(2, opened.least, commit=True)
            assert ended.error is None, ended

        await one_txn()
        # END_TXN answers after --participant-wait-s (2 s) even when delivery is still under way, and the
        # first delivery loads the topic on B (a txn-buffer recovery that can take longer): wait for it.
        left = await asyncio.to_thread(wait_outbox_empty, server, BOUND_S)
        assert left == [], (participant_requests(server), server.log_tail())
        # Unload the partition's bundle: no destination, nobody loads the topic again until asked.
        await asyncio.to_thread(cluster.unload_bundle, f"{tenant}/{ns}", cluster.bundle_of(partition), None,
                                cluster.b)
        t0 = time.monotonic()
        await one_txn()
        while await asyncio.to_thread(undelivered, server):
            assert time.monotonic() - t0 < BOUND_S, (
                f"decision not delivered {BOUND_S:.0f}s after the unload: {participant_requests(server)}\n"
                f"{server.log_tail()}")
            await asyncio.sleep(0.5)
        took = time.monotonic() - t0
        counts = participant_requests(server)
        print(f"delivered {took:.1f}s after the unload; {counts}")
        refused = {k: v for k, v in counts.items() if k[1] not in ("ok", "ServiceNotReady", "ConnectionClosed",
                                                                    "RequestTimedOut", "ConnectionFailed")}
        assert refused == {}, (refused, server.log_tail())
    finally:
        client.close()
