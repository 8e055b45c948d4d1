"""The in-process notification fan-out: bounded per-subscriber queues."""

from __future__ import annotations

import pytest

from tc_server.store.api import Notification, NotificationType, StoreUnavailableError
from tc_server.store.memory import MemoryStore
from tc_server.store.notify import NotificationHub


def note(key: str) -> Notification:
    return Notification(NotificationType.CREATED, key, 1)


async def test_lagging_subscriber_gets_its_backlog_then_an_error() -> None:
    hub = NotificationHub(limit=3)
    slow, fast = hub.subscribe(), hub.subscribe()
    hub.publish([note("a"), note("b")])
    assert await anext(fast) == note("a")
    assert await anext(fast) == note("b")
    hub.publish([note("c"), note("d")])  # slow now needs 4 slots
    assert [await anext(slow), await anext(slow)] == [note("a"), note("b")]
    with pytest.raises(StoreUnavailableError, match="behind"):
        await anext(slow)
    with pytest.raises(StopAsyncIteration):
        await anext(slow)
    # The other subscriber is unaffected.
    assert [await anext(fast), await anext(fast)] == [note("c"), note("d")]


async def test_closed_subscription_stops() -> None:
    hub = NotificationHub()
    sub = hub.subscribe()
    hub.publish([note("a")])
    await sub.aclose()
    hub.publish([note("b")])
    with pytest.raises(StopAsyncIteration):
        await anext(sub)


async def test_other_memory_sessions_see_ephemeral_deletes() -> None:
    # Two sessions on one data set play two coordinator instances.
    leader = MemoryStore()
    follower = MemoryStore(leader.backend)
    stream = follower.notifications()
    record = await leader.put("/leader/0", b"me", ephemeral=True)
    assert await follower.get("/leader/0") == record
    await leader.close()
    assert await follower.get("/leader/0") is None
    assert [await anext(stream), await anext(stream)] == [
        Notification(NotificationType.CREATED, "/leader/0", record.version),
        Notification(NotificationType.DELETED, "/leader/0"),
    ]
    await follower.close()
