"""Fairness under a flood (issue 15, "One client starves the others"): one connection pipelining far
more requests than the server-wide bound gets only its share of it, so a well-behaved connection's
request is still read and served while the store is stalled under the flood.

The stall is a stand-in: a memory store whose header writes wait for a gate (as in
tests/server/test_backpressure.py); a real store cannot be stalled on cue."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from tc_server.app import start_app
from tc_server.client import connect
from tc_server.config import Settings
from tc_server.server.connection import ClientConnection, ServerContext
from tc_server.store.memory import MemoryStore

BOUND = 8
ANSWER_BOUND_S = 30.0


class GatedStore(MemoryStore):
    """Header writes wait for the gate: a stalled store, on cue."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def put(self, key: str, value: bytes, **kwargs: Any) -> Any:
        if key.startswith("/txn/id/"):
            await self.gate.wait()
        return await super().put(key, value, **kwargs)


async def in_flight_reaches(context: ServerContext, count: int) -> None:
    """Until the server has ``count`` requests in flight (bounded; the test's asserts tell if it never does)."""
    for _ in range(500):
        await asyncio.sleep(0.01)
        if context.in_flight >= count:
            return


async def test_a_flooding_connection_cannot_take_the_whole_bound(settings: Settings) -> None:
    store = GatedStore()
    app = await start_app(replace(settings, max_requests_in_flight=BOUND), store=store)
    try:
        context = app.context
        flooder = await connect("127.0.0.1", app.listeners[0].port)
        polite = await connect("127.0.0.1", app.listeners[0].port)
        store.gate.clear()
        flood = [asyncio.ensure_future(flooder.new_txn(tc_id=i % 16)) for i in range(200)]
        await in_flight_reaches(context, BOUND // 2)  # what the flood may take
        request = asyncio.ensure_future(polite.new_txn(tc_id=3))
        served: dict[ClientConnection, int] = {}
        for _ in range(500):  # until the polite request is read (bounded)
            await asyncio.sleep(0.01)
            served = {c: c._in_flight for c in context.connections}
            if sorted(served.values()) == [1, BOUND // 2]:
                break
        # The flooder holds its share (half of the bound with two connections); the polite
        # connection's one request was read although 196 of the flood still wait.
        assert sorted(served.values()) == [1, BOUND // 2], served
        assert context.in_flight <= BOUND
        store.gate.set()
        assert (await asyncio.wait_for(request, ANSWER_BOUND_S)).error is None
        answers = await asyncio.wait_for(asyncio.gather(*flood), ANSWER_BOUND_S)
        assert all(a.error is None for a in answers)
        flooder.close()
        polite.close()
    finally:
        await app.stop()


async def test_a_client_that_connects_after_the_flood_is_handshaken_and_served(settings: Settings) -> None:
    # Found by a review with a real process: one connection's 4,200 END_TXNs, each waiting --participant-wait-s
    # for a participant no broker knows, held the whole bound (a connection alone had all of it as its share),
    # and a client that connected then was not even read: its CONNECT went unanswered until the keep-alive
    # closed it for sending none. A connection alone now gets half, and a handshake is read whatever the bound.
    store = GatedStore()
    app = await start_app(replace(settings, max_requests_in_flight=BOUND), store=store)
    try:
        context = app.context

        async def until_in_flight(count: int) -> None:
            for _ in range(500):  # bounded
                if context.in_flight >= count:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # and nothing more is read
            assert context.in_flight == count

        first = await connect("127.0.0.1", app.listeners[0].port)
        store.gate.clear()
        flood = [asyncio.ensure_future(first.new_txn(tc_id=i % 16)) for i in range(200)]
        await until_in_flight(BOUND // 2)  # half: the rest is there for whoever connects next
        polite = await asyncio.wait_for(connect("127.0.0.1", app.listeners[0].port), ANSWER_BOUND_S)
        request = asyncio.ensure_future(polite.new_txn(tc_id=3))
        await until_in_flight(BOUND // 2 + 1)
        # More flooders take the rest of the bound (each its share): a client connecting now is handshaken all
        # the same.
        flooders = [first]
        while context.in_flight < BOUND and len(flooders) < 4:
            flooders.append(await connect("127.0.0.1", app.listeners[0].port))
            flood += [asyncio.ensure_future(flooders[-1].new_txn(tc_id=i % 16)) for i in range(200)]
            await asyncio.sleep(0.2)
        await until_in_flight(BOUND)
        late = await asyncio.wait_for(connect("127.0.0.1", app.listeners[0].port), ANSWER_BOUND_S)
        store.gate.set()
        assert (await asyncio.wait_for(request, ANSWER_BOUND_S)).error is None
        assert (await asyncio.wait_for(late.new_txn(tc_id=5), ANSWER_BOUND_S)).error is None
        assert all(a.error is None for a in await asyncio.wait_for(asyncio.gather(*flood), ANSWER_BOUND_S))
        for client in (*flooders, polite, late):
            client.close()
    finally:
        await app.stop()


async def test_sockets_that_never_connect_take_no_share_of_the_bound(settings: Settings) -> None:
    # Found by a review: every accepted socket shared the bound, so 400 sockets sending nothing (no CONNECT,
    # no authentication needed) cut every client's share from 2,048 requests in flight to 10. Only the
    # connections served here share it now.
    store = GatedStore()
    app = await start_app(replace(settings, max_requests_in_flight=BOUND), store=store)
    idle: list[asyncio.StreamWriter] = []
    try:
        context = app.context
        for _ in range(50):
            idle.append((await asyncio.open_connection("127.0.0.1", app.listeners[0].port))[1])
        client = await connect("127.0.0.1", app.listeners[0].port)
        assert len(context.connections) == 51
        store.gate.clear()
        requests = [asyncio.ensure_future(client.new_txn(tc_id=i % 16)) for i in range(20)]
        await in_flight_reaches(context, BOUND // 2)  # what the client may take
        await asyncio.sleep(0.1)  # and nothing more is read
        # Half of the bound, as for a connection alone (with the idle sockets counted: 1).
        assert context.in_flight == BOUND // 2
        store.gate.set()
        assert all(a.error is None for a in await asyncio.wait_for(asyncio.gather(*requests), ANSWER_BOUND_S))
        client.close()
    finally:
        for writer in idle:
            writer.close()
        await app.stop()
