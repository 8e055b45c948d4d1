"""A real Pulsar 5 broker (5.0.0-M1) and tc-server sharing one metadata store: each reads the other's records.

The store is the project's Oxia STAND-IN (tests/oxia_standin, one shard), because the real Oxia server
cannot be installed here (the Go module proxy refuses github.com/oxia-db/oxia). The broker talks to it
with Pulsar's own Java Oxia client (oxia-client 0.8.0, what 5.0.0-M1 ships): its metadata, BookKeeper's
ledger metadata, and the v5 coordinator's records (leader election on ephemeral records, headers with
partition keys and secondary indexes, the id sequence) all live there. One shard because 5.0.0-M1's
index scans read without the partition key and miss records on other shards (a Pulsar bug).

What this proves, in one scenario: a Pulsar 5 broker started on a store where tc-server leads the 16
coordinators parses tc-server's parallelism and leader records and sends v5 clients to tc-server; when
tc-server steps down, Pulsar's own v5 coordinator takes over, and a restarted tc-server follows it,
reading Pulsar's leader records; tc-server's Oxia client and layout module read the headers, index keys,
id sequence and parallelism Pulsar's coordinator writes. The v5 SDK producing to a scalable topic in a
txn minted by tc-server, and the broker's participants applying tc-server's decisions, are in
tests/v5/test_v5_sdk_e2e.py.

`make test-broker5` resolves the broker (`make pulsar-broker5`) and runs these tests; a missing broker or
Java 21 fails them, it never skips (docs/architecture.md §9).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from tc_server.bench.pulsar_broker import BrokerStartError
from tc_server.client import TcClient, connect
from tc_server.coordinator import layout
from tc_server.coordinator.layout import TcLeader, TxnHeader, TxnState
from tc_server.store.api import MetadataStore
from tc_server.store.oxia import connect as connect_oxia
from tc_server.wire import TxnAction
from tc_server.wire.commands import EndTxn, NewTxn, TcClientConnect
from tests.support.oxia_standin import StandinStartError, standin_oxia_process
from tests.support.pulsar_broker import discard
from tests.support.server_process import ServerProcess
from tests.v5.broker5 import MAKE_COMMAND, Pulsar5Broker

# The first test also waits for the broker to start (about a minute on a loaded 2-core machine).
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def oxia_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        with standin_oxia_process(tmp_path_factory.mktemp("oxia") / "standin.log", shards=1) as address:
            yield address
    except StandinStartError as exc:
        pytest.fail(str(exc))


@dataclass
class Shared:
    """One store, a tc-server process started on it first (so it leads all 16 coordinators), then the broker."""

    oxia_address: str
    tc_server: ServerProcess
    broker: Pulsar5Broker


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, oxia_address: str) -> Iterator[Shared]:
    server = ServerProcess(tmp_path_factory.mktemp("tc-server") / "data", "--oxia-address", oxia_address,
                           "--coordinators", "16", store="oxia")
    server.start()
    broker = Pulsar5Broker(tmp_path_factory.mktemp("pulsar5"), oxia_address)
    try:
        broker.start()
    except BrokerStartError as exc:
        broker.kill()
        server.stop()
        pytest.fail(f"the Pulsar 5 broker did not start: {exc}\n(to install it: `{MAKE_COMMAND}`)")
    yield Shared(oxia_address, server, broker)
    discard(broker)
    server.stop()


async def assignments(port: int) -> dict[int, str | None]:
    """WATCH_TC_ASSIGNMENTS as the server on ``port`` answers it: tcId -> leader URL."""
    client = await connect("127.0.0.1", port)
    try:
        update = await asyncio.wait_for(client.watch_assignments(1), 30)
    finally:
        client.close()
    assert update.snapshot is not None, update
    return {a.tc_id: a.broker_service_url for a in update.snapshot.assignments}


async def poll_assignments(port: int, expected: dict[int, str | None], what: str) -> None:
    """Bounded poll (a test timeout, not a timing assertion): leadership moves through store notifications."""
    last: dict[int, str | None] = {}
    for _ in range(300):
        last = await assignments(port)
        if last == expected:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what}: WATCH_TC_ASSIGNMENTS still says {last}")


@pytest.fixture
async def store(oxia_address: str) -> AsyncIterator[MetadataStore]:
    client = await connect_oxia(oxia_address, request_timeout_s=10.0)
    yield client
    await client.close()


async def v5_client(broker: Pulsar5Broker, tc_id: int) -> TcClient:
    """A client of the broker's v5 coordinator: its TC commands carry ``scalable=true``."""
    client = await connect("127.0.0.1", broker.port)
    answer = await client.request(TcClientConnect(client.next_request_id(), tc_id, scalable=True))
    assert answer.error is None, answer
    return client


