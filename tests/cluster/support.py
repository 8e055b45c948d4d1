"""Helpers of the two-broker tests: topics whose partitions are owned by both brokers, the outbox
and the participant metrics of a tc-server."""

from __future__ import annotations

import time
import uuid
from typing import Any

from tc_server.bench.process import TcServerProcess
from tests.cluster.cluster import TwoBrokerCluster
from tests.support.server_process import undelivered

NAMESPACE = "public/rc"
DEDUP_NAMESPACE = "public/rc-dedup"
BUNDLES = 16


def partitions_of(topic: str, n: int) -> list[str]:
    return [f"{topic}-partition-{i}" for i in range(n)]


def spread_topic(cluster: TwoBrokerCluster, name: str, partitions: int = 4, namespace: str = NAMESPACE,
                 policies: dict[str, Any] | None = None) -> tuple[str, dict[str, str]]:
    """A fresh partitioned topic whose partitions are owned by both brokers, transaction buffers ready.
    Returns (topic, partition -> owner url).

    No unloads: the namespace has 16 bundles and the load manager spreads a namespace's bundles evenly
    (loadBalancerDistributeBundlesEvenlyEnabled), so the first lookups of a topic's partitions give them to
    both brokers; a topic that landed on one broker only is replaced by another name. (Placing bundles
    with destinationBroker unloads left bundles, system topics' among them, "not served by this instance"
    for good on this ModularLoadManagerImpl cluster, and transaction buffers stuck in Initializing.)"""
    admin = cluster.admin()
    # A namespace of this topic's own whose __transaction_buffer_snapshot bundle broker A (the standalone)
    # owns: when broker B owned it, A's own system-topic reader of it was told A and refused by A ("not
    # served by this instance"), forever, and every transaction buffer A loaded in that namespace stayed
    # in Initializing. A standalone-in-a-cluster quirk of Pulsar, kept out of the tests' way.
    for _ in range(12):
        candidate = f"{namespace}-{uuid.uuid4().hex[:6]}"
        admin.create_namespace(candidate, {"bundles": {"numBundles": BUNDLES}, **(policies or {})})
        if cluster.owner_url(f"persistent://{candidate}/__transaction_buffer_snapshot") == cluster.a.url:
            namespace = candidate
            break
    else:
        raise AssertionError("no namespace whose snapshot topic broker A owns")
    # ... and no partition in that topic's bundle: a test that moves the partition would move the snapshot
    # topic with it, and A's transaction buffers loaded afterwards never recovered ("could not get the last
    # message" from their reader of it), holding the txn's messages back for good (test_ownership_moves failed
    # about 1 run in 5 this way, 2026-12-02).
    snapshot_bundle = cluster.bundle_of(f"persistent://{namespace}/__transaction_buffer_snapshot")
    owners: dict[str, str] = {}
    for _ in range(20):
        topic = f"persistent://{namespace}/{name}-{uuid.uuid4().hex[:8]}"
        admin.create_topic(topic, partitions)
        topic_partitions = partitions_of(topic, partitions)
        if any(cluster.bundle_of(p) == snapshot_bundle for p in topic_partitions):
            continue
        owners = {p: cluster.owner_url(p) for p in topic_partitions}
        if set(owners.values()) == {cluster.a.url, cluster.b.url}:
            admin.wait_partitions_ready(topic, partitions)
            assert {p: cluster.owner_url(p) for p in owners} == owners, "ownership moved while loading"
            return topic, owners
    raise AssertionError(f"no topic spread over both brokers, clear of {snapshot_bundle}, in 20 tries: {owners}")


def wait_outbox_empty(server: TcServerProcess, timeout_s: float = 120.0) -> list[Any]:
    """Poll the outbox until it is empty or the bound passes; returns what is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = undelivered(server)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def participant_requests(server: TcServerProcess) -> dict[tuple[str, str], float]:
    """tc_server_participant_requests_total as {(command, outcome): value}."""
    code, body = server.get("/metrics", timeout_s=10.0)
    assert code == 200
    out: dict[tuple[str, str], float] = {}
    for line in body.decode().splitlines():
        if not line.startswith("tc_server_participant_requests_total{"):
            continue
        labels, value = line.rsplit(" ", 1)
        fields = dict(part.split("=", 1) for part in labels[labels.index("{") + 1:-1].split(","))
        out[(fields["command"].strip('"'), fields["outcome"].strip('"'))] = float(value)
    return out


def forwarded(server: TcServerProcess) -> str:
    code, body = server.get("/metrics", timeout_s=10.0)
    assert code == 200
    return "\n".join(line for line in body.decode().splitlines()
                     if line.startswith(("tc_server_forwarded_requests_total", "tc_server_upstream_up",
                                         "tc_server_undelivered", "tc_server_participant")))
