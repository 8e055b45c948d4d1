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

    async def request() -> None:
        with deadlines.bound("the request"):
            await asyncio.Event().wait()

    task = asyncio.create_task(request())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_past_its_deadline_a_task_sees_a_timeout_naming_what_and_can_go_on():
    deadlines = RequestDeadlines(timeout_s=0.0, tick_s=0.01)

    async def request() -> str:
        with pytest.raises(TimeoutError, match="the lookup of t not finished within 0.0 s"):
            with deadlines.bound("the lookup of t"):
                await asyncio.Event().wait()
        # The cancellation was withdrawn: the task awaits on (e.g. a retry after a backoff).
        await asyncio.sleep(0.02)
        return "went on"

    assert await asyncio.create_task(request()) == "went on"


async def test_wait_bounds_the_wait_for_a_future_and_never_cancels_it():
    # END_TXN's wait for the participants (Dispatcher._wait_delivered): the delivery goes on.
    deadlines = RequestDeadlines(timeout_s=0.0, tick_s=0.01)
    delivery = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError, match="the participants' acknowledgements not finished"):
        await asyncio.create_task(deadlines.wait(delivery, "the participants' acknowledgements"))
    assert not delivery.done()
    delivery.set_result(None)  # the late acknowledgement finds a done waiter and does nothing
    await asyncio.sleep(0)
    await asyncio.create_task(deadlines.wait(delivery, "done already"))  # returns at once
    acknowledged_later = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.001, acknowledged_later.set_result, None)
    await asyncio.create_task(RequestDeadlines(timeout_s=60.0).wait(acknowledged_later, "in time"))


async def test_a_finished_request_is_never_cancelled_by_its_deadline():
    deadlines = RequestDeadlines(timeout_s=0.0, tick_s=0.01)

    async def request() -> str:
        with deadlines.bound("the request"):
            return "done"

    assert await asyncio.create_task(request()) == "done"
    # Past the bucket's timer: the finished task was taken out of it, nothing is left to cancel.
    await asyncio.sleep(0.05)
    assert not deadlines._expired and all(not bucket for bucket in deadlines._buckets.values())


async def test_a_cancellation_in_the_same_turn_as_the_deadline_stays_a_cancellation():
    # A partition stepping down cancels a delivery task just as that task's deadline fires: the
    # delivery retries on TimeoutError, so the shutdown's cancellation must not become one (the
    # step-down would wait on it for ever). asyncio.timeout() counts cancellations the same way.
    deadlines = RequestDeadlines(timeout_s=0.0, tick_s=0.01)
    timeouts = 0

    async def retrying() -> None:
        nonlocal timeouts
        while True:
            try:
                with deadlines.bound("the request"):
                    await asyncio.Event().wait()
            except TimeoutError:
                timeouts += 1

    expire = deadlines._expire

    def expire_then_shut_down(tick: int) -> None:
        expire(tick)
        task.cancel()

    deadlines._expire = expire_then_shut_down  # type: ignore[method-assign]
    task = asyncio.create_task(retrying())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert timeouts == 0