async def test_leadership_moves_between_tc_server_and_pulsars_coordinator(shared: Shared,
                                                                        store: MetadataStore) -> None:
    tc_server, broker = shared.tc_server, shared.broker
    # 1. tc-server started first and leads every coordinator; the broker parsed its parallelism record
    #    (plain "16") and its leader records, and sends v5 clients to tc-server.
    everything_at_tc_server = {i: tc_server.url for i in range(16)}
    assert await assignments(broker.port) == everything_at_tc_server
    assert await assignments(tc_server.port) == everything_at_tc_server
    assert "NumberFormatException" not in broker.log_path.read_text(errors="replace")

    # 2. tc-server steps down (its leader records go): Pulsar's own v5 coordinator takes over.
    await asyncio.to_thread(tc_server.stop)
    await poll_assignments(broker.port, {i: broker.url for i in range(16)}, "the broker did not take over")

    # 3. A restarted tc-server follows the broker: it reads Pulsar's leader records.
    await asyncio.to_thread(tc_server.start)
    assert await assignments(tc_server.port) == {i: broker.url for i in range(16)}
    refused = await connect("127.0.0.1", tc_server.port)
    try:
        answer = await refused.tc_client_connect(0)  # led by the broker, not by tc-server
        assert answer.error is not None, answer
    finally:
        refused.close()

    # 4. Records Pulsar's coordinator writes, read by tc-server's Oxia client and layout module.
    await check_pulsars_coordinator_records(broker, store)


async def check_pulsars_coordinator_records(broker5: Pulsar5Broker, store: MetadataStore) -> None:
    tc_id = 3
    client = await v5_client(broker5, tc_id)
    try:
        created = [await client.request(NewTxn(client.next_request_id(), 60_000, tc_id, scalable=True))
                   for _ in range(3)]
        assert all(c.error is None and c.most == tc_id for c in created), created
        committed, aborted, still_open = (c.least for c in created)
        for least, action in ((committed, TxnAction.COMMIT), (aborted, TxnAction.ABORT)):
            ended = await client.request(EndTxn(client.next_request_id(), tc_id, least, action, scalable=True))
            assert ended.error is None, ended
    finally:
        client.close()

    headers = {}
    for least in (committed, aborted, still_open):
        record = await store.get(layout.header_path(tc_id, least), partition_key=layout.txn_key(tc_id, least))
        assert record is not None, f"no header {layout.header_path(tc_id, least)} from Pulsar's coordinator"
        headers[least] = TxnHeader.from_json(record.value)
    assert [headers[x].state for x in (committed, aborted, still_open)] == [
        TxnState.COMMITTED, TxnState.ABORTED, TxnState.OPEN]
    assert all(h.timeout_ms == 60_000 and h.created_ms > 0 for h in headers.values())
    assert headers[committed].finalized_ms is not None and headers[still_open].finalized_ms is None

    # tc-server's scans (recovery, timeouts, GC) find them under Pulsar's index keys, none under the earlier ones.
    pulsar_open, earlier_open = layout.deadline_ranges()
    assert layout.header_path(tc_id, still_open) in [
        r.key async for r in store.scan_index(layout.IDX_TXN_BY_DEADLINE, *pulsar_open)]
    assert [r.key async for r in store.scan_index(layout.IDX_TXN_BY_DEADLINE, *earlier_open)] == []
    later = int(time.time() * 1000) + 60_000
    for least, state in ((committed, TxnState.COMMITTED), (aborted, TxnState.ABORTED)):
        pulsar_final, earlier_final = layout.final_state_ranges(state, later)
        assert layout.header_path(tc_id, least) in [
            r.key async for r in store.scan_index(layout.IDX_TXN_BY_FINAL_STATE, *pulsar_final)]
        assert [r.key async for r in store.scan_index(layout.IDX_TXN_BY_FINAL_STATE, *earlier_final)] == []

    # Pulsar's id sequence: the next id after the three it handed out.
    seq = await store.get(layout.tc_seq_path(tc_id))
    assert seq is not None and layout.parse_tc_seq(seq.value) == still_open + 1

    # The parallelism and leader records Pulsar's coordinator wrote at start.
    parallelism = await store.get(layout.PARALLELISM_PATH)
    assert parallelism is not None and layout.parse_parallelism(parallelism.value) == 16
    assert not layout.is_legacy_parallelism(parallelism.value)
    leader = await store.get(layout.leader_path(tc_id))
    assert leader is not None
    assert TcLeader.from_json(leader.value).broker_service_url == broker5.url
