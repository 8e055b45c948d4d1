"""Change notifications: one ``GetNotifications`` stream per shard, fanned out to subscribers
(docs/oxia-client.md, "Semantics").

Oxia has no per-range watch: a client reads every change of every shard. The pump starts with the
store, so that it knows each shard's commit offset before anyone subscribes. The server sends one
batch per committed write batch, with the commit offset; a stream that breaks is re-opened from
the last offset received (``start_offset_exclusive``), so nothing is lost or repeated across a
reconnect as long as the server still retains it (1 h by default).

"Changes committed after the call" (the Protocol's promise) is kept by a snapshot taken when a
subscriber is created, per shard: the offset of the last batch the pump received, and the highest
version id known (seen in notifications, or returned to this client's own puts). Oxia numbers the two
apart: one commit offset per write batch, one version id per applied put, from a counter of its own
(oxiad's ``versionIdTracker``; a batch of n puts takes n version ids, a delete none). A batch at or below
the offset snapshot was committed before the call and is not delivered; in a later batch, a put's
notification at or below the version snapshot is one of this client's own puts acknowledged before the
call, not delivered either. Deletes carry no version: one committed just before the call (not yet
received) can still arrive, so a subscriber may see slightly more, never less.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import structlog

from tc_server._proto import oxia_client_pb2 as pb
from tc_server.backoff import Backoff
from tc_server.store.api import Notification, NotificationType, StoreUnavailableError
from tc_server.store.notify import SUBSCRIBER_QUEUE_LIMIT, NotificationQueue
from tc_server.store.oxia.connections import ConnectionPool
from tc_server.store.oxia.routing import ShardMap

# The record of the store's check whether the server answers gets on an index (store.py,
# OxiaStore._check_index_gets), under a root of tc-server's own, not under Pulsar's /txn. The store's own
# bookkeeping: its changes reach no subscriber (the check runs at the first write, within any subscription).
INDEX_CHECK_PREFIX = "/tc-server/index-get-check/"

log = structlog.get_logger(__name__)


_TYPES = {
    pb.KEY_CREATED: NotificationType.CREATED,
    pb.KEY_MODIFIED: NotificationType.MODIFIED,
    pb.KEY_DELETED: NotificationType.DELETED,
}


def convert(batch: pb.NotificationBatch) -> list[Notification]:
    """The Protocol's notifications for one batch. ``KEY_RANGE_DELETED`` has no equivalent (this
    client never deletes ranges) and is dropped with a log line, as is a type newer than this client."""
    out: list[Notification] = []
    for entry in batch.notifications:
        kind = _TYPES.get(entry.value.type)
        if kind is None:
            # The number, not the enum's name: a newer server's type has none here.
            log.warning("oxia_notification_ignored", shard=batch.shard, key=entry.key,
                        type=entry.value.type)
            continue
        version = entry.value.version_id if entry.value.HasField("version_id") else -1
        out.append(Notification(kind, entry.key, version))
    return out


class OxiaSubscription(NotificationQueue):
    """One subscriber's stream; batches at or below its offset snapshot (committed before it
    subscribed) are not delivered."""

    def __init__(self, pump: NotificationPump, offsets: dict[int, int], versions: dict[int, int], limit: int,
                 key_prefix: str = "") -> None:
        super().__init__(limit, pump._subscribers.discard, key_prefix)
        self._offsets = offsets  # per shard: the last batch offset received before the subscription
        self._versions = versions  # per shard: the highest version id known before it

    def _push(self, shard: int, offset: int, items: list[Notification]) -> None:
        if offset <= self._offsets.get(shard, -2):
            return
        known = self._versions.get(shard, -1)
        if any(0 <= note.version <= known for note in items):
            items = [note for note in items if not 0 <= note.version <= known]
        if items:
            self.deliver(items)


class NotificationPump:
    """The per-shard notification streams of one store and their subscribers.

    ``shard_map()`` returns the current assignments (it may raise :class:`StoreUnavailableError`
    while there are none); each stream asks it for the shard's leader on every (re)connect.
    """

    def __init__(self, pool: ConnectionPool, shard_map: Callable[[], ShardMap],
                 *, limit: int = SUBSCRIBER_QUEUE_LIMIT) -> None:
        self._pool = pool
        self._shard_map = shard_map
        self._limit = limit
        self._offsets: dict[int, int] = {}  # per shard: the offset of the last batch received
        self._versions: dict[int, int] = {}  # per shard: the highest version id in the batches received
        self._own_versions: dict[int, int] = {}  # per shard: the highest version id of this client's puts
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._leaders: dict[int, str] = {}  # per shard: its leader in the last assignment (update)
        self._first: dict[int, asyncio.Event] = {}
        self._subscribers: set[OxiaSubscription] = set()
        # Set after every batch, for drain() to re-check its condition.
        self._progress = asyncio.Event()
        # This client's ephemeral records still in place, key -> [shard, version id of the put, whether the
        # put's own notification was seen], whose deletion drain() waits for (closing the session deletes
        # them). A later change of the key on its shard, by anyone, ends the entry: overwritten (a higher
        # version) or deleted after the put's notification (by a client, or with an expired session), it
        # will not be deleted with the session any more, and waiting for that would take drain()'s whole
        # timeout. A delete seen before the put's own notification is an older one.
        self._own_ephemeral: dict[str, list[int | bool]] = {}

    def update(self, shards: ShardMap) -> None:
        """Follow a new assignment: start streams for new shards, stop removed ones, and move a shard's stream
        to its new leader (from the last offset received): a deposed leader that stays up keeps its stream
        open and silent, and the subscribers heard nothing of the shard's changes any more (a review).

        A shard added or removed after subscriptions were made (a split) ends them with an error, so that
        their consumers read again and subscribe again: a new shard's stream starts at its commit offset when
        it opens, after changes made on it since the assignment, and a removed shard's last batches may
        never arrive."""
        leaders = {info.shard: info.leader for info in shards.shards}
        added, removed = leaders.keys() - self._tasks.keys(), self._tasks.keys() - leaders.keys()
        moved = {shard for shard in leaders.keys() & self._tasks.keys() if self._leaders.get(shard) != leaders[shard]}
        self._leaders = leaders
        for shard in removed:
            self._tasks.pop(shard).cancel()
            # Nothing more will be seen of it: drain() would wait out its timeout for its versions and ephemerals.
            for per_shard in (self._offsets, self._versions, self._own_versions, self._first):
                per_shard.pop(shard, None)
            for key in [key for key, owned in self._own_ephemeral.items() if owned[0] == shard]:
                del self._own_ephemeral[key]
        for shard in moved:
            self._tasks.pop(shard).cancel()
        for shard in added | moved:
            self._first.setdefault(shard, asyncio.Event())
            self._tasks[shard] = asyncio.get_running_loop().create_task(
                self._run(shard), name=f"oxia-notifications-{shard}")
        if (added or removed) and self._subscribers:
            error = StoreUnavailableError("the Oxia shards changed (a split or a merge): changes made meanwhile may "
                                          "not be notified; read again and subscribe again")
            for sub in list(self._subscribers):
                sub.end(error)

    def note_own_version(self, shard: int, version: int) -> None:
        """Record the version id of one of this client's own acknowledged puts."""
        if version > self._own_versions.get(shard, -1):
            self._own_versions[shard] = version

    async def wait_ready(self, timeout_s: float) -> bool:
        """Wait until every shard's stream delivered its first batch; False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                for event in list(self._first.values()):
                    await event.wait()
        except TimeoutError:
            return False
        return True

    def subscribe(self, key_prefix: str = "") -> OxiaSubscription:
        versions = dict(self._versions)
        for shard, version in self._own_versions.items():
            versions[shard] = max(version, versions.get(shard, version))
        sub = OxiaSubscription(self, dict(self._offsets), versions, self._limit, key_prefix)
        self._subscribers.add(sub)
        return sub

    @property
    def has_subscribers(self) -> bool:
        return bool(self._subscribers)

    def note_own_ephemeral(self, shard: int, key: str, version: int) -> None:
        """Record an ephemeral put of this client, for :meth:`drain` to wait for its deletion."""
        # Its notification may have come in before the put's answer.
        self._own_ephemeral[key] = [shard, version, version <= self._versions.get(shard, -1)]

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every shard's stream has passed this client's own last put and the deletion of
        its ephemeral records (:meth:`note_own_ephemeral`) was seen. False if that took longer than
        ``timeout_s``."""

        def caught_up() -> bool:
            return not self._own_ephemeral and all(
                self._versions.get(shard, -1) >= version for shard, version in self._own_versions.items())

        try:
            async with asyncio.timeout(timeout_s):
                while not caught_up():
                    self._progress.clear()
                    await self._progress.wait()
        except TimeoutError:
            log.warning("oxia_notifications_drain_timeout", missing_deletes=len(self._own_ephemeral))
            return False
        return True

    async def close(self) -> None:
        """Stop the streams and end every subscription (after what is already queued)."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sub in list(self._subscribers):
            sub.end(None)

    def _end_subscriptions_without(self, shard: int) -> None:
        """End, with an error, the subscriptions made before ``shard``'s stream received anything: the stream
        starts at the shard's commit offset when it opened, and changes made between the subscription and
        then were never to reach them (their consumers read again and subscribe again)."""
        for sub in list(self._subscribers):
            if shard not in sub._offsets:
                sub.end(StoreUnavailableError(f"the Oxia notifications of shard {shard} started after this "
                                              "subscription: read again and subscribe again"))

    def _end_own_ephemeral(self, shard: int, items: list[Notification]) -> None:
        """Drop the own ephemeral records that ``items`` changed after their put. The put's own
        notification (at its version) and older ones, still arriving, do not count."""
        for note in items:
            owned = self._own_ephemeral.get(note.key)
            if owned is None or owned[0] != shard:
                continue
            if note.version == owned[1]:
                owned[2] = True  # the put's own: what follows it is later
            elif note.version > owned[1] or (note.version < 0 and owned[2]):
                del self._own_ephemeral[note.key]

    async def _run(self, shard: int) -> None:
        backoff = Backoff()
        while True:
            request = pb.NotificationsRequest(shard=shard)
            if shard in self._offsets:
                request.start_offset_exclusive = self._offsets[shard]
            try:
                info = self._shard_map().get(shard)
                if info is None:
                    return
                async for batch in self._pool.stub(info.leader).GetNotifications(request):
                    backoff.reset()
                    self._first[shard].set()
                    last = self._offsets.get(shard)
                    if last is None and self._subscribers:
                        self._end_subscriptions_without(shard)
                    if last is not None and batch.offset <= last:
                        continue
                    self._offsets[shard] = batch.offset
                    items = convert(batch)
                    if items:
                        highest = max(note.version for note in items)
                        if highest > self._versions.get(shard, -1):
                            self._versions[shard] = highest
                        delivered = items
                        if any(note.key.startswith(INDEX_CHECK_PREFIX) for note in items):
                            delivered = [note for note in items if not note.key.startswith(INDEX_CHECK_PREFIX)]
                        for sub in list(self._subscribers) if delivered else ():
                            sub._push(shard, batch.offset, delivered)
                        if self._own_ephemeral:
                            self._end_own_ephemeral(shard, items)
                    self._progress.set()
                error = "stream ended"
            except grpc.aio.AioRpcError as e:
                error = f"{e.code().name}: {e.details()}"
            except StoreUnavailableError as e:
                error = str(e)
            log.info("oxia_notifications_reconnect", shard=shard, error=error)
            await asyncio.sleep(backoff.next_delay())
