"""/readyz from facts (issue 15, "/readyz lies"): store writes that fail or never finish and a recovery scan
that fails make it 503 with a reason naming them; it turns 200 again once they work (a scan: once it
succeeds; writes: once none failed for health.FRESH_S).

The failing disk and the damaged index are stand-ins: a memory store that raises the error the
embedded store raises for a full disk or a corrupt file, on cue (neither can be produced on cue
on this machine without root). The stalled writer is the embedded store's own, stopped with SIGSTOP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tc_server.app import App, start_app
from tc_server.client import connect
from tc_server.config import Settings
from tc_server.health import FRESH_S
from tc_server.store.api import Record, StoreUnavailableError
from tc_server.store.embedded import EmbeddedStore
from tc_server.store.memory import MemoryBackend, MemoryStore
from tc_server.wire import ServerError

BOUND_S = 30.0


class FailingStore(MemoryStore):
    """Header writes fail while ``disk_full``; deadline-index scans fail while ``index_damaged``."""

    def __init__(self) -> None:
        super().__init__()
        self.disk_full = False
        self.index_damaged = False

    async def put(self, key: str, value: bytes, **kwargs: Any) -> Record:
        if self.disk_full and key.startswith("/txn/id/"):
            raise StoreUnavailableError("embedded store: write failed: OperationalError: database or disk is full")
        return await super().put(key, value, **kwargs)

    def scan_index(self, index_name: str, start_inclusive: str, end_exclusive: str, *,
                   partition_key: str | None = None) -> AsyncIterator[Record]:
        if self.index_damaged and "deadline" in index_name:
            raise StoreUnavailableError("embedded store: scan failed: DatabaseError: database disk image is malformed")
        return super().scan_index(index_name, start_inclusive, end_exclusive, partition_key=partition_key)


async def admin_get(app: App, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", app.admin.port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: tc\r\nConnection: close\r\n\r\n".encode())
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def readyz(app: App) -> tuple[int, dict[str, Any]]:
    status, body = await admin_get(app, "/readyz")
    return status, json.loads(body)


async def scraped_ready(app: App) -> float:
    """tc_server_ready from /metrics, which the alert rules read (deploy/prometheus/alerts.yml)."""
    status, body = await admin_get(app, "/metrics")
    assert status == 200
    (sample,) = [s for family in text_string_to_metric_families(body.decode()) for s in family.samples
                 if s.name == "tc_server_ready"]
    return float(sample.value)


class ManualClock:
    """health.Health's clock, moved by the test: how long a failure stands is read from it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def until_status(app: App, status: int) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for _ in range(int(BOUND_S / 0.05)):
        code, doc = await readyz(app)
        if code == status:
            # The gauge the alert rules read says the same (its checks are /readyz's, run at the scrape).
            assert await scraped_ready(app) == (1.0 if status == 200 else 0.0), doc
            return doc
        await asyncio.sleep(0.05)
    raise AssertionError(f"/readyz never answered {status}; last: {doc}")


async def test_failing_writes_make_readyz_fail_with_a_reason(settings: Settings) -> None:
    store = FailingStore()
    app = await start_app(settings, store=store)
    clock = ManualClock()
    app.coordinator.health._clock = clock
    try:
        await until_status(app, 200)
        client = await connect("127.0.0.1", app.listeners[0].port)
        store.disk_full = True
        assert (await client.new_txn(tc_id=1)).error is not None
        doc = await until_status(app, 503)
        assert any("metadata store failing" in p and "disk is full" in p for p in doc["problems"]), doc
        store.disk_full = False
        assert (await readyz(app))[0] == 503
        # A NEW_TXN, which always writes its header, clears it at once (only a request that surely wrote
        # does: a repeated ADD, which writes nothing, succeeds while every write fails).
        assert (await client.new_txn(tc_id=1)).error is None
        await until_status(app, 200)
        # Without a request that wrote, it stands for FRESH_S after the last failure.
        store.disk_full = True
        assert (await client.new_txn(tc_id=1)).error is not None
        await until_status(app, 503)
        store.disk_full = False
        clock.now += FRESH_S + 1
        await until_status(app, 200)
        # A failure an hour later is new: not "failing for 3631 s" from the aged-out one (a review).
        clock.now += 3600
        store.disk_full = True
        assert (await client.new_txn(tc_id=1)).error is not None
        doc = await until_status(app, 503)
        assert any(p.startswith("metadata store failing for 0 s") for p in doc["problems"]), doc
        client.close()
    finally:
        await app.stop()


