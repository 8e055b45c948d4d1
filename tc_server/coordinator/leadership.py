"""Leadership of coordinator partitions: an ephemeral ``/txn/tc/leader/<N>`` record per partition.

Every instance campaigns for every partition by creating the record if absent, bound to its store
session (design §4, PIP-473 P5.3). The record names the leader's advertised URL, which LOOKUP hands
to clients. When the holder's session ends, the record disappears and the others campaign again.

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
import json
import math
import uuid
from collections.abc import Awaitable, Callable

import structlog

from tc_server.coordinator import layout
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

Callback = Callable[[int], Awaitable[None]]


def leader_value(url: str, instance_id: str) -> bytes:
    """``TcLeader`` JSON: ``{brokerId, brokerServiceUrl, brokerServiceUrlTls, webServiceUrl}``."""
    return json.dumps({"brokerId": instance_id, "brokerServiceUrl": url}, separators=(",", ":")).encode()


def parse_leader(raw: bytes) -> tuple[str | None, str | None]:
    try:
        doc = json.loads(raw)
        return doc.get("brokerServiceUrl"), doc.get("brokerId")
    except (ValueError, AttributeError):
        return None, None


class LeaderElection:
    def __init__(
        self,
        store: MetadataStore,
        partitions: int,
        advertised_url: str,
        on_elected: Callback,
        on_lost: Callback,
    ) -> None:
        self._store = store
        self._partitions = partitions
        self._url = advertised_url
        self.instance_id = uuid.uuid4().hex
        self._on_elected = on_elected
        self._on_lost = on_lost
        self.leaders: dict[int, str] = {}  # tc_id -> advertised URL of its known leader
        self.led: set[int] = set()
        self._versions: dict[int, int] = {}  # version of our own leader record, per led partition
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()
        self.share = partitions  # how many partitions this instance may lead

    async def start(self) -> None:
        """Join, campaign once for every partition (up to the fair share), then keep watching."""
        # Subscribe first so that no deletion between the campaign and the watch is missed.
        notifications = self._store.notifications()
        await self._store.put(layout.member_path(self.instance_id), leader_value(self._url, self.instance_id),
                              ephemeral=True)
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
        # session timeout.
        for tc_id in sorted(self.led):
            with contextlib.suppress(StoreError, asyncio.TimeoutError):
                await self._store.delete(layout.leader_path(tc_id), expected_version=self._versions.get(tc_id))
        self.led.clear()
        with contextlib.suppress(StoreError, asyncio.TimeoutError):
            await self._store.delete(layout.member_path(self.instance_id))

    async def _update_share(self) -> None:
        members = 0
        async for _ in self._store.scan_prefix(layout.MEMBER_PREFIX):
            members += 1
        self.share = math.ceil(self._partitions / max(1, members))

    async def _release_excess(self) -> None:
        """Step down from the highest partitions beyond the fair share, so a newcomer gets them."""
        for tc_id in sorted(self.led, reverse=True)[: max(0, len(self.led) - self.share)]:
            try:
                await self._store.delete(layout.leader_path(tc_id), expected_version=self._versions.get(tc_id))
            except (TimeoutError, StoreError) as exc:
                log.warning("could not release leadership", coordinator_id=tc_id, error=repr(exc))
                return
            log.info("released leadership to balance", coordinator_id=tc_id, share=self.share)
            self.leaders.pop(tc_id, None)
            await self._lose(tc_id)

    async def campaign_all(self) -> None:
        for tc_id in range(self._partitions):
            await self._campaign(tc_id)

    async def _campaign(self, tc_id: int) -> None:
        async with self._lock:
            path = layout.leader_path(tc_id)
            if tc_id not in self.led and len(self.led) >= self.share:
                # At our share: only learn who leads it.
                current = await self._store.get(path)
                if current is not None:
                    url, _ = parse_leader(current.value)
                    if url:
                        self.leaders[tc_id] = url
                return
            try:
                record = await self._store.put(
                    path, leader_value(self._url, self.instance_id),
                    expected_version=EXPECT_ABSENT, ephemeral=True,
                )
            except BadVersionError:
                current = await self._store.get(path)
                if current is None:
                    return  # released meanwhile; the next check campaigns again
                url, owner = parse_leader(current.value)
                if url:
                    self.leaders[tc_id] = url
                if owner != self.instance_id and tc_id in self.led:
                    await self._lose(tc_id)
                return
            self._versions[tc_id] = record.version
            self.leaders[tc_id] = self._url
            if tc_id not in self.led:
                self.led.add(tc_id)
                log.info("elected", coordinator_id=tc_id)
                await self._on_elected(tc_id)

    async def _lose(self, tc_id: int) -> None:
        if tc_id not in self.led:
            return
        self.led.discard(tc_id)
        self._versions.pop(tc_id, None)
        log.warning("lost leadership", coordinator_id=tc_id)
        await self._on_lost(tc_id)

    async def _check(self, tc_id: int) -> None:
        current = await self._store.get(layout.leader_path(tc_id))
        if current is None:
            self.leaders.pop(tc_id, None)
            if tc_id in self.led:
                await self._lose(tc_id)
            await self._campaign(tc_id)
            return
        url, owner = parse_leader(current.value)
        if url:
            self.leaders[tc_id] = url
        if tc_id in self.led and owner != self.instance_id:
            await self._lose(tc_id)

    async def _watch(self, notifications: object) -> None:
        iterator = notifications.__aiter__()  # type: ignore[attr-defined]
        while True:
            try:
                async for note in iterator:
                    if not note.key.startswith(layout.LEADER_PREFIX):
                        continue
                    suffix = note.key[len(layout.LEADER_PREFIX):]
                    if not suffix.isdigit() or int(suffix) >= self._partitions:
                        continue
                    tc_id = int(suffix)
                    if note.type is NotificationType.DELETED:
                        self.leaders.pop(tc_id, None)
                    await self._check(tc_id)
                return
            except (TimeoutError, StoreError) as exc:
                log.warning("leader watch interrupted", error=repr(exc))
                await asyncio.sleep(RECHECK_INTERVAL_S)
                iterator = self._store.notifications().__aiter__()

    async def _recheck(self) -> None:
        while True:
            await asyncio.sleep(RECHECK_INTERVAL_S)
            try:
                await self._update_share()
                await self._release_excess()
            except (TimeoutError, StoreError) as exc:
                log.warning("membership check failed", error=repr(exc))
                continue
            for tc_id in range(self._partitions):
                try:
                    await self._check(tc_id)
                except (TimeoutError, StoreError) as exc:
                    log.warning("leader check failed", coordinator_id=tc_id, error=repr(exc))
                    break
