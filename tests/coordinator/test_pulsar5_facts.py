"""Facts of Pulsar 5's records a reader could get wrong, from a review against Pulsar 5.0.0-M1
(org.apache.pulsar:pulsar-broker:5.0.0-M1 from Maven Central, the jar `make pulsar-broker5` resolves, read with javap,
and its record classes serialised by Pulsar's own TxnMetadataStore.toJson on a JVM; apache/pulsar sources
TcLeader.java @ ba9bf6976035650e6f2637d5f441537afd4b27f0, TransactionCoordinatorV5.java @ the same commit).

Byte comparisons of headers, events, tc-seq, op records, leader JSON, index keys, Codec.encode and the Oxia
routing hash all matched; the tests below pin those facts, and the one mismatch found (a TLS-only broker's
leader record, which tc-server took for no leader).
"""

from __future__ import annotations

import asyncio

from tc_server.coordinator import layout
from tc_server.coordinator.layout import OpKind, TcLeader, TxnHeader, TxnOp, TxnState
from tc_server.coordinator.leadership import LeaderElection
from tc_server.store.memory import MemoryStore

# What TxnMetadataStore.toJson writes (measured on 5.0.0-M1's classes with its jackson 2.21.3 mapper).
PULSAR_EPOCH_ZERO = b'{"state":"OPEN","timeout":0.010000000,"createdAt":0.0}'
PULSAR_ACK_NOT_CUMULATIVE = (b'{"kind":"ACK","segment":"segment://public/default/orders/0","subscription":"my sub",'
                             b'"ledgerId":12,"entryId":3,"cumulative":false}')
# TcLeader is a Java record (brokerId, brokerServiceUrl, brokerServiceUrlTls, webServiceUrl); the mapper leaves
# nulls out. TcLeader.java (ba9bf69) documents brokerServiceUrl as "may be null if the broker only advertises a
# TLS endpoint", and TransactionCoordinatorV5.start() proposes new TcLeader(getBrokerId(), getBrokerServiceUrl(),
# getBrokerServiceUrlTls(), getSafeWebServiceAddress()) for every partition: a TLS-only broker writes this.
PULSAR_TLS_ONLY_LEADER = (b'{"brokerId":"broker-2:8080","brokerServiceUrlTls":"pulsar+ssl://10.0.0.6:6651",'
                          b'"webServiceUrl":"http://10.0.0.6:8080"}')


def test_pulsar_bytes_tc_server_must_match() -> None:
    assert TxnHeader(TxnState.OPEN, 0, 10).to_json() == PULSAR_EPOCH_ZERO
    assert TxnHeader.from_json(PULSAR_EPOCH_ZERO) == TxnHeader(TxnState.OPEN, 0, 10)
    op = TxnOp(OpKind.ACK, "segment://public/default/orders/0", 12, 3, subscription="my sub", cumulative=False)
    assert TxnOp.from_json(PULSAR_ACK_NOT_CUMULATIVE) == op and op.to_json() == PULSAR_ACK_NOT_CUMULATIVE
    assert TcLeader.from_json(PULSAR_TLS_ONLY_LEADER) == TcLeader(
        "broker-2:8080", None, "pulsar+ssl://10.0.0.6:6651", "http://10.0.0.6:8080")


async def test_a_tls_only_pulsar_leader_is_a_known_leader() -> None:
    """A Pulsar 5 broker that leads coordinator 0 without a plain listener writes a leader record with no
    brokerServiceUrl. tc-server must take it as led (by that broker, reachable at its TLS URL): before,
    LeaderElection._reconcile kept only records with a brokerServiceUrl, so coordinator 0 was missing from
    WATCH_TC_ASSIGNMENTS / LOOKUP answers and Coordinator.ready stayed False for as long as the broker led it."""
    store = MemoryStore()
    await store.put(layout.leader_path(0), PULSAR_TLS_ONLY_LEADER, ephemeral=True)

    async def nothing(_: int) -> None:
        return None

    election = LeaderElection(store, 2, "pulsar://10.0.0.9:6650", nothing, nothing,
                              advertised_url_tls="pulsar+ssl://10.0.0.9:6651")
    await election.start()
    try:
        await asyncio.sleep(0)
        assert 0 not in election.led  # the broker's, not taken over
        assert election.leaders.get(0) == "pulsar+ssl://10.0.0.6:6651", (
            f"coordinator 0 is led by a TLS-only Pulsar broker but tc-server knows no leader: {election.leaders}")
        assert election.tls_urls["pulsar+ssl://10.0.0.6:6651"] == "pulsar+ssl://10.0.0.6:6651"
    finally:
        await election.stop()
        await store.close()