async def test_writes_that_never_finish_make_readyz_fail(settings: Settings) -> None:
    # The embedded store's writer process stopped (as by a hung fsync): writes raise nothing, they never
    # finish, and requests run out of their deadline; reads, the probe's own included, still work.
    app = await start_app(replace(settings, store="embedded", request_timeout_s=1.0))
    try:
        await until_status(app, 200)
        client = await connect("127.0.0.1", app.listeners[0].port)
        assert isinstance(app.store, EmbeddedStore) and app.store._writer is not None
        writer_pid = app.store._writer.pid
        os.kill(writer_pid, signal.SIGSTOP)
        try:
            stalled = await client.new_txn(tc_id=1)
            assert stalled.error is ServerError.TransactionCoordinatorNotFound, stalled
            doc = await until_status(app, 503)
            assert any("metadata store failing" in p and "--request-timeout-s" in p for p in doc["problems"]), doc
        finally:
            os.kill(writer_pid, signal.SIGCONT)
        client.close()
    finally:
        await app.stop()


async def test_a_failing_recovery_scan_makes_readyz_fail_until_it_succeeds(settings: Settings) -> None:
    store = FailingStore()
    store.index_damaged = True
    app = await start_app(replace(settings, store="memory"), store=store)
    try:
        doc = await until_status(app, 503)
        assert any("recovery scan failing" in p and "malformed" in p for p in doc["problems"]), doc
        store.index_damaged = False
        await until_status(app, 200)
    finally:
        await app.stop()


async def test_timeouts_that_cannot_be_aborted_make_readyz_fail(settings: Settings) -> None:
    store = FailingStore()
    app = await start_app(settings, store=store)
    try:
        await until_status(app, 200)
        client = await connect("127.0.0.1", app.listeners[0].port)
        assert (await client.new_txn(tc_id=4, ttl_ms=1)).error is None
        client.close()
        store.disk_full = True  # its timeout abort (a header write) now fails, again and again
        doc = await until_status(app, 503)
        assert any("timeout sweep failing" in p and "could not be aborted" in p for p in doc["problems"]), doc
        store.disk_full = False
        await until_status(app, 200)
    finally:
        await app.stop()


async def test_two_instances_with_one_advertised_url_are_named_as_such(settings: Settings) -> None:
    # Each holds its own coordinators' records, which name the URL they share: each then sees the other's
    # coordinators "led by itself" without serving them. /readyz said "not every transaction coordinator
    # has a leader yet", which sent the operator to look for a missing leader.
    backend = MemoryBackend()
    shared = replace(settings, advertised_url="pulsar://tc.example:6650")
    a = await start_app(shared, store=MemoryStore(backend))
    try:
        b = await start_app(replace(shared, listen="127.0.0.1:0", admin_listen="127.0.0.1:0"),
                            store=MemoryStore(backend))
        try:
            for app in (a, b):
                # Until the two have split the coordinators: meanwhile a released one may have no leader yet.
                doc: dict[str, Any] = {}
                for _ in range(int(BOUND_S / 0.05)):
                    code, doc = await readyz(app)
                    if code == 503 and any("another instance started with the same --advertised-url" in p
                                           and "pulsar://tc.example:6650" in p for p in doc["problems"]):
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError(f"/readyz never named the shared URL; last: {doc}")
        finally:
            await b.stop()
    finally:
        await a.stop()
