"""Keep-alive both ways (PulsarHandler's rules): the server answers PING, pings idle clients, and
drops a client that does not answer by the next tick or never sends CONNECT."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace

import pytest

from tc_server.app import start_app
from tc_server.client import connect, connect_command
from tc_server.config import Settings
from tc_server.server import connection as connection_module
from tc_server.server.discovery import ASSIGN_TOPIC
from tc_server.wire import Lookup, ServerError, encode_command
from tests.support.gated_store import GatedStore
from tests.support.waiting import async_wait_for


@pytest.fixture
async def app(settings):
    # Short, for the tests' time, yet not so short that a stall of the test process (the client runs on the server's
    # loop) between a PONG's write and its read lets the next tick close a client that answered (timers run first).
    app = await start_app(replace(settings, keepalive_s=0.5))
    yield app
    await app.stop()


async def test_answers_ping(client):
    await client.ping()


async def test_pings_idle_client_and_keeps_it_while_it_answers(app):
    c = await connect("127.0.0.1", app.listener.port)
    await async_wait_for(lambda: c.pings_received >= 2, "two pings", 10, 0.05)
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


async def test_a_client_that_stopped_reading_is_dropped_though_its_answers_cannot_be_flushed(app, monkeypatch):
    # A hung or paused client: its kernel still acknowledges, but it reads nothing, so the answers pile
    # up in the server's write buffer. The keep-alive's close waited for that buffer to drain, which
    # never happened: the connection kept its slot, its buffers and its upstream sessions for good.
    monkeypatch.setattr(connection_module, "CLOSE_FLUSH_S", 0.3)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", app.listener.port))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_sendall(sock, encode_command(connect_command()))
        lookups = encode_command(Lookup(f"{ASSIGN_TOPIC}-partition-1", 1)) * 2000
        blocked, unsent = 0, b""
        while blocked < 10:  # until the server reads nothing more either (its answers are not taken)
            try:
                unsent = unsent or lookups
                unsent = unsent[sock.send(unsent):]  # whole frames only, in order
                blocked = 0
            except BlockingIOError:
                blocked += 1
                await asyncio.sleep(0.02)
            except OSError:  # already cut (a slow machine): what is checked below
                break
        # The keep-alive (0.5 s) closes it, then the flush bound cuts it.
        await async_wait_for(lambda: not app.context.connections)
        assert not app.context.connections
    finally:
        sock.close()


async def test_a_client_that_answers_every_ping_is_not_dropped_while_the_server_does_not_read_it(
        settings: Settings) -> None:
    # Before, the next tick took the client's PONG, waiting unread in the socket while the server's own
    # bounds (its share of --max-requests-in-flight, a stalled store) held its reading, for a dead client,
    # and the answers of every request in flight were lost with the connection. PulsarHandler skips the
    # close while auto-read is off.
    store = GatedStore()
    # request timeout above the keep-alive interval (as END_TXN's participant wait, 25 s, plus its
    # decision, up to --request-timeout-s, is above the default 30 s keep-alive).
    app = await start_app(replace(settings, keepalive_s=0.5, request_timeout_s=2.0, max_requests_in_flight=4),
                          store=store)
    try:
        assert app.listener is not None
        client = await connect("127.0.0.1", app.listener.port)  # answers every PING (TcClient's default)
        store.gate.clear()  # the store stalls: NEW_TXN waits until its deadline
        pending = [asyncio.ensure_future(client.new_txn(tc_id=i % 4)) for i in range(8)]
        answers = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 10)
        lost = [a for a in answers if isinstance(a, BaseException)]
        assert not lost, (f"{len(lost)} of {len(answers)} requests lost with their connection "
                          f"(closed={client.closed.done()}): {lost[0]!r}")
        # Each is answered at its deadline, typed (the client retries elsewhere).
        assert all(not isinstance(a, BaseException) and a.error is ServerError.TransactionCoordinatorNotFound
                   for a in answers)
        client.close()
    finally:
        store.gate.set()
        await app.stop()
