"""Change-notification fan-out shared by the in-process backends (memory, embedded).

Each subscriber gets its own bounded queue, so a slow subscriber never blocks writers nor the other
subscribers. When a subscriber falls more than :data:`SUBSCRIBER_QUEUE_LIMIT` notifications behind,
its stream is cut: the notifications already queued are still delivered, then the iterator raises
:class:`StoreUnavailableError`. Silently dropping would leave the subscriber believing it saw every
change; an Oxia notification stream that breaks also surfaces as an error, so a consumer written
for one backend handles the other (re-read the state it cares about, subscribe again).

Everything here runs on the event loop thread; the embedded store hands its commits over with
``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable

import structlog

from tc_server.store.api import Notification, StoreError, StoreUnavailableError

log = structlog.get_logger(__name__)

# Enough for a burst of ~10k commits between two reads of the subscriber; a subscriber further
# behind than that is better told to resynchronise than allowed to grow without bound.
SUBSCRIBER_QUEUE_LIMIT = 10_000


class NotificationQueue:
    """One subscriber's stream: an async iterator of :class:`Notification`, fed by its source
    (the hub here, the Oxia pump for the Oxia backend) through :meth:`deliver`.

    Ends (``StopAsyncIteration``) when the source ends it, after what is queued. Raises
    :class:`StoreUnavailableError` once, after the queued notifications, if it fell more than
    ``limit`` behind.
    """

    def __init__(self, limit: int, on_end: Callable[[NotificationQueue], None], key_prefix: str = "") -> None:
        self.key_prefix = key_prefix  # only keys that start with it are delivered
        self._limit = limit
        self._on_end = on_end
        self._items: deque[Notification] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._error: StoreError | None = None

    def __aiter__(self) -> NotificationQueue:
        return self

    async def __anext__(self) -> Notification:
        while not self._items:
            if self._ended:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    async def aclose(self) -> None:
        """Stop receiving; what is still queued is discarded."""
        self._items.clear()
        self.end(None)

    def deliver(self, batch: list[Notification]) -> None:
        if self._ended:
            return
        if self.key_prefix:
            prefix = self.key_prefix
            batch = [note for note in batch if note.key.startswith(prefix)]
            if not batch:
                return
        if len(self._items) + len(batch) > self._limit:
            log.warning("store_notification_subscriber_lagging", queued=len(self._items), limit=self._limit)
            self.end(StoreUnavailableError(
                f"notification subscriber fell more than {self._limit} notifications behind; "
                "re-read the state and subscribe again"))
            return
        self._items.extend(batch)
        self._wake()

    def end(self, error: StoreError | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._error = error
        self._on_end(self)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


# The in-process backends' subscription is the plain queue.
Subscription = NotificationQueue


class NotificationHub:
    """The subscribers of one store session."""

    def __init__(self, limit: int = SUBSCRIBER_QUEUE_LIMIT) -> None:
        self._limit = limit
        self._subscribers: set[Subscription] = set()
        # The subscribers' key prefixes, for str.startswith: a store builds no notification of a key
        # nobody subscribed to (issue 13: the leader watch wants /txn/tc/leader/, not every header).
        self.wanted_prefixes: tuple[str, ...] = ()

    def subscribe(self, key_prefix: str = "") -> Subscription:
        # Registered now, not at the first __anext__, so that "changes committed after the call"
        # holds even if the caller starts iterating later.
        sub = Subscription(self._limit, self._ended, key_prefix)
        self._subscribers.add(sub)
        self._update_prefixes()
        return sub

    def _ended(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)
        self._update_prefixes()

    def _update_prefixes(self) -> None:
        self.wanted_prefixes = tuple({sub.key_prefix for sub in self._subscribers})

    def publish(self, batch: Iterable[Notification]) -> None:
        """Hand one commit's notifications, in commit order, to every subscriber."""
        items = list(batch)
        if not items:
            return
        for sub in list(self._subscribers):
            sub.deliver(items)

    def fail(self, error: StoreError) -> None:
        """Break every subscription with ``error`` (after what is already queued): changes may have been
        committed that no notification will ever report, so subscribers must re-read the state."""
        for sub in list(self._subscribers):
            sub.end(error)

    def close(self) -> None:
        """End every subscription (after what is already queued)."""
        for sub in list(self._subscribers):
            sub.end(None)
