"""--max-connections and --max-connections-per-address (issue 15, "No connection limit"): a connection
past a limit is closed at once, counted in a metric and logged (one line per interval, not per
connection); the connections already open and the admin probes keep working."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tc_server.app import App, start_app
from tc_server.auth.tls_accept import TlsServer
from tc_server.client import ClientAuth, TcClient
from tc_server.config import Settings
from tests.security.pki import TestCa
from tests.security.support import tls_client
from tests.support.waiting import async_wait_for

from .conftest import BASE, tracebacks

CLOSE_BOUND_S = 5.0


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return replace(BASE, data_dir=str(tmp_path / "data"), max_connections=4, max_connections_per_address=2)


async def open_from(app: App, source: str, handshake: bool = True) -> TcClient:
    """A client connection from ``source`` (any 127.x.y.z address is this machine's loopback)."""
    assert app.listener is not None
    loop = asyncio.get_running_loop()
    url = f"pulsar://127.0.0.1:{app.listener.port}"
    _, client = await loop.create_connection(lambda: TcClient(url), "127.0.0.1", app.listener.port,
                                             local_addr=(source, 0))
    if handshake:
        await client.handshake_as()
    return client


async def refused(client: TcClient) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(client.closed), CLOSE_BOUND_S)
    except TimeoutError:
        return False
    return True


def refusals(app: App) -> dict[str, float]:
    from prometheus_client import generate_latest

    exposition = generate_latest(app.metrics.registry).decode()
    return {sample.labels["reason"]: sample.value
            for family in text_string_to_metric_families(exposition)
            if family.name == "tc_server_connections_refused"
            for sample in family.samples if sample.name.endswith("_total")}


async def readyz(app: App) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", app.admin.port)
    writer.write(b"GET /readyz HTTP/1.1\r\nHost: tc\r\nConnection: close\r\n\r\n")
    status = int((await reader.read()).split(b" ")[1])
    writer.close()
    return status


async def test_past_max_connections_a_connection_is_closed_at_once(
        app: App, server_log: list[dict[str, Any]]) -> None:
    held = [await open_from(app, source) for source in ("127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.4")]
    extra = [await open_from(app, f"127.0.0.{5 + i}", handshake=False) for i in range(30)]
    assert all([await refused(c) for c in extra])
    assert refusals(app) == {"max_connections": 30, "max_connections_per_address": 0, "max_tls_handshakes": 0,
                             "max_buffered_input": 0, "answers_unread": 0}
    # One log line for the burst, not one per connection.
    lines = [e for e in server_log if e["event"] == "connection refused"]
    assert len(lines) == 1 and lines[0]["reason"] == "max_connections", lines
    assert await readyz(app) == 200
    for client in held:
        assert (await client.new_txn(tc_id=1)).error is None
    held.pop().close()
    await asyncio.sleep(0)  # let the server see the close
    await async_wait_for(lambda: len(app.context.connections) < 4)
    again = await open_from(app, "127.0.0.9")
    assert (await again.new_txn(tc_id=2)).error is None
    assert tracebacks(server_log) == []
    for client in [*held, again]:
        client.close()


async def test_past_max_connections_per_address_only_that_address_is_refused(app: App) -> None:
    first = [await open_from(app, "127.0.0.2") for _ in range(2)]
    third = await open_from(app, "127.0.0.2", handshake=False)
    assert await refused(third)
    other = await open_from(app, "127.0.0.3")
    assert (await other.new_txn(tc_id=3)).error is None
    assert refusals(app)["max_connections_per_address"] == 1
    for client in [*first, other]:
        client.close()


async def test_tls_handshakes_under_way_are_bounded_as_connections_are(settings: Settings, tmp_path: Path) -> None:
    # asyncio's TLS server calls connection_made, where the limits are counted, only once the handshake is
    # done: sockets that connected and never sent their ClientHello were not counted, each held for the
    # handshake timeout, as many as anyone opened. A broker counts a connection when it accepts it.
    ca = TestCa(tmp_path)
    issued = ca.issue("localhost", "server", server=True)
    app = await start_app(replace(settings, tls_listen="127.0.0.1:0", tls_cert_file=str(issued.cert_file),
                                  tls_key_file=str(issued.key_file)))
    assert app.tls_listener is not None
    port = app.tls_listener.port
    try:
        stalled = [await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0)) for _ in range(2)]
        third, _ = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        assert await asyncio.wait_for(third.read(), CLOSE_BOUND_S) == b""  # closed at once, not at the timeout
        assert refusals(app)["max_tls_handshakes"] == 1
        # Another address completes its handshake and is served; the stalled ones still hold their slots.
        other = await tls_client(port, ssl.create_default_context(cafile=str(ca.cert_file)), ClientAuth())
        assert (await other.new_txn(tc_id=1)).error is None
        other.close()
        server = app.tls_listener._server
        assert isinstance(server, TlsServer) and server.budget.count == 2
        for _, writer in stalled:  # a stalled handshake gone gives its slot back
            writer.close()
        await async_wait_for(lambda: server.budget.count == 0)
        assert server.budget.count == 0
    finally:
        await app.stop()
