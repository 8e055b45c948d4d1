"""Pulsar 5's v5 SDK commits through tc-server to a scalable topic on a real Pulsar 5 broker, end to end.

Components, all real except the store: a Pulsar 5.0.0-M1 standalone broker (tests/v5/broker5.py), the v5
SDK ``org.apache.pulsar:pulsar-client-v5`` 5.0.0-M1 (tests/v5/java, run once per step by
tests/v5/harness5.py), tc-server as a process, and the project's Oxia STAND-IN (one shard) that both the
broker (Pulsar's Java Oxia client 0.8.0) and tc-server use. tc-server starts first and leads the 16
coordinators; the topic ``topic://public/default/…`` is made scalable through the broker's admin API
(``PUT /admin/v2/scalable/{tenant}/{namespace}/{topic}?numInitialSegments=1``), so its segment
``segment://…`` has Pulsar's metadata-backed transaction buffer, which reads tc-server's headers and
events from the store (docs/record-layout.md).

One scenario, in order: a txn minted by tc-server (its coordinator's leader record and counters are
tc-server's) commits N messages, another aborts N, then plain messages; a consumer from the earliest
position gets the committed and plain ones and never the aborted ones. Then tc-server's GC
(``--gc-retention-s 0 --gc-interval-s 1``) deletes both headers once the broker has applied the
decisions and removed its op records, the broker restarts, and a new consumer from the earliest
position still gets the committed messages (and the plain ones, and more plain ones sent after the
restart), never the aborted ones.

Which URL the SDK is given, and why:

* **tc-server's URL** (with ``--upstream-url`` naming the broker) works, and is what this test uses.
  The SDK watches the coordinator assignments (WATCH_TC_ASSIGNMENTS) on a connection to its service
  URL and then dials each coordinator through that same connection with CONNECT's
  ``proxy_to_broker_url`` = the leader's URL, which is tc-server's own: tc-server serves it. Its
  producer's CONNECT names the broker, and tc-server carries that connection to the broker.
* **The broker's URL does not work with 5.0.0-M1's SDK** (a Pulsar client limitation): newTransaction
  times out after the operation timeout ("Create new transaction 1 failed due to timeout"), and the
  broker logs ``ServiceUnitNotReadyException ... transaction_coordinator_assign-partition-N not served
  by this instance`` from ``ServerCnx.handleTcClientConnectRequest`` (ServerCnx.java:3456, the
  ``scalable`` branch into ``TransactionCoordinatorV5.handleClientConnect``). Why: the watch connection
  comes from ``PulsarClientImpl.getAnyBrokerProxyConnection()``, whose logical address is
  ``PulsarChannelInitializer.PROXY_TO_ANY_BROKER``, so ``ClientCnx.setProxyToAnyBroker()`` sets
  ``proxyToTargetBrokerAddress = ""`` and ``ClientCnx.isProxied()`` is true for it even on a direct
  broker connection; ``WatchTcAssignmentsDiscovery`` then calls
  ``TransactionMetaStoreHandler.retargetLeader(leader, isProxied())`` and ``ConnectionHandler.grabCnx``
  takes ``PulsarClientImpl.getProxyConnection(leader)``: a connection to the broker carrying
  ``proxy_to_broker_url`` = tc-server. A broker is no proxy; it serves TC_CLIENT_CONNECT itself and
  refuses it because it does not lead that coordinator. So with 5.0.0-M1 the SDK reaches a
  coordinator led elsewhere only through a proxy (Pulsar's proxy, or tc-server).
* **Consumers use the broker's URL**: the v5 stream consumer refuses a service whose CONNECTED lacks
  ``supports_scalable_topics`` ("Broker does not support scalable topics"), and tc-server does not
  relay the scalable-topic lookup and subscription commands. Consumers need no coordinator here.

The stand-in serves Oxia's GetSequenceUpdates for this: the broker's participant waits on its segment's
event stream with it, and without it the broker retried in a tight loop (hundreds of thousands of log
lines a minute) and never applied a decision.

Against a real Oxia (not possible here: the Go module proxy refuses github.com/oxia-db/oxia), run one
with a single shard and namespace ``default`` and name it: ``TC_SERVER_V5_OXIA_ADDRESS=HOST:PORT
.venv/bin/pytest tests/v5/test_v5_sdk_e2e.py``.

`make test-broker5` builds the broker and the harness (`make pulsar-broker5`) and runs tests/v5; a
missing broker, harness or Java 21 fails these tests, never skips them (docs/architecture.md §9).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tc_server.bench.pulsar_broker import BrokerStartError
from tc_server.coordinator import layout
from tc_server.coordinator.layout import TcLeader
from tc_server.store.api import MetadataStore
from tc_server.store.oxia import connect as connect_oxia
from tests.support.oxia_standin import StandinStartError, standin_oxia_process
from tests.support.pulsar_broker import discard
from tests.support.server_process import ServerProcess
from tests.v5.broker5 import MAKE_COMMAND, Pulsar5Broker
from tests.v5.harness5 import HarnessMissing, HarnessRun, run_harness

# The broker starts twice (about a minute each on a loaded 2-core machine) and each SDK step is a JVM.
pytestmark = pytest.mark.timeout(900)

# A fresh name per run: a real Oxia (V5_OXIA_ENV) keeps what earlier runs wrote.
TOPIC = f"topic://public/default/v5-sdk-e2e-{uuid.uuid4().hex[:8]}"
# host:port of a real Oxia (namespace "default", one shard) to use instead of the stand-in.
V5_OXIA_ENV = "TC_SERVER_V5_OXIA_ADDRESS"
BOOKIES_PREFIX = "/ledgers/available/"
COUNT = 5
CONSUME_TIMEOUT_S = 120


@dataclass
class Cluster:
    tc_server: ServerProcess
    broker: Pulsar5Broker
    oxia_address: str


@contextlib.contextmanager
def oxia(log_path: Path) -> Iterator[str]:
    """``$TC_SERVER_V5_OXIA_ADDRESS`` (a real Oxia someone runs), else the stand-in with one shard."""
    real = os.environ.get(V5_OXIA_ENV)
    if real:
        yield real
        return
    with standin_oxia_process(log_path, shards=1) as address:
        yield address


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        with oxia(tmp_path_factory.mktemp("oxia") / "standin.log") as oxia_address:
            broker = Pulsar5Broker(tmp_path_factory.mktemp("pulsar5"), oxia_address)
            # Started first, so it leads all 16 coordinators; GC as soon as a decision is applied.
            server = ServerProcess(tmp_path_factory.mktemp("tc-server") / "data", "--oxia-address", oxia_address,
                                   "--coordinators", "16", "--upstream-url", broker.url,
                                   "--gc-retention-s", "0", "--gc-interval-s", "1", store="oxia")
            server.start()
            try:
                try:
                    broker.start()
                except BrokerStartError as exc:
                    pytest.fail(f"the Pulsar 5 broker did not start: {exc}\n(to install it: `{MAKE_COMMAND}`)")
                yield Cluster(server, broker, oxia_address)
            finally:
                discard(broker)
                server.stop()
    except StandinStartError as exc:
        pytest.fail(str(exc))


@pytest.fixture
async def store(cluster: Cluster) -> AsyncIterator[MetadataStore]:
    client = await connect_oxia(cluster.oxia_address, request_timeout_s=10.0)
    yield client
    await client.close()


def harness(*args: str) -> HarnessRun:
    try:
        return run_harness(*args)
    except HarnessMissing as exc:
        pytest.fail(str(exc))


async def produce(service_url: str, prefix: str, mode: str, attempts: int = 1) -> HarnessRun:
    """COUNT messages ``prefix-0..``; a run that failed before sending anything is tried again, up to
    ``attempts`` runs (a bounded wait for a restarted broker, not a timing assertion)."""
    for _ in range(attempts):
        run = await asyncio.to_thread(harness, "produce", service_url, TOPIC, str(COUNT), prefix, mode)
        if run.ok() or run.of("sent"):
            break
        await asyncio.sleep(2)
    assert run.ok(), run.describe()
    assert run.values("sent") == [f"{prefix}-{i}" for i in range(COUNT)], run.describe()
    return run


async def consume_until(broker: Pulsar5Broker, subscription: str, last: str) -> list[str]:
    """Everything a new subscription from the earliest position receives, up to the message ``last``:
    a message written before ``last`` and not received by then was not visible."""
    run = await asyncio.to_thread(harness, "consume", broker.url, TOPIC, subscription, last,
                                  str(CONSUME_TIMEOUT_S))
    assert run.ok(), run.describe()
    return run.values("received")


def counter(server: ServerProcess, name: str, tc_id: int) -> float:
    """One of tc-server's per-coordinator counters from its /metrics."""
    status, body = server.get("/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(f"{name}{{") and f'coordinator_id="{tc_id}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for coordinator {tc_id} in tc-server's /metrics")


async def gone(store: MetadataStore, most: int, least: int) -> bool:
    header = await store.get(layout.header_path(most, least), partition_key=layout.txn_key(most, least))
    return header is None


async def bookie_registrations(store: MetadataStore) -> list[str]:
    """The embedded bookie's ephemeral registration records (``/ledgers/available/bk-…``)."""
    return [r.key async for r in store.scan_prefix(BOOKIES_PREFIX) if r.key[len(BOOKIES_PREFIX):].startswith("bk-")]


async def restart_broker(broker: Pulsar5Broker, store: MetadataStore) -> None:
    """Stop the broker, wait until its bookie's registration is gone, start it again (same ports, data).

    The standalone bookie's registration is an ephemeral record on its own store session, which a
    stopped 5.0.0-M1 standalone leaves to expire ("Unclean shutdown detected"); a bookie started while
    it is still there fails with ``LockBusyException: Resource at /ledgers/available/bk-… is already
    locked`` and shuts down for good, and every write then fails with "Not enough non-faulty bookies".
    """
    assert await bookie_registrations(store), "no bookie registration under /ledgers/available/"
    await asyncio.to_thread(broker.stop)
    for _ in range(900):  # a bounded wait for the session to expire, not a timing assertion
        if not await bookie_registrations(store):
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError(f"the stopped broker's bookie is still registered: {await bookie_registrations(store)}")
    await asyncio.to_thread(broker.start)


def create_scalable_topic(broker: Pulsar5Broker) -> None:
    tenant_ns_name = TOPIC.removeprefix("topic://")
    request = urllib.request.Request(
        f"http://127.0.0.1:{broker.web_port}/admin/v2/scalable/{tenant_ns_name}?numInitialSegments=1",
        data=b"{}", method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.status in (200, 204), answer.status


async def test_v5_sdk_commits_through_tc_server_and_survives_gc_and_broker_restart(
        cluster: Cluster, store: MetadataStore) -> None:
    tc_server, broker = cluster.tc_server, cluster.broker
    await asyncio.to_thread(create_scalable_topic, broker)

    # 1. Commit, abort, plain: the SDK's service URL is tc-server (see the module docstring for why).
    committed = await produce(tc_server.url, "committed", "commit")
    aborted = await produce(tc_server.url, "aborted", "abort")
    await produce(tc_server.url, "plain", "plain")
    assert committed.of("committed") and aborted.of("aborted")
    txns = [(int(run.of("txn")[0]["most"]), int(run.of("txn")[0]["least"])) for run in (committed, aborted)]

    # 2. Minted by tc-server: the coordinator that answered is led by tc-server, whose own counters
    #    saw both txns end (Pulsar's coordinator would count nothing there).
    for most in {most for most, _ in txns}:
        leader = await store.get(layout.leader_path(most))
        assert leader is not None and TcLeader.from_json(leader.value).broker_service_url == tc_server.url
        minted = [least for m, least in txns if m == most]
        assert counter(tc_server, "pulsar_txn_created_total", most) >= len(minted)
    for (most, _), name in zip(txns, ("pulsar_txn_committed_total", "pulsar_txn_aborted_total"), strict=True):
        assert counter(tc_server, name, most) >= 1

    # 3. The consumer sees the committed messages and the later plain ones, never the aborted ones.
    expected = [f"committed-{i}" for i in range(COUNT)] + [f"plain-{i}" for i in range(COUNT)]
    assert await consume_until(broker, "before-gc", f"plain-{COUNT - 1}") == expected

    # 4. tc-server's GC deletes both headers once the broker applied the decisions and removed its op
    #    records (docs/record-layout.md, "GC never deletes a header that has op records"). Bounded poll.
    for _ in range(600):
        if all([await gone(store, most, least) for most, least in txns]):
            break
        await asyncio.sleep(0.2)
    else:
        raise AssertionError(f"tc-server's GC did not delete the headers of {txns}\n{tc_server.log_tail()}")

    # 5. After a broker restart the committed messages are still delivered, the aborted ones still not,
    #    and plain messages sent after the restart flow.
    await restart_broker(broker, store)
    # Right after the restart the broker's bookie may not be writable yet ("Not enough non-faulty bookies
    # available"): the producer is created again until it is.
    await produce(tc_server.url, "after-restart", "plain", attempts=30)
    after = await consume_until(broker, "after-restart", f"after-restart-{COUNT - 1}")
    assert after == expected + [f"after-restart-{i}" for i in range(COUNT)]


def test_broker_event_subscriptions_never_fail(cluster: Cluster) -> None:
    """The stand-in's GetSequenceUpdates keeps the broker's event subscriptions up (see the docstring)."""
    log = Path(cluster.broker.log_path).read_text(errors="replace")
    assert "Failure while processing sequence updates" not in log
