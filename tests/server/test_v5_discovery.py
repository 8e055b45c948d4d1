"""The v5 client's discovery: CONNECTs whose proxy_to_broker_url names this instance or a peer.

Pulsar 5's v5 SDK learns the coordinators' leaders from WATCH_TC_ASSIGNMENTS, then dials every
coordinator through the connection it watched on, with ``proxy_to_broker_url`` = the leader's URL
(it treats that connection as proxied). Pointed at tc-server, it therefore sends CONNECTs naming
tc-server's own advertised address: those must be served here as coordinator connections, not
relayed. A CONNECT naming a peer tc-server that leads other coordinators is carried to that peer,
which serves it.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from tc_server.app import App, start_app
from tc_server.client import TcClient, connect, connect_command
from tc_server.coordinator import layout, leadership
from tc_server.coordinator.layout import TxnHeader, TxnState
from tc_server.server import connection as connection_module
from tc_server.server import relay as relay_module
from tc_server.store.memory import MemoryBackend, MemoryStore
from tc_server.wire import ServerError, encode_command
from tests.support.waiting import async_wait_for


async def proxied_client(port: int, proxy_to_broker_url: str) -> TcClient:
    """A client on ``port`` whose CONNECT names ``proxy_to_broker_url``, as the v5 SDK sends it."""
    client = await connect("127.0.0.1", port, handshake=False)
    await client.handshake(replace(connect_command(), proxy_to_broker_url=proxy_to_broker_url), timeout_s=10)
    return client


def proxied(app: App) -> float | None:
    """Client connections ``app`` carries byte for byte to another server right now."""
    return app.metrics.registry.get_sample_value("tc_server_proxied_connections")


async def committed(app: App, most: int, least: int) -> bool:
    record = await app.store.get(layout.header_path(most, least), partition_key=layout.txn_key(most, least))
    return record is not None and TxnHeader.from_json(record.value).state is TxnState.COMMITTED


@pytest.mark.parametrize("form", ["{host}:{port}", "pulsar://{host}:{port}"])
async def test_connect_naming_this_instance_is_served_here(app: App, form: str) -> None:
    own = form.format(host="127.0.0.1", port=app.listeners[0].port)
    client = await proxied_client(app.listeners[0].port, own)
    try:
        assert (await client.tc_client_connect(5)).error is None
        assert proxied(app) == 0  # served here, not relayed (even to itself)
        created = await client.new_txn(tc_id=5)
        assert created.error is None
        assert (await client.end_txn(created.most, created.least, commit=True)).error is None
        assert await committed(app, created.most, created.least)
    finally:
        client.close()


async def test_connect_naming_a_peer_is_served_by_the_peer(settings, monkeypatch) -> None:
    monkeypatch.setattr(leadership, "RECHECK_INTERVAL_S", 0.05)
    backend = MemoryBackend()
    a = await start_app(settings, store=MemoryStore(backend))
    b = None
    client = None
    try:
        b = await start_app(replace(settings, listen="127.0.0.1:0", admin_listen="127.0.0.1:0"),
                            store=MemoryStore(backend))
        b_url = f"pulsar://127.0.0.1:{b.listeners[0].port}"
        for _ in range(400):  # bounded: until a knows the 8/8 split
            if [a.coordinator.leader_url(i) for i in range(16)].count(b_url) == 8:
                break
            await asyncio.sleep(0.05)
        b_led = [i for i in range(16) if a.coordinator.leader_url(i) == b_url]
        a_led = [i for i in range(16) if a.coordinator.leads(i)]
        assert len(b_led) == 8 and len(a_led) == 8

        client = await proxied_client(a.listeners[0].port, b_url)
        # The connection is b's: b's coordinators are served, a's are not found there.
        assert (await client.tc_client_connect(b_led[0])).error is None
        assert (proxied(a), proxied(b)) == (1, 0)
        refused = await client.tc_client_connect(a_led[0])
        assert refused.error is ServerError.TransactionCoordinatorNotFound
        created = await client.new_txn(tc_id=b_led[0])
        assert created.error is None and created.most == b_led[0]
        assert (await client.end_txn(created.most, created.least, commit=True)).error is None
        assert await committed(b, created.most, created.least)
    finally:
        if client is not None:
            client.close()
        if b is not None:
            await b.stop()
        await a.stop()


async def test_a_relay_set_up_after_its_connection_closed_leaves_the_gauge_at_zero(settings, monkeypatch) -> None:
    # A broker slow to accept: the client's connection closes while its relay is set up, the relay's
    # broker side is then closed unused, and that close counted one proxied connection less than there
    # had been (the gauge went negative).
    monkeypatch.setattr(leadership, "RECHECK_INTERVAL_S", 0.05)
    real_open_relay = relay_module.open_relay
    started, opened = asyncio.Event(), asyncio.Event()

    async def slow_open_relay(*args: Any, **kwargs: Any) -> Any:
        started.set()
        await asyncio.sleep(0.5)
        try:
            return await real_open_relay(*args, **kwargs)
        finally:
            opened.set()

    monkeypatch.setattr(connection_module, "open_relay", slow_open_relay)
    backend = MemoryBackend()
    a = await start_app(settings, store=MemoryStore(backend))
    b = await start_app(replace(settings, listen="127.0.0.1:0", admin_listen="127.0.0.1:0"), store=MemoryStore(backend))
    try:
        b_url = f"pulsar://127.0.0.1:{b.listeners[0].port}"
        for _ in range(400):  # bounded: until a knows b leads some coordinators
            if b_url in a.coordinator.assignments().values():
                break
            await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", a.listeners[0].port)
        writer.write(encode_command(replace(connect_command(), proxy_to_broker_url=b_url)))
        await writer.drain()
        # Events and polls, not fixed sleeps: on a slow machine the sleeps ended before the relay was set up or
        # closed, and the gauge read 0 without the path under test having run.
        await asyncio.wait_for(started.wait(), 10)  # the relay's setup is under way
        writer.close()  # the client leaves before it is done
        await asyncio.wait_for(opened.wait(), 10)
        await async_wait_for(lambda: not b.context.connections, "the relay's broker side closed", step_s=0.05)
        await asyncio.sleep(0.2)  # and whatever its close counts on a's side
        assert proxied(a) == 0
    finally:
        await b.stop()
        await a.stop()
