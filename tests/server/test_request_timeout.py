"""--request-timeout-s (tc_server/server/deadlines.py): a request the store does not finish in time is
answered TransactionCoordinatorNotFound (the code the Java client retries), the server goes on serving,
and a cancellation that is not the deadline's stays a cancellation."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from tc_server.app import start_app
from tc_server.client import connect
from tc_server.server.deadlines import RequestDeadlines
from tc_server.wire import ServerError
from tests.support.gated_store import GatedStore


async def test_stalled_request_is_answered_when_its_deadline_passes(settings):
    store = GatedStore()
    app = await start_app(replace(settings, request_timeout_s=0.3), store=store)
    client = await connect("127.0.0.1", app.listeners[0].port)
    try:
        store.gate.clear()
        stalled = await asyncio.gather(*(client.new_txn(tc_id=tc, ttl_ms=60_000) for tc in (0, 5, 15)))
        assert [r.error for r in stalled] == [ServerError.TransactionCoordinatorNotFound] * 3
        assert all("--request-timeout-s" in (r.message or "") for r in stalled)
        assert [r.most for r in stalled] == [0, 5, 15]  # routed by the Java client on txnid_most_bits
        store.gate.set()
        served = await client.new_txn(tc_id=5, ttl_ms=60_000)
        assert served.error is None
        ended = await client.end_txn(served.most, served.least, commit=True)
        assert ended.error is None
    finally:
        client.close()
        await app.stop()


async def test_a_cancellation_from_elsewhere_is_not_a_timeout():
    deadlines = RequestDeadlines(timeout_s=60.0)
    outcome: list[str] = []

    async def request() -> None:
        entered = deadlines.enter()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            outcome.append("timeout" if deadlines.timed_out(entered[0]) else "cancelled")
            raise
        finally:
            deadlines.leave(entered)

    task = asyncio.create_task(request())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outcome == ["cancelled"]


async def test_a_finished_request_is_never_cancelled_by_its_deadline():
    deadlines = RequestDeadlines(timeout_s=0.0, tick_s=0.01)

    async def request() -> str:
        entered = deadlines.enter()
        try:
            return "done"
        finally:
            deadlines.leave(entered)

    assert await asyncio.create_task(request()) == "done"
    # Past the bucket's timer: the finished task was taken out of it, nothing is left to cancel.
    await asyncio.sleep(0.05)
    assert not deadlines._expired and all(not bucket for bucket in deadlines._buckets.values())
