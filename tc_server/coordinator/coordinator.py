"""The transaction coordinator of one instance: its partitions, their leadership, recovery and GC.

The server asks it three things: who leads partition N (for LOOKUP), whether it leads N (for
TC_CLIENT_CONNECT), and the partition object that serves NEW_TXN / ADD_* / END_TXN.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sized
from dataclasses import dataclass, field

import structlog

from tc_server.coordinator import layout
from tc_server.coordinator.clock import coordinator_clock
from tc_server.coordinator.errors import CoordinatorNotFound, ParallelismMismatch
from tc_server.coordinator.layout import TxnHeader
from tc_server.coordinator.leadership import LeaderElection
from tc_server.coordinator.partition import (
    Clock,
    CoordinatorPartition,
    Owed,
    ParticipantSender,
    PartitionConfig,
)
from tc_server.coordinator.principals import OpenByPrincipal
from tc_server.coordinator.sweeps import collect_garbage
from tc_server.health import Health
from tc_server.logs import LogLimiter
from tc_server.metrics import Metrics
from tc_server.store.api import EXPECT_ABSENT, BadVersionError, MetadataStore, StoreError, lease_clock

log = structlog.get_logger("tc_server.coordinator")

# Safety net behind each partition's in-memory deadline queue: every few seconds the deadline index
# is scanned for OPEN txns more than a second overdue on partitions led here. It catches what the
# queue cannot know: headers written by a previous leader just before a hand-over, and creates
# whose outcome was unknown. Normally the range is empty, so the scan is cheap.
OVERDUE_SCAN_INTERVAL_S = 5.0
OVERDUE_GRACE_MS = 1000
# Partitions won in one hand-over (a peer's session ended: all its partitions at once) share one
# scan of the deadline index, which holds every coordinator's open txns; scanning it once per
# partition made a 16-partition take-over with 50k open txns 16 times slower (measured).
RECOVERY_DEBOUNCE_S = 0.2
RECOVERY_RETRY_S = 1.0
# Open txns adopted between two turns of the event loop while the recovery scan streams: a store that
# answers a page without suspending would otherwise hold the loop for the whole scan.
RECOVERY_YIELD_EVERY = 1000


@dataclass(frozen=True)
class CoordinatorConfig:
    partitions: int = 16
    advertised_url: str = "pulsar://127.0.0.1:6650"
    advertised_url_tls: str | None = None
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    gc_retention_s: int = 900
    gc_interval_s: int = 300
    timeout_sweep: bool = True
    # A worker of --workers N (tc_server/workers.py): the coordinators it campaigns for (None: all),
    # every coordinator's worker URL (LOOKUP's answer where no leader record is known, e.g. the other
    # workers' coordinators, whose records are in their own embedded stores) and each worker's TLS URL
    # beside it, and the coordinator whose leader runs GC (0 as in PIP-473; a worker with its own
    # store collects it itself).
    campaign: frozenset[int] | None = None
    static_leaders: dict[int, str] = field(default_factory=dict)
    static_tls_urls: dict[str, str] = field(default_factory=dict)
    gc_coordinator: int = 0


class TransactionCoordinator:
    def __init__(
        self, store: MetadataStore, config: CoordinatorConfig, metrics: Metrics, clock: Clock = coordinator_clock,
        participant_sender: ParticipantSender | None = None,
    ) -> None:
        self.store = store
        # Failures seen lately, which /readyz reports (the recovery scan's, the requests' store errors).
        self.health = Health()
        # Tells today's brokers the decisions (None: no --upstream-url; the records wait).
        self.participant_sender = participant_sender
        self.config = config
        self.metrics = metrics
        self._clock = clock
        self._partitions: dict[int, CoordinatorPartition] = {}
        # Open txns per principal across the partitions led here (--max-open-transactions-per-principal).
        self.open_by_principal = OpenByPrincipal(config.partition.max_open_txns_per_principal)
        # The outbox of each partition led here, counted together against --max-undelivered-decisions.
        self.outboxes: list[Sized] = []
        # The participants being told a decision by those partitions (--max-undelivered-participants).
        self.owed = Owed()
        self._election = LeaderElection(
            store, config.partitions, config.advertised_url, self._elected, self._lost,
            advertised_url_tls=config.advertised_url_tls, campaign=config.campaign,
        )
        self._pending_recovery: set[int] = set()
        self._recovery_task: asyncio.Task[None] | None = None
        # Partition stops under way (_stop_partition): awaited by stop() too, whoever started them.
        self._partition_stops: set[asyncio.Future[None]] = set()
        self._gc_task: asyncio.Task[None] | None = None
        self._overdue_task: asyncio.Task[None] | None = None
        # The overdue scan reads an unreadable header again every OVERDUE_SCAN_INTERVAL_S: one line per key an
        # hour (a review: 200 damaged records were 40 lines a second, for ever).
        self._unreadable_headers_log = LogLimiter(interval_s=3600.0)
        metrics.has_leader.read = self._has_leader_samples
        for tc_id in range(config.partitions):
            metrics.leader.labels(**metrics.tc(tc_id)).set(0)
            metrics.active.labels(**metrics.tc(tc_id)).set(0)
            for family in (metrics.created, metrics.committed, metrics.aborted, metrics.timed_out,
                           metrics.execution_latency):
                family.labels(**metrics.tc(tc_id))
        # Create every bounded label set up front so that a fresh scrape shows each family (a
        # dashboard query on a missing series shows "no data" rather than 0).
        for result in ("ok", "conflict", "reject"):
            metrics.header_cas.labels(result)
        for kind in ("header", "event", "participant"):
            metrics.op_writes.labels(kind)
        for index in (layout.IDX_OPS_BY_TXN, layout.IDX_TXN_BY_FINAL_STATE):
            metrics.index_query.labels(index)
        for command in ("END_TXN_ON_PARTITION", "END_TXN_ON_SUBSCRIPTION"):
            metrics.participant_requests.labels(command, "ok")

    @property
    def num_partitions(self) -> int:
        return self.config.partitions

    async def start(self) -> None:
        """Check the stored parallelism and campaign for every partition; the open txns of the
        partitions won are recovered in the background (see :meth:`wait_recovered`).

        Raises ParallelismMismatch when the store was initialised with another number of coordinators."""
        await self._check_parallelism()
        await self._election.start()
        self._gc_task = asyncio.create_task(self._run_gc(), name="gc")
        if self.config.timeout_sweep:
            self._overdue_task = asyncio.create_task(self._run_overdue_scan(), name="overdue-scan")

    async def stop(self) -> None:
        for task in (self._gc_task, self._overdue_task, self._recovery_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._election.stop()
        # Once more: a coordinator won while the tasks above were awaited (the election still ran) started a
        # recovery, which outlived the stop, scanning a closed store forever (a review).
        if self._recovery_task is not None:
            self._recovery_task.cancel()
            await asyncio.gather(self._recovery_task, return_exceptions=True)
        for tc_id in list(self._partitions):
            await self._lost(tc_id)
        # A step-down the election's stop cut short (its task cancelled while the partition stopped) finishes here.
        await asyncio.gather(*self._partition_stops)

    # -- what the server asks --------------------------------------------------------------------

    def leader_url(self, tc_id: int) -> str | None:
        return self._election.leaders.get(tc_id) or self.config.static_leaders.get(tc_id)

    def tls_url(self, url: str | None) -> str | None:
        """The ``pulsar+ssl://`` URL of the instance that advertises ``url`` (LOOKUP's brokerServiceUrlTls)."""
        if not url:
            return None
        return self._election.tls_urls.get(url) or self.config.static_tls_urls.get(url)

    def assignments(self) -> dict[int, str]:
        """The known leader URL of every coordinator that has one (one in mid-election is missing)."""
        return {**self.config.static_leaders, **self._election.leaders}

    def watch_assignments(self, listener: Callable[[dict[int, str]], None]) -> Callable[[], None]:
        """Call ``listener`` with the new map whenever it changes; returns the unsubscribe function."""
        static = self.config.static_leaders

        def changed(leaders: dict[int, str]) -> None:
            listener({**static, **leaders})

        self._election.listeners.append(changed)
        return lambda: self._election.listeners.remove(changed)

    def leads(self, tc_id: int) -> bool:
        return tc_id in self._partitions

    def partition(self, tc_id: int) -> CoordinatorPartition:
        """Raises CoordinatorNotFound when this instance does not lead ``tc_id``."""
        partition = self._partitions.get(tc_id)
        if partition is None:
            if not 0 <= tc_id < self.config.partitions:
                raise CoordinatorNotFound(
                    f"transaction coordinator {tc_id} does not exist (there are {self.config.partitions})"
                )
            raise CoordinatorNotFound(f"transaction coordinator {tc_id} is not led by this instance")
        return partition

    def _has_leader(self, tc_id: int) -> bool:
        """Led here, or by a leader at another URL (another instance, or Pulsar 5's own coordinator)."""
        return tc_id in self._partitions or self._election.leaders.get(tc_id) not in (None, self.config.advertised_url)

    def _has_leader_samples(self) -> list[tuple[tuple[str, str], float]]:
        """tc_server_coordinator_has_leader, for every coordinator: the alert rules' "no leader" is that no
        instance says 1. (tc_server_coordinator_leader is 0 everywhere for a coordinator Pulsar 5's own
        coordinator leads, which is served.)"""
        cluster = self.metrics.cluster
        # A coordinator whose lease lapsed here is refused here (its leader may be elsewhere by now); and while
        # any lease of this instance lapsed its store does not answer it, so what it knows of other instances'
        # leaders is stale. Said 1 from both, no instance said 0 while every coordinator refused its requests
        # (Oxia unreachable), and the alert on "no leader" could not fire.
        lapsed = {tc_id for tc_id, partition in self._partitions.items() if partition.lease_lapsed()}
        # An instance that leads nothing has no partition lease: its member record's tells the same.
        detached = bool(lapsed) or self._member_lapsed()

        def led(tc_id: int) -> bool:
            if tc_id in self._partitions:
                return tc_id not in lapsed
            return not detached and self._has_leader(tc_id)

        return [((cluster, str(tc_id)), 1.0 if led(tc_id) else 0.0) for tc_id in range(self.config.partitions)]

    def _member_lapsed(self) -> bool:
        """Whether the store session of this instance's member record may have lapsed (Oxia: no keep-alive
        answered within the session timeout, or no session at all); never on the embedded and memory stores."""
        try:
            lease = self.store.ephemeral_lease(layout.member_path(self._election.instance_id),
                                               self._election.member_session)
        except StoreError:  # no shard map: the store does not answer this instance
            return True
        return lease is not None and lease_clock() >= lease()

    def not_served(self) -> tuple[list[int], list[int]]:
        """The coordinators of this instance's share (a worker of --workers N: of its own) that make it not
        ready (/readyz): (those with no leader record, those whose record names this instance's own URL
        although it does not lead them). The second are its predecessor's records after a restart in place
        on Oxia (its own URL, another session, until that session expires), or another instance's started
        with the same advertised URL: they are not served here, and LOOKUP would send their clients here."""
        campaign = self.config.campaign
        leaderless: list[int] = []
        held_elsewhere: list[int] = []
        for tc_id in range(self.config.partitions) if campaign is None else campaign:
            if not self._has_leader(tc_id):
                (leaderless if self._election.leaders.get(tc_id) is None else held_elsewhere).append(tc_id)
        return leaderless, held_elsewhere

    def unreadable_leader_records(self) -> list[str]:
        """Keys of the leader records of this instance's share that cannot be read (/readyz names them)."""
        campaign = self.config.campaign
        return [key for tc_id, key in sorted(self._election.unreadable.items())
                if campaign is None or tc_id in campaign]

    def led_partitions(self) -> list[CoordinatorPartition]:
        return [self._partitions[i] for i in sorted(self._partitions)]

    async def abort_expired_now(self) -> int:
        """Run every led partition's due timeouts at once (admin and tests)."""
        count = 0
        for partition in self.led_partitions():
            due = partition.due_timeouts(self._clock())
            for least in due:
                await partition.expire(least)
            count += len(due)
        return count

    async def collect_garbage_now(self) -> None:
        await collect_garbage(self.store, self.metrics, self._clock(), self.config.gc_retention_s)

    # -- internals -------------------------------------------------------------------------------

    async def _check_parallelism(self) -> None:
        """Store the number of coordinators once, in Pulsar's form (``/txn/tc/parallelism``, plain
        decimal text, docs/record-layout.md), or check the stored one. A store initialised by an
        earlier tc-server holds ``{"parallelism": N}``, which Pulsar's brokers cannot parse: it is
        rewritten in Pulsar's form (CAS; losing to a concurrent rewrite is fine)."""
        wanted = self.config.partitions
        try:
            await self.store.put(layout.PARALLELISM_PATH, layout.parallelism_value(wanted),
                                 expected_version=EXPECT_ABSENT)
            return
        except BadVersionError:
            pass
        record = await self.store.get(layout.PARALLELISM_PATH)
        if record is None:  # deleted between the two calls: start over
            await self._check_parallelism()
            return
        try:
            stored = layout.parse_parallelism(record.value)
        except ValueError as exc:
            raise ParallelismMismatch(
                f"the metadata store holds an unreadable number of transaction coordinators at "
                f"{layout.PARALLELISM_PATH}: {exc}; fix or delete that record"
            ) from None
        if stored != wanted:
            raise ParallelismMismatch(
                f"the metadata store was initialised with {stored} transaction coordinators "
                f"({layout.PARALLELISM_PATH}) but this instance was started with --coordinators {wanted}; "
                "start it with the stored number"
            )
        if layout.is_legacy_parallelism(record.value):
            with contextlib.suppress(BadVersionError):
                await self.store.put(layout.PARALLELISM_PATH, layout.parallelism_value(wanted),
                                     expected_version=record.version)
                log.info("rewrote the number of coordinators in Pulsar's form", path=layout.PARALLELISM_PATH)

    async def open_headers(
        self, deadline_before_ms: int | None = None, unreadable: list[int | None] | None = None
    ) -> AsyncIterator[tuple[int, int, TxnHeader, int]]:
        """(most, least, header, version) of every OPEN txn in the deadline index whose deadline is
        before ``deadline_before_ms`` (all when None), all coordinators; unreadable records are
        logged (once an hour per key) and skipped, and the coordinator each names (None if none) appended to
        ``unreadable``. Both key forms of the index are read (docs/record-layout.md, "Upgrading
        from the earlier tc-server layout"): a header an earlier tc-server wrote keeps its old key
        until it ends."""
        for start, end in layout.deadline_ranges(deadline_before_ms):
            async for record in self.store.scan_index(layout.IDX_TXN_BY_DEADLINE, start, end):
                try:
                    most, least = layout.parse_header_path(record.key)
                    header = TxnHeader.from_json(record.value)
                except ValueError as exc:
                    if (left_out := self._unreadable_headers_log.allow(record.key)) is not None:
                        log.warning("skipping unreadable header", key=record.key, error=str(exc),
                                    left_out_since_last_line=left_out)
                    if unreadable is not None:
                        unreadable.append(_coordinator_named(record.key))
                    continue
                if header.state is layout.TxnState.OPEN:
                    yield most, least, header, record.version

    async def _adopt_open_txns(self, partitions: dict[int, CoordinatorPartition]) -> dict[int, int]:
        """Stream the deadline index (the store reads it in pages) into ``partitions``: each keeps only
        the deadline and owner of its open txns, never the list of all (issue 15: 500,000 open txns
        after a kill -9). Returns tc_id -> txns found. Raises StoreError, TimeoutError."""
        found: dict[int, int] = defaultdict(int)
        seen = 0
        async for most, least, header, _ in self.open_headers():
            seen += 1
            if seen % RECOVERY_YIELD_EVERY == 0:
                await asyncio.sleep(0)
            partition = partitions.get(most)
            if partition is not None:
                partition.adopt_one(least, header.deadline_ms, header.owner, header.timeout_ms)
                found[most] += 1
        return found

    async def _elected(self, tc_id: int) -> None:
        partition = CoordinatorPartition(
            tc_id, self.store, self.config.partition, self.metrics, self._clock,
            sweep_timeouts=self.config.timeout_sweep, sender=self.participant_sender,
            open_by_principal=self.open_by_principal, outboxes=self.outboxes, owed=self.owed,
            lease=self.store.ephemeral_lease(layout.leader_path(tc_id), self._election.lease_session(tc_id)),
        )
        stale = self._partitions.pop(tc_id, None)
        if stale is not None:
            await self._stop_partition(stale)
        partition.start()
        self._partitions[tc_id] = partition
        self.metrics.leader.labels(**self.metrics.tc(tc_id)).set(1)
        # Recover after winning (a scan taken before could miss txns the previous leader created
        # meanwhile). Until the scan lands the partition serves from the store (a txn it has not
        # loaded is read on demand); only its timeouts wait for the scan.
        self._pending_recovery.add(tc_id)
        if self._recovery_task is None or self._recovery_task.done():
            self._recovery_task = asyncio.create_task(self._recover_pending(), name="recovery")

    async def wait_recovered(self) -> None:
        """Wait until every led partition has loaded the open txns found in the deadline index."""
        while self._pending_recovery and self._recovery_task is not None:
            await asyncio.shield(self._recovery_task)

    async def _recover_pending(self) -> None:
        while self._pending_recovery:
            await asyncio.sleep(RECOVERY_DEBOUNCE_S)
            wanted = set(self._pending_recovery)
            # The partition objects now: one lost and won again during the scan is a new object that
            # stays pending and is scanned for once more (adopting into the stopped one is harmless).
            partitions = {tc_id: self._partitions[tc_id] for tc_id in wanted if tc_id in self._partitions}
            try:
                found = await self._adopt_open_txns(partitions)
            except Exception as exc:  # noqa: BLE001 - recovery must go on; a bug in one pass is logged as one
                if isinstance(exc, StoreError | TimeoutError):
                    log.warning("recovery scan failed; retrying", coordinators=sorted(wanted), error=repr(exc))
                else:
                    log.exception("recovery scan failed; retrying", coordinators=sorted(wanted))
                # Until it succeeds, open txns of these coordinators are not all tracked: their timeouts
                # wait. What was adopted stays (adopting again is a no-op).
                self.health.failed("recovery scan", repr(exc), until_recovered=True)
                await asyncio.sleep(RECOVERY_RETRY_S)
                continue
            self.health.recovered("recovery scan")
            for tc_id in wanted:
                partition = self._partitions.get(tc_id)
                if partition is not None and partition is not partitions.get(tc_id):
                    continue  # won again during the scan: still pending
                self._pending_recovery.discard(tc_id)
                if partition is not None:
                    partition.finish_adopting()
                    if found.get(tc_id):
                        log.info("recovered open transactions", coordinator_id=tc_id, count=found[tc_id])
                    # The outbox: decided txns whose brokers were not all told (docs/participants.md).
                    try:
                        await partition.recover_outbox()
                    except Exception as exc:  # noqa: BLE001 - as above: retried, never the end of recovery
                        if isinstance(exc, StoreError | TimeoutError):
                            log.warning("outbox scan failed; retrying", coordinator_id=tc_id, error=repr(exc))
                        else:
                            log.exception("outbox scan failed; retrying", coordinator_id=tc_id)
                        self._pending_recovery.add(tc_id)

    async def _lost(self, tc_id: int) -> None:
        partition = self._partitions.pop(tc_id, None)
        self.metrics.leader.labels(**self.metrics.tc(tc_id)).set(0)
        # The gauge reads the partition when scraped (set_function); point it away from the lost
        # partition, which it would otherwise keep alive (with its open-txn maps) until led again.
        self.metrics.active.labels(**self.metrics.tc(tc_id)).set_function(lambda: 0)
        if tc_id == self.config.gc_coordinator:
            # The sweep's count is the GC leader's to give (_run_gc): zeroed at the next tick only, up to
            # --gc-interval-s later, it was summed with the new leader's meanwhile (a review).
            self.metrics.outstanding_ops.set(0)
        if partition is not None:
            await self._stop_partition(partition)

    async def _stop_partition(self, partition: CoordinatorPartition) -> None:
        """Stop ``partition``, to the end even if the caller is cancelled: a step-down is run by the election's
        task, which a stop cancels, and a partition stop cut half-way (no longer in _partitions) left its
        deliveries running and END_TXNs waiting after the stop returned (a review). stop() awaits it."""
        stopping = asyncio.ensure_future(partition.stop())
        self._partition_stops.add(stopping)
        stopping.add_done_callback(self._partition_stops.discard)
        await asyncio.shield(stopping)

    async def abort_overdue(self) -> tuple[int, int]:
        """Abort every OPEN txn of a led partition found overdue in the deadline index. Returns how
        many of them the partitions' deadline queues did not hold (missed: a header a previous leader
        wrote just before a hand-over), and how many they held but had not reached yet (late: the
        queue is behind, its store slower than the txns' deadlines come; aborted here too, so that
        neither path waits on the other). Overdue headers of led coordinators that cannot be read (no
        sweep can abort them) are counted in tc_server_unreadable_overdue_headers: not a readiness failure, as
        this instance serves every other txn, and an unready pod is taken out of its Service."""
        horizon_ms = max(0, self._clock() - OVERDUE_GRACE_MS)
        unreadable: list[int | None] = []
        overdue = [(most, least) async for most, least, _, _ in self.open_headers(horizon_ms, unreadable)
                   if self.leads(most)]
        self.metrics.unreadable_overdue_headers.set(
            sum(self.leads(self.config.gc_coordinator if most is None else most) for most in unreadable))
        missed = late = 0
        for most, least in overdue:
            partition = self._partitions.get(most)
            if partition is None:
                continue
            if partition.tracks(least):
                late += 1
            else:
                missed += 1
            await partition.expire(least)
        return missed, late

    async def _run_overdue_scan(self) -> None:
        while True:
            await asyncio.sleep(OVERDUE_SCAN_INTERVAL_S)
            try:
                missed, late = await self.abort_overdue()
                # What is still overdue after the aborts could not be aborted: a fact for /readyz.
                left = sum(await self.abort_overdue()) if missed or late else 0
            except (StoreError, TimeoutError) as exc:
                log.warning("overdue scan failed", error=repr(exc))
                self.health.failed("timeout sweep", f"overdue scan failed: {exc!r}", until_recovered=True)
                continue
            except Exception:  # noqa: BLE001 - the safety net must not die of one bad record
                log.exception("overdue scan failed")
                continue
            if left:
                self.health.failed("timeout sweep", f"{left} open transactions past their deadline could not be "
                                   "aborted", until_recovered=True)
            else:
                self.health.recovered("timeout sweep")
            if missed:
                log.warning("aborted overdue transactions missed by the deadline queue", count=missed)
            if late:
                log.warning("the deadline queue is behind: aborted transactions more than a second past their "
                            "deadline", count=late, grace_ms=OVERDUE_GRACE_MS)

    async def _run_gc(self) -> None:
        while True:
            await asyncio.sleep(self.config.gc_interval_s)
            # As in PIP-473, only the leader of partition 0 sweeps, so instances do not race (a
            # worker with its own store: the leader of its first coordinator, CoordinatorConfig).
            if not self.leads(self.config.gc_coordinator):
                # The sweep's count is the GC leader's to give: a value left from when this instance led
                # would be summed with the new leader's for good.
                self.metrics.outstanding_ops.set(0)
                continue
            try:
                await collect_garbage(self.store, self.metrics, self._clock(), self.config.gc_retention_s)
            except (TimeoutError, StoreError) as exc:
                log.warning("gc pass failed", error=repr(exc))
            except Exception:  # noqa: BLE001 - one bad pass (an unreadable record?) must not end GC for good
                log.exception("gc pass failed")


def _coordinator_named(key: str) -> int | None:
    """The coordinator a header key names, None when it names none (``/txn/id/<most>_<least>`` or the older form)."""
    try:
        return layout.parse_header_path(key)[0]
    except ValueError:
        return None
