"""Keep-alive both ways (PulsarHandler's rules): the server answers PING, pings idle clients, and
drops a client that does not answer by the next tick or never sends CONNECT."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from tc_server.app import start_app
from tc_server.client import connect


@pytest.fixture
async def app(settings):
    app = await start_app(replace(settings, keepalive_s=0.2))
    yield app
    await app.stop()


async def test_answers_ping(client):
    await client.ping()


async def test_pings_idle_client_and_keeps_it_while_it_answers(app):
    c = await connect("127.0.0.1", app.listener.port)
    await asyncio.sleep(1.0)
    assert c.pings_received >= 2
    assert not c.closed.done()
    assert (await c.new_txn(tc_id=0)).error is None
    c.close()


async def test_drops_client_that_does_not_answer(app):
    c = await connect("127.0.0.1", app.listener.port)
    c.answer_pings = False
    await asyncio.wait_for(c.closed, 10)
    assert c.pings_received >= 1


async def test_drops_connection_without_connect(app):
    c = await connect("127.0.0.1", app.listener.port, handshake=False)
    await asyncio.wait_for(c.closed, 10)
