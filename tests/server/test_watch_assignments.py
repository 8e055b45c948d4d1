"""WATCH_TC_ASSIGNMENTS (PIP-473's v5 discovery): the full tcId -> URL map on subscribe and again
whenever leadership changes."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from tc_server.app import start_app
from tc_server.client import connect
from tc_server.coordinator import leadership
from tc_server.server.connection import MAX_WATCHES_PER_CONNECTION
from tc_server.store.memory import MemoryBackend, MemoryStore
from tc_server.wire import ServerError, TcAssignment, WatchTcAssignmentsClose


async def test_flag_and_snapshot(app, client):
    connected = await client._connected
    assert connected.feature_flags is not None and connected.feature_flags.supports_tc_metadata_discovery
    update = await client.watch_assignments(7)
    url = f"pulsar://127.0.0.1:{app.listeners[0].port}"
    assert update.watch_id == 7 and update.error is None
    assert update.snapshot.parallelism == 16
    assert update.snapshot.assignments == tuple(TcAssignment(i, url) for i in range(16))
    client.send(WatchTcAssignmentsClose(7))
    assert (await client.new_txn(tc_id=3)).error is None  # the connection is unaffected


async def test_updates_follow_a_rebalance(settings, monkeypatch):
    monkeypatch.setattr(leadership, "RECHECK_INTERVAL_S", 0.05)
    backend = MemoryBackend()
    a = await start_app(settings, store=MemoryStore(backend))
    b = None
    try:
        watcher = await connect("127.0.0.1", a.listeners[0].port)
        first = await watcher.watch_assignments(1)
        assert first.snapshot is not None
        a_url = f"pulsar://127.0.0.1:{a.listeners[0].port}"
        assert {x.broker_service_url for x in first.snapshot.assignments} == {a_url}
        b = await start_app(replace(settings, listen="127.0.0.1:0", admin_listen="127.0.0.1:0"),
                            store=MemoryStore(backend))
        b_url = f"pulsar://127.0.0.1:{b.listeners[0].port}"
        latest = first
        for _ in range(200):  # bounded: until the update shows the 8/8 split
            latest = await asyncio.wait_for(watcher.assignment_updates.get(), 10)
            assert latest.snapshot is not None
            urls = [x.broker_service_url for x in latest.snapshot.assignments]
            if len(urls) == 16 and urls.count(b_url) == 8:
                break
        assert latest.snapshot is not None
        assert [x.broker_service_url for x in latest.snapshot.assignments] == [a_url] * 8 + [b_url] * 8
        watcher.close()
    finally:
        if b is not None:
            await b.stop()
        await a.stop()


async def test_watches_per_connection_are_bounded(app, client):
    for watch_id in range(MAX_WATCHES_PER_CONNECTION):
        assert (await client.watch_assignments(watch_id)).error is None
    refused = await client.watch_assignments(MAX_WATCHES_PER_CONNECTION)
    assert refused.error is ServerError.NotAllowedError and refused.snapshot is None
    assert refused.message is not None and str(MAX_WATCHES_PER_CONNECTION) in refused.message
    assert (await client.watch_assignments(0)).error is None  # one it holds is answered again
    client.send(WatchTcAssignmentsClose(0))
    assert (await client.watch_assignments(MAX_WATCHES_PER_CONNECTION)).error is None  # room again
    assert (await client.new_txn(tc_id=3)).error is None  # the connection is unaffected
