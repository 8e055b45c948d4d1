"""Back-pressure: past --max-requests-in-flight the server stops reading instead of piling up
tasks, and every request is still answered once the store moves again."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from tc_server.app import start_app
from tc_server.client import connect
from tests.support.gated_store import GatedStore


async def test_reading_stops_at_the_limit_and_resumes(settings):
    store = GatedStore()
    app = await start_app(replace(settings, max_requests_in_flight=4), store=store)
    try:
        clients = [await connect("127.0.0.1", app.listeners[0].port) for _ in range(2)]
        store.gate.clear()
        pending = [asyncio.ensure_future(c.new_txn(tc_id=i % 16)) for c in clients for i in range(25)]
        # The store is stalled: the in-flight count climbs to the bound and must stay there. Poll
        # (bounded) until it is reached, then keep watching a while.
        peak = 0
        watched_at_bound = 0
        for _ in range(500):
            await asyncio.sleep(0.01)
            peak = max(peak, app.context.in_flight)
            watched_at_bound += peak >= 4
            if watched_at_bound >= 20:
                break
        assert peak == 4
        store.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*pending), 30)
        assert all(a.error is None for a in answers)
        assert len({(a.most, a.least) for a in answers}) == 50
        assert app.context.in_flight == 0
        for c in clients:
            c.close()
    finally:
        await app.stop()
