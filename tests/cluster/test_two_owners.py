"""Transactions over partitions owned by two different brokers of one real Pulsar 4.2.4 cluster (cluster.py),
tc-server in front as the clients' one service URL, the stock Java client (tests/interop/java).

Each topic is spread: its partitions' bundles are unloaded alternately to broker A and broker B, so one
transaction has participants on both brokers, and a tc-server whose --upstream-url names only one broker
gets LOOKUP redirects to the other for half of the partitions (its own deliveries and the clients'
forwarded lookups alike).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tc_server.bench.process import TcServerProcess
from tests.cluster.cluster import TwoBrokerCluster
from tests.cluster.support import forwarded, participant_requests, spread_topic, wait_outbox_empty
from tests.e2e.txn_support import exactly_once, result_of
from tests.interop.conftest import Harness
from tests.support.txn_ack import assert_acks_applied

pytestmark = [pytest.mark.java, pytest.mark.slow, pytest.mark.timeout(900)]

PARTITIONS = 4
COUNT = 16
HARNESS_TIMEOUT_S = 240
OP_TIMEOUT_MS = 30_000


def port_of(address: str | None) -> int | None:
    return None if not address else int(str(address).rsplit(":", 1)[1].strip("/"))


@pytest.mark.parametrize("upstream", ["a"])  # the other broker's partitions through redirects
@pytest.mark.parametrize("mode", ["upstream", "direct"])
def test_commit_reaches_both_owners(cluster: TwoBrokerCluster, java_harness: Harness,
                                    tc_front: Callable[..., TcServerProcess], mode: str, upstream: str) -> None:
    """(1)+(2): one txn produces to 4 partitions, two owned by A and two by B; tc-server knows only
    ``upstream``. Commit answers after both brokers acknowledged: every message arrives exactly once, no
    read horizon stays pinned, the outbox is empty, and 4 END_TXN_ON_PARTITION were acknowledged."""
    topic, owners = spread_topic(cluster, f"commit-{mode}-{upstream}", PARTITIONS)
    server = tc_front(upstream, "--lookup-connections", mode)
    result = result_of(java_harness.run("txn-produce", timeout_s=HARNESS_TIMEOUT_S, service_url=server.url,
                                        topic=topic, count=COUNT, action="commit", visible_wait_ms=1000,
                                        receive_timeout_ms=60_000, op_timeout_ms=OP_TIMEOUT_MS), server)
    assert result["partitions"] == PARTITIONS
    assert result["end"]["outcome"] == "ok", result["end"]
    assert result["visible_before_end"] == []
    assert exactly_once(result["received_after_end"], [f"txn-{i}" for i in range(COUNT)]) == {}, result
    assert sorted(result["received_with_markers"]) == sorted(result["markers_sent"]), result
    assert wait_outbox_empty(server) == [], server.log_tail()  # emptied after the answer
    counts = participant_requests(server)
    assert counts.get(("END_TXN_ON_PARTITION", "ok")) == PARTITIONS, (counts, forwarded(server))
    assert {cluster.owner_url(p) for p in owners} == {cluster.a.url, cluster.b.url}


@pytest.mark.parametrize("mode", ["upstream"])
def test_abort_is_never_visible_on_either_owner(cluster: TwoBrokerCluster, java_harness: Harness,
                                                tc_front: Callable[..., TcServerProcess], mode: str) -> None:
    """(1): an aborted txn over both brokers' partitions: nothing of it arrives, later plain messages do."""
    topic, _ = spread_topic(cluster, f"abort-{mode}", PARTITIONS)
    server = tc_front("a", "--lookup-connections", mode)
    result = result_of(java_harness.run("txn-produce", timeout_s=HARNESS_TIMEOUT_S, service_url=server.url,
                                        topic=topic, count=COUNT, action="abort", visible_wait_ms=1000,
                                        receive_timeout_ms=60_000, op_timeout_ms=OP_TIMEOUT_MS), server)
    assert result["end"]["outcome"] == "ok", result["end"]
    assert result["visible_before_end"] == [] and result["received_after_end"] == []
    assert sorted(result["received_with_markers"]) == sorted(result["markers_sent"]), result
    assert wait_outbox_empty(server) == [], server.log_tail()  # emptied after the answer
    assert participant_requests(server).get(("END_TXN_ON_PARTITION", "ok")) == PARTITIONS


@pytest.mark.parametrize("action", ["commit"])
def test_acks_on_partitions_of_both_owners(cluster: TwoBrokerCluster, java_harness: Harness,
                                           tc_front: Callable[..., TcServerProcess], action: str) -> None:
    """(1)+(2): acks in one txn on a subscription of a topic spread over both brokers; tc-server knows B
    only (A's partitions are reached by redirect). END_TXN_ON_SUBSCRIPTION reaches each owner."""
    topic, _ = spread_topic(cluster, f"ack-{action}", PARTITIONS)
    server = tc_front("b")
    result = result_of(java_harness.run("txn-ack", timeout_s=HARNESS_TIMEOUT_S, service_url=server.url,
                                        topic=topic, count=COUNT, action=action, receive_timeout_ms=60_000,
                                        op_timeout_ms=OP_TIMEOUT_MS), server)
    assert result["end"]["outcome"] == "ok", result["end"]
    assert_acks_applied(result, action, COUNT)
    assert wait_outbox_empty(server) == [], server.log_tail()  # emptied after the answer
    counts = participant_requests(server)
    assert counts.get(("END_TXN_ON_SUBSCRIPTION", "ok"), 0) >= 2, counts  # one per partition acked on
    # A retry after a connection's failure or a timeout on a loaded machine is fine; any other failure is not
    # (ServiceNotReady included: no bundle moves here, so it would be a delivery sent to the wrong owner).
    refused = {k: v for k, v in counts.items()
               if k[1] not in ("ok", "ConnectionClosed", "ConnectionFailed", "RequestTimedOut")}
    assert refused == {}, counts


@pytest.mark.parametrize("mode", ["proxy"])
def test_produce_consume_connects_to_each_owner(cluster: TwoBrokerCluster, java_harness: Harness,
                                               tc_front: Callable[..., TcServerProcess], mode: str) -> None:
    """(2): plain produce/consume through tc-server knowing only A. Each producer/consumer connection of
    a partition ends at that partition's owner: directly (direct), or relayed by tc-server with CONNECT's
    proxy_to_broker_url naming the owner (proxy; upstream when the broker asks for it)."""
    topic, owners = spread_topic(cluster, f"pc-{mode}", PARTITIONS)
    server = tc_front("a", "--lookup-connections", mode)
    result = result_of(java_harness.run("produce-consume", timeout_s=HARNESS_TIMEOUT_S, service_url=server.url,
                                        topic=topic, count=40, op_timeout_ms=OP_TIMEOUT_MS), server)
    assert result["sent"] == 40, result
    assert (result["missing"], result["duplicates"], result["unexpected"]) == (0, 0, 0), result
    connections = result["producer_connections"] + result["consumer_connections"]
    assert len(connections) == 2 * PARTITIONS and None not in connections, result
    owner_ports = {port_of(url) for url in owners.values()}
    for connection in connections:
        if port_of(connection["remote"]) == server.port:
            assert mode != "direct", connection
            assert port_of(connection.get("proxy_to")) in owner_ports, connection
        else:
            assert mode != "proxy", connection
            assert port_of(connection["remote"]) in owner_ports, connection
    # every owner is reached by some connection
    reached = {port_of(c.get("proxy_to")) if port_of(c["remote"]) == server.port else port_of(c["remote"])
               for c in connections}
    assert reached == owner_ports, (reached, owner_ports)
