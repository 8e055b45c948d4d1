"""The full transaction lifecycle over the wire (docs/semantics.md, every row), against an in-process
server on real sockets, on the memory and embedded stores and on Oxia. "oxia-standin" is the STAND-IN
Oxia server (tests/oxia_standin, 3 shards): the real one cannot be installed here (the Go module
proxy refuses github.com/oxia-db/oxia), so this proves the coordinator on docs/oxia-client.md's notes, not on Oxia."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from tc_server.app import start_app
from tc_server.client import connect
from tc_server.coordinator import layout
from tc_server.coordinator.layout import TxnHeader, TxnState
from tc_server.server.discovery import ASSIGN_TOPIC
from tc_server.wire import LookupType, ServerError
from tests.oxia_standin.server import StandinOxia
from tests.support.waiting import async_wait_for

pytestmark = pytest.mark.parametrize("settings_store", ["memory", "embedded", "oxia-standin"], indirect=True)


@pytest.fixture
async def settings_store(request, settings):
    if request.param != "oxia-standin":
        yield replace(settings, store=request.param)
        return
    oxia = StandinOxia(shards=3)
    await oxia.start()
    # The stand-in is Python on the test's own event loop: 2000 requests in flight take it seconds,
    # so the request timeout is raised well clear of a loaded machine.
    yield replace(settings, store="oxia", oxia_address=oxia.address, request_timeout_s=60.0)
    await oxia.stop()


@pytest.fixture
async def app(settings_store):
    app = await start_app(settings_store)
    yield app
    await app.stop()


async def state_of(app, most, least) -> TxnState:
    # The header lives under its txn id's partition key (on Oxia: that key's shard).
    record = await app.store.get(layout.header_path(most, least), partition_key=layout.txn_key(most, least))
    assert record is not None
    return TxnHeader.from_json(record.value).state


async def test_handshake_negotiates_version(app):
    for asked, expected in ((21, 21), (20, 20), (25, 21), (19, 19)):
        c = await connect("127.0.0.1", app.listeners[0].port, protocol_version=asked)
        connected = await c._connected
        assert connected.protocol_version == expected
        assert connected.max_message_size == 5_242_880
        c.close()


async def test_discovery(client, app):
    meta = await client.partitioned_metadata(ASSIGN_TOPIC)
    assert meta.error is None and meta.partitions == 16
    for i in (0, 7, 15):
        found = await client.lookup(f"{ASSIGN_TOPIC}-partition-{i}")
        assert found.response is LookupType.CONNECT
        assert found.broker_service_url == f"pulsar://127.0.0.1:{app.listeners[0].port}"
    bad = await client.lookup(f"{ASSIGN_TOPIC}-partition-16")
    assert bad.response is LookupType.FAILED and bad.error is ServerError.TopicNotFound
    other = await client.partitioned_metadata("persistent://public/default/orders")
    assert other.error is ServerError.TopicNotFound and "transaction coordinator" in other.message
    assert (await client.tc_client_connect(3)).error is None
    missing = await client.tc_client_connect(16)
    assert missing.error is ServerError.TransactionCoordinatorNotFound


async def test_commit_abort_and_idempotence(client, app):
    a = await client.new_txn(tc_id=3, ttl_ms=10_000)
    assert a.error is None and a.most == 3
    assert await state_of(app, 3, a.least) is TxnState.OPEN
    assert (await client.add_partition(3, a.least, "persistent://t/n/p")).error is None
    assert (await client.add_subscription(3, a.least, "persistent://t/n/p", "sub")).error is None
    first = await client.end_txn(3, a.least, commit=True)
    assert first.error is None and (first.most, first.least) == (3, a.least)
    again = await client.end_txn(3, a.least, commit=True)
    assert again.error is None
    abort_after = await client.end_txn(3, a.least, commit=False)
    assert abort_after.error is ServerError.InvalidTxnStatus and abort_after.most == 3
    assert await state_of(app, 3, a.least) is TxnState.COMMITTED

    b = await client.new_txn(tc_id=5)
    assert (await client.end_txn(5, b.least, commit=False)).error is None
    assert (await client.end_txn(5, b.least, commit=False)).error is None
    # A commit of an aborted txn: TransactionNotFound, as Pulsar's coordinator answers (docs/semantics.md §2).
    commit_after = await client.end_txn(5, b.least, commit=True)
    assert commit_after.error is ServerError.TransactionNotFound and "aborted" in (commit_after.message or "")
    assert await state_of(app, 5, b.least) is TxnState.ABORTED


async def test_unknown_txn_and_add_after_end(client):
    unknown = await client.end_txn(2, 123456, commit=True)
    assert unknown.error is ServerError.TransactionNotFound and unknown.most == 2
    assert (await client.add_partition(2, 123456, "t")).error is ServerError.TransactionNotFound
    t = await client.new_txn(tc_id=2)
    await client.end_txn(2, t.least, commit=True)
    late = await client.add_partition(2, t.least, "persistent://t/n/p")
    assert late.error is ServerError.InvalidTxnStatus and late.most == 2
    late_sub = await client.add_subscription(2, t.least, "persistent://t/n/p", "s")
    assert late_sub.error is ServerError.InvalidTxnStatus


async def test_errors_carry_tc_id(client):
    response = await client.new_txn(tc_id=40)
    assert response.error is ServerError.TransactionCoordinatorNotFound and response.most == 40
    too_long = await client.new_txn(tc_id=4, ttl_ms=10**9)
    assert too_long.error is ServerError.NotAllowedError and too_long.most == 4
    assert "86400000" in too_long.message


async def test_default_ttl(client, app):
    t = await client.new_txn(tc_id=1, ttl_ms=0)
    record = await app.store.get(layout.header_path(1, t.least), partition_key=layout.txn_key(1, t.least))
    assert TxnHeader.from_json(record.value).timeout_ms == 60_000


async def test_the_timeout_sweep_aborts_an_open_txn_past_its_deadline(client, app):
    t = await client.new_txn(tc_id=6, ttl_ms=300)

    async def aborted() -> bool:
        return await state_of(app, 6, t.least) is TxnState.ABORTED

    await async_wait_for(aborted, "the txn aborted by the timeout sweep")
    late = await client.end_txn(6, t.least, commit=True)
    assert late.error is ServerError.TransactionNotFound


async def test_commit_past_deadline_before_sweep(settings_store):
    # With the sweep off, only END_TXN notices the deadline: it aborts and answers "timed out".
    app = await start_app(replace(settings_store, timeout_sweep=False))
    try:
        c = await connect("127.0.0.1", app.listeners[0].port)
        t = await c.new_txn(tc_id=0, ttl_ms=50)
        await asyncio.sleep(0.1)
        late = await c.end_txn(0, t.least, commit=True)
        assert late.error is ServerError.TransactionNotFound and "timed out" in (late.message or "")
        assert await state_of(app, 0, t.least) is TxnState.ABORTED
        c.close()
    finally:
        await app.stop()


async def test_many_in_flight_on_one_connection(client, app):
    created = await asyncio.gather(*(client.new_txn(tc_id=i % 16, ttl_ms=30_000) for i in range(2000)))
    assert all(r.error is None for r in created)
    ids = {(r.most, r.least) for r in created}
    assert len(ids) == 2000
    ended = await asyncio.gather(*(client.end_txn(r.most, r.least, commit=r.least % 2 == 0) for r in created))
    assert all(r.error is None for r in ended)
    assert {(r.most, r.least) for r in ended} == ids


async def test_ids_increase_per_coordinator(client):
    seen = [(await client.new_txn(tc_id=9)).least for _ in range(50)]
    assert seen == sorted(seen) and len(set(seen)) == 50
