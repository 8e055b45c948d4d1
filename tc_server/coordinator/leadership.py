"""Leadership of coordinator partitions: an ephemeral ``/txn/tc/leader/<N>`` record per partition.

Every instance campaigns for every partition by creating the record if absent, bound to its store
session (docs/semantics.md §8, PIP-473 P5.3). The record is Pulsar's ``TcLeader`` (docs/record-layout.md) and
names the leader's advertised URL, which LOOKUP hands to clients. When the holder's session ends, the
record disappears and the others campaign again.

Correctness never depends on this: two instances that both believe they lead still change headers
only by CAS and reserve disjoint id blocks. Leadership only decides who answers which clients.
On the embedded store there is one process, whose ephemeral records from an earlier run are removed
when the store opens, so it wins every campaign.

Balance: each instance also holds an ephemeral member record. An instance campaigns only while it
leads fewer than its fair share, ``ceil(partitions / live members)``, and releases its highest
partitions when it leads more (a newcomer joined), so two instances split 16 coordinators 8/8 and a
survivor takes all 16 once the other's session has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import uuid
from collections.abc import Awaitable, Callable

import structlog

from tc_server.coordinator import layout
from tc_server.logs import LogLimiter
from tc_server.store.api import (
    EXPECT_ABSENT,
    BadVersionError,
    MetadataStore,
    NotificationType,
    StoreError,
)

log = structlog.get_logger("tc_server.leadership")

# How often each partition's record is checked, besides the notifications: a missed notification
# (reconnect, retention) must not leave a partition without a leader for long.
RECHECK_INTERVAL_S = 1.0
# How long a stop waits for its leader and member records to be deleted (see stop).
STEP_DOWN_DELETES_S = 3.0

Callback = Callable[[int], Awaitable[None]]
# Called with the new tcId -> leader URL map whenever it changes (WATCH_TC_ASSIGNMENTS).
ChangeListener = Callable[[dict[int, str]], None]


def leader_value(url: str, instance_id: str, url_tls: str | None = None) -> bytes:
    """Our ``TcLeader`` record (docs/record-layout.md): ``{"brokerId":…,"brokerServiceUrl":…}``, and
    ``brokerServiceUrlTls`` when this instance has a TLS listener."""
    return layout.TcLeader(broker_id=instance_id, broker_service_url=url, broker_service_url_tls=url_tls).to_json()


# Unreadable leader and member records are read again at every recheck (about a second): one line per key a minute.
_UNREADABLE_RECORDS = LogLimiter(interval_s=60.0)


def parse_leader(raw: bytes, key: str) -> layout.TcLeader | None:
    """A leader (or member) record ``key``, ours or a Pulsar broker's; None for one that does not parse (logged
    with its key: the partition then looks leaderless until it is replaced)."""
    try:
        return layout.TcLeader.from_json(raw)
    except ValueError as exc:
        if (left_out := _UNREADABLE_RECORDS.allow(key)) is not None:
            log.warning("unreadable leader record", key=key, error=str(exc), left_out_since_last_line=left_out)
        return None


class LeaderElection:
    def __init__(
        self,
        store: MetadataStore,
        partitions: int,
        advertised_url: str,
        on_elected: Callback,
        on_lost: Callback,
        advertised_url_tls: str | None = None,
        campaign: frozenset[int] | None = None,
    ) -> None:
        self._store = store
        self._partitions = partitions
        # The partitions this instance may lead at all (a worker of --workers N: i mod N = its index,
        # tc_server/workers.py); None: every partition. The others are only watched.
        self._campaign = campaign
        self._url = advertised_url
        self._url_tls = advertised_url_tls
        # An instance's pulsar:// URL -> its pulsar+ssl:// URL, learned from the leader records.
        self.tls_urls: dict[str, str] = {advertised_url: advertised_url_tls} if advertised_url_tls else {}
        self.instance_id = uuid.uuid4().hex
        self._on_elected = on_elected
        self._on_lost = on_lost
        self.leaders: dict[int, str] = {}  # tc_id -> advertised URL of its known leader
        # tc_id -> key of its leader record, which cannot be read (a foreign writer's): /readyz names them.
        self.unreadable: dict[int, str] = {}
        self.led: set[int] = set()
        self._versions: dict[int, int] = {}  # version of our own leader record, per led partition
        # The store session that holds our own leader record, per partition being started or led (Record.
        # session_id): its lease is that session's (lease_session), not whichever this process holds now.
        self._sessions: dict[int, int | None] = {}
        # The store session that holds this instance's member record, as last read or written.
        self.member_session: int | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()
        self.share = partitions  # how many partitions this instance may lead
        self.listeners: list[ChangeListener] = []
        self._published: dict[int, str] = {}
        self._failures = LogLimiter()  # the recheck's failed steps (_guarded)

    async def start(self) -> None:
        """Join, campaign once for every partition (up to the fair share), then keep watching."""
        # Subscribe first so that no deletion between the campaign and the watch is missed.
        notifications = self._store.notifications(layout.LEADER_PREFIX)
        await self._update_share()
        await self.campaign_all()
        self._tasks = [
            asyncio.create_task(self._watch(notifications), name="leader-watch"),
            asyncio.create_task(self._recheck(), name="leader-recheck"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        # Step down explicitly so that another instance takes over at once instead of after the
        # session timeout: every partition stops first, all at once (each gives its unwritten events a
        # last bounded try: one after the other, 16 of them made a stop on a store that does not answer
        # 16 times as long), then the records go, together. Their deletes are bounded too: a store that
        # does not answer (a stalled disk, a stopped writer process) must not hold the stop forever, and
        # the records are the session's, so they go with it anyway (the embedded store's next open,
        # Oxia's session timeout), only later.
        async with self._lock:
            released = {tc_id: self._versions.get(tc_id) for tc_id in sorted(self.led)}
            for tc_id in released:
                self.leaders.pop(tc_id, None)
            await asyncio.gather(*(self._lose(tc_id, stepped_down=True) for tc_id in released))
            deletes = [asyncio.ensure_future(self._delete_record(tc_id, version))
                       for tc_id, version in released.items()]
            deletes.append(asyncio.ensure_future(self._delete_member()))
            _, left = await asyncio.wait(deletes, timeout=STEP_DOWN_DELETES_S)
            for delete in left:
                delete.cancel()
            if left:
                log.error("leader records not deleted at stop: the store did not answer; they go with the "  # noqa: TRY400
                          "session", waited_s=STEP_DOWN_DELETES_S, records=len(left))
            await asyncio.gather(*deletes, return_exceptions=True)

    async def campaign_all(self) -> None:
        """Check every partition once. A store error on one (a leader record created whose answer was
        lost, a read that failed) is left to the periodic recheck, which adopts or retries it: it
        neither fails the start nor keeps the other partitions from being campaigned for."""
        for tc_id in range(self._partitions):
            try:
                await self._check(tc_id)
            except (TimeoutError, StoreError) as exc:
                log.warning("leadership check failed; the recheck retries it", coordinator_id=tc_id,
                            error=repr(exc))

    async def _update_share(self) -> None:
        members = 0
        mine = False
        async for record in self._store.scan_prefix(layout.MEMBER_PREFIX):
            # A record that is no member's (a stray writer's, never expiring if not ephemeral) is named, not
            # counted: three of them kept a lone instance at a quarter of the coordinators (a review's).
            if parse_leader(record.value, record.key) is None:
                continue
            members += 1
            if record.key == layout.member_path(self.instance_id):
                mine, self.member_session = True, record.session_id
        if not mine:
            # First start, or our store session ended (Oxia expired it) and took the record along.
            written = await self._store.put(layout.member_path(self.instance_id),
                                            leader_value(self._url, self.instance_id), ephemeral=True)
            self.member_session = written.session_id
            members += 1
        self.share = math.ceil(self._partitions / members)

    async def _release_excess(self) -> None:
        """Step down from the highest partitions beyond the fair share, so a newcomer gets them."""
        async with self._lock:
            for tc_id in sorted(self.led, reverse=True)[: max(0, len(self.led) - self.share)]:
                log.info("releasing leadership to balance", coordinator_id=tc_id, share=self.share)
                await self._release(tc_id, self._versions.get(tc_id))
        self._publish_changes()

    async def _check(self, tc_id: int) -> None:
        """Bring this instance's view of one partition in line with its leader record. Every change
        of ``led`` happens here or in a release, under one lock, so the set of partitions served
        and the leader records never drift apart."""
        async with self._lock:
            await self._reconcile(tc_id)
        self._publish_changes()

    def _publish_changes(self) -> None:
        if self.leaders != self._published:
            self._published = dict(self.leaders)
            for listener in list(self.listeners):
                listener(dict(self._published))

    async def _reconcile(self, tc_id: int) -> None:
        current = await self._store.get(layout.leader_path(tc_id))
        if current is None:
            self.leaders.pop(tc_id, None)
            self.unreadable.pop(tc_id, None)
            await self._lose(tc_id)
            if len(self.led) < self.share and self.may_lead(tc_id):
                await self._try_take(tc_id)
            return
        owner = self._note_leader(tc_id, current.value)
        if owner == self.instance_id:
            if tc_id in self.led and current.session_id != self._sessions.get(tc_id):
                # Our record, but held by another session than the one the partition's lease follows (a
                # write of ours answered late): its lease says nothing of this record. Served again from
                # the next check, which takes the record over under the session held then.
                await self._lose(tc_id)
            elif tc_id in self.led:
                self._versions[tc_id] = current.version
            elif len(self.led) < self.share and self.may_lead(tc_id):
                # Our own record, but we do not serve it: a create whose answer was lost, or a
                # take-over that failed half way. Written again first, under the version read, so that the
                # session this process holds now holds it: one it has since replaced (given up for lost while
                # the server still had it) would take the record with it when the server expires it, and the
                # partition's lease, which follows the record's session, would be over from the start.
                try:
                    record = await self._store.put(
                        layout.leader_path(tc_id), leader_value(self._url, self.instance_id, self._url_tls),
                        expected_version=current.version, ephemeral=True)
                except BadVersionError:
                    return  # changed or gone meanwhile: the next check sees what it is now
                await self._serve(tc_id, record.version, record.session_id)
            else:
                await self._release(tc_id, current.version)
        elif tc_id in self.led:
            await self._lose(tc_id)

    def may_lead(self, tc_id: int) -> bool:
        return self._campaign is None or tc_id in self._campaign

    def _note_leader(self, tc_id: int, raw: bytes) -> str | None:
        """Record who leads ``tc_id`` from its leader record, and that leader's TLS URL; returns the
        record's brokerId. A Pulsar 5 broker with a TLS listener only writes no brokerServiceUrl (Pulsar's
        TcLeader: "may be null"): it is known by its TLS URL, which then stands for both. Before, such a
        coordinator looked leaderless: missing from LOOKUP and WATCH_TC_ASSIGNMENTS answers, and this
        instance never ready."""
        leader = parse_leader(raw, layout.leader_path(tc_id))
        if leader is None:
            # Not the leader it named before (a review: a damaged record left this instance's own URL in place, so
            # /readyz blamed a restart and WATCH_TC_ASSIGNMENTS kept sending clients here for it).
            self.leaders.pop(tc_id, None)
            self.unreadable[tc_id] = layout.leader_path(tc_id)
            return None
        self.unreadable.pop(tc_id, None)
        known = leader.broker_service_url or leader.broker_service_url_tls
        if known:
            self.leaders[tc_id] = known
            if leader.broker_service_url_tls:
                self.tls_urls[known] = leader.broker_service_url_tls
        return leader.broker_id

    async def _try_take(self, tc_id: int) -> None:
        path = layout.leader_path(tc_id)
        try:
            record = await self._store.put(
                path, leader_value(self._url, self.instance_id, self._url_tls), expected_version=EXPECT_ABSENT,
                ephemeral=True
            )
        except BadVersionError:
            current = await self._store.get(path)
            if current is not None:
                self._note_leader(tc_id, current.value)
            return
        await self._serve(tc_id, record.version, record.session_id)

    def lease_session(self, tc_id: int) -> int | None:
        """The store session that holds this instance's leader record of ``tc_id`` (None: no session, or a
        store without them): what the partition's lease follows (MetadataStore.ephemeral_lease)."""
        return self._sessions.get(tc_id)

    async def _serve(self, tc_id: int, version: int, session_id: int | None) -> None:
        """Start serving a partition whose leader record is ours, held by store session ``session_id``;
        release the record if the partition cannot be started (e.g. its recovery scan failed), so someone
        can retry."""
        self._versions[tc_id] = version
        self._sessions[tc_id] = session_id
        self.leaders[tc_id] = self._url
        try:
            await self._on_elected(tc_id)
        except Exception as exc:  # noqa: BLE001 - any failure to start means: do not claim it
            log.warning("could not take over; releasing", coordinator_id=tc_id, error=repr(exc))
            await self._release(tc_id, version)
            return
        self.led.add(tc_id)
        log.info("elected", coordinator_id=tc_id)

    async def _release(self, tc_id: int, version: int | None) -> None:
        """Stop serving the partition, then delete our leader record (best effort: if it stays, the next
        check serves or releases it again). In this order: the next leader can win only once the record
        is gone, so it sees every write the partition made while it served, and a write that lands after
        the stop is not answered as a success (CoordinatorPartition: stepped down meanwhile)."""
        self.leaders.pop(tc_id, None)
        self._versions.pop(tc_id, None)
        self._sessions.pop(tc_id, None)
        await self._lose(tc_id, stepped_down=True)
        await self._delete_record(tc_id, version)

    async def _delete_record(self, tc_id: int, version: int | None) -> None:
        try:
            await self._store.delete(layout.leader_path(tc_id), expected_version=version)
        except (TimeoutError, StoreError) as exc:
            log.warning("could not delete leader record", coordinator_id=tc_id, error=repr(exc))

    async def _delete_member(self) -> None:
        with contextlib.suppress(StoreError, asyncio.TimeoutError):
            await self._store.delete(layout.member_path(self.instance_id))

    async def _lose(self, tc_id: int, *, stepped_down: bool = False) -> None:
        """Stop serving ``tc_id``. Losing a record someone else took (or the store dropped) is worth a
        warning; stepping down on purpose (stop, balance) is not: an orderly stop must not print one
        warning per coordinator."""
        if tc_id not in self.led:
            return
        self.led.discard(tc_id)
        self._versions.pop(tc_id, None)
        self._sessions.pop(tc_id, None)
        if stepped_down:
            log.debug("stepped down", coordinator_id=tc_id)
        else:
            log.warning("lost leadership", coordinator_id=tc_id)
        await self._on_lost(tc_id)

    async def _watch(self, notifications: object) -> None:
        iterator = notifications.__aiter__()  # type: ignore[attr-defined]
        while True:
            try:
                async for note in iterator:
                    if not note.key.startswith(layout.LEADER_PREFIX):
                        continue
                    suffix = note.key[len(layout.LEADER_PREFIX):]
                    # ASCII digits: a foreign key such as ".../leader/²" passes str.isdigit() only.
                    if not (suffix.isascii() and suffix.isdigit()) or int(suffix) >= self._partitions:
                        continue
                    tc_id = int(suffix)
                    if note.type is NotificationType.DELETED:
                        self.leaders.pop(tc_id, None)
                    await self._check(tc_id)
                return
            except (TimeoutError, StoreError) as exc:
                log.warning("leader watch interrupted", error=repr(exc))
            except Exception:  # noqa: BLE001 - the periodic recheck covers; the watch must go on
                log.exception("leader watch failed")
            await asyncio.sleep(RECHECK_INTERVAL_S)
            iterator = self._store.notifications(layout.LEADER_PREFIX).__aiter__()

    async def _recheck(self) -> None:
        while True:
            await asyncio.sleep(RECHECK_INTERVAL_S)
            # Each step on its own: one failure ended the pass, and one coordinator whose record could not be
            # read (its Oxia shard down), or a member scan that failed, kept every later one unchecked, a
            # coordinator whose leader left included. A failed share keeps the last one.
            await self._guarded("the members' share", None, self._update_share)
            await self._guarded("releasing coordinators past the share", None, self._release_excess)
            for tc_id in range(self._partitions):
                await self._guarded("leadership check", tc_id, functools.partial(self._check, tc_id))

    async def _guarded(self, what: str, tc_id: int | None, step: Callable[[], Awaitable[object]]) -> None:
        try:
            await step()
        except (TimeoutError, StoreError) as exc:
            # Every recheck (1 s) and every coordinator a down shard holds: one line per step and 10 s.
            if (left_out := self._failures.allow(f"{what}:{tc_id}")) is not None:
                log.warning(f"{what} failed", tc_id=tc_id, error=repr(exc), left_out_since_last_line=left_out)
        except Exception:  # noqa: BLE001 - leadership upkeep must survive a bug in one step
            log.exception(f"{what} failed", tc_id=tc_id)
