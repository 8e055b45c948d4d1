"""The graceful stop (App.stop, README "Operations"): the Pulsar ports refuse new clients first, whatever
holds up the rest; the requests in flight are answered; the admin port cannot hold the stop up. Against an
in-process server on real sockets."""

from __future__ import annotations

import asyncio

import pytest

from tc_server.app import start_app
from tc_server.config import Settings

# Keeps a stop that hangs from hanging the test; a stop takes a fraction of it.
STOP_BOUND_S = 60.0


async def test_new_clients_are_refused_first_and_an_admin_client_does_not_hold_up_the_stop(settings: Settings) -> None:
    app = await start_app(settings)
    pulsar_port = app.listeners[0].port
    # An admin client that announces a body and never sends it: aiohttp keeps its connection open.
    reader, writer = await asyncio.open_connection("127.0.0.1", app.admin.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: tc\r\nContent-Length: 60000\r\n\r\n")
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    stopping = asyncio.create_task(app.stop())
    await asyncio.sleep(0)  # the stop runs up to its first wait
    try:
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", pulsar_port)
    finally:
        await asyncio.wait_for(stopping, STOP_BOUND_S)
        writer.close()
