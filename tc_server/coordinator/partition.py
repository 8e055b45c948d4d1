"""One coordinator partition (one tcId): NEW_TXN, ADD_*, END_TXN and the timeout queue (docs/semantics.md §3, §5).

Every state change is a CAS on the txn's header; the in-memory state here (open txns and their
deadlines) is only a cache that makes timeouts prompt, rebuilt from ``idx:txn-by-deadline`` whenever
the partition is (re)led. Correctness never depends on it: a stale cache can only cause a CAS that
fails or a timeout that finds the txn already ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence, Sized
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import structlog

from tc_server.backoff import Backoff
from tc_server.coordinator import layout
from tc_server.coordinator.clock import coordinator_clock
from tc_server.coordinator.errors import (
    CoordinatorError,
    CoordinatorNotFound,
    InvalidTxnStatus,
    NotAllowed,
    StoreCorrupted,
    TransactionNotFound,
)
from tc_server.coordinator.events import publish_decision
from tc_server.coordinator.ids import IdAllocator
from tc_server.coordinator.layout import Participant, TxnHeader, TxnState
from tc_server.coordinator.principals import OpenByPrincipal
from tc_server.coordinator.state import Decision, Request, decide, target_state
from tc_server.metrics import Metrics
from tc_server.store.api import (
    EXPECT_ABSENT,
    BadVersionError,
    Delete,
    MetadataStore,
    Put,
    Record,
    StoreError,
    StoreUnavailableError,
    lease_clock,
)

Clock = Callable[[], int]
_T = TypeVar("_T")

log = structlog.get_logger("tc_server.coordinator")

# A header CAS can lose to a concurrent writer (a timeout, a duplicate END_TXN from a reconnected
# client). Each retry re-reads and re-decides; more than a few losses in a row means something
# keeps rewriting the header, which no legitimate writer does.
MAX_CAS_ATTEMPTS = 8
# How often the timeout queue is looked at: docs/semantics.md §5 promises an abort within 1 s of the deadline.
TIMEOUT_TICK_S = 0.2
# After a failed timeout abort (store unavailable), try again this much later.
TIMEOUT_RETRY_MS = 1000
# How long a stopping partition tries to write the events it still owes (see stop()).
STOP_PUBLISH_TIMEOUT_S = 5.0
# Timeouts aborted concurrently per tick, so that a burst of expiries does not flood the store.
TIMEOUT_CONCURRENCY = 64


# The low watermark while this leader does not yet know which txns are open or undelivered (right
# after winning, before recovery scanned the deadline index and the outbox): Java's -1 (2**64-1 on the
# wire), which covers no txn id, so the broker aborts nothing and refuses no send (docs/participants.md).
UNKNOWN_WATERMARK = -1
# Store failures while reading or deleting participant records are retried with this backoff.
OUTBOX_RETRY_INITIAL_S = 0.1
OUTBOX_RETRY_MAX_S = 5.0
# An ABORT delivered to a partition is sent there once more this long after (best effort, from memory: a
# restart forgets it), bounded by ABORT_REMINDER_BOUND_S. A 4.2.4 broker whose transaction buffer had no
# message of the txn yet takes an abort without recording it or the watermark (TopicTransactionBuffer.abortTxn,
# "no message sent"); a send of the txn that arrives afterwards (a producer's resend after a reconnect, which
# a crash of tc-server, whose relay carries the producer's connection, makes routine) opens the txn there
# again, and nobody ends it: the partition's readers stay pinned until another txn of the same coordinator
# ends there. The second ABORT ends it. After the resends: a client resends as soon as it reconnected.
ABORT_REMINDER_S = 20.0
ABORT_REMINDER_BOUND_S = 30.0

_warned_no_sender = False
# Participants whose encoded record name and value are remembered (bounded: least recently used go).
ENCODED_PARTICIPANTS = 4096
# Topics (or subscriptions) one ADD_PARTITION_TO_TXN (ADD_SUBSCRIPTION_TO_TXN) may name. The Java, Go and
# C++ clients send one per request; one request of 30,000 (a legal 229 KB frame) held the event loop, and
# every other client, for over a second while its records were built.
MAX_PARTICIPANTS_PER_ADD = 256
# The longest topic or subscription name (UTF-8 bytes) a txn may record. Each participant of an open txn is
# held in memory until its decision is delivered, and the encoding cache holds ENCODED_PARTICIPANTS more:
# 3,000 names of 20 KB in one txn (legal frames) took RSS from 61 to 307 MiB (a review). Pulsar's own
# names are a few hundred bytes at most (tenant, namespace, topic and a partition suffix).
MAX_PARTICIPANT_NAME_BYTES = 2048


# Topics without a transaction buffer (Pulsar's NonPersistentTopic refuses transactional operations).
NON_PERSISTENT = "non-persistent://"


class ParticipantSender(Protocol):
    """Tells one participant broker a decision (tc_server/participants/delivery.py); returns once the
    broker acknowledged it, retrying as long as it takes (cancel to stop)."""

    async def end_txn_on(self, participant: Participant, most: int, least: int, committed: bool,
                         low_watermark: Callable[[], int]) -> None: ...

    async def remind_txn_on(self, participant: Participant, most: int, least: int, committed: bool,
                            low_watermark: Callable[[], int]) -> bool:
        """Tell it once more, one attempt (the ABORT reminder): whether the broker acknowledged."""
        ...


@dataclass
class _Outbox:
    """A decided txn whose participants have not all acknowledged the decision yet."""

    decided_ms: int
    state: TxnState
    done: asyncio.Future[None]
    tasks: set[asyncio.Task[bool]] = field(default_factory=set)
    # Held with participant records and no header (recover_outbox): its decision is unknown, and only an
    # operator's drops release it.
    headerless: bool = False
    # Record paths of the participants whose brokers acknowledged while others had not (the records stay until
    # all have, deleted in one batch): the admin's listing marks them. Only for txns of several participants,
    # made for those alone (most txns have one, and an empty set per decision is work on the hot path).
    told: set[str] | None = None
    # Deliveries that failed on a bug, each to start over from the records later: the txn stays held meanwhile.
    restarts_pending: int = 0
    # Whose decision it is, counted toward that principal's --max-open-transactions-per-principal until its
    # brokers all acknowledged (principals.py), also when recovered (the header names it); None without one.
    owner: str | None = None


@functools.lru_cache(maxsize=ENCODED_PARTICIPANTS)
def _encoded(participant: Participant) -> tuple[str, bytes]:
    """A participant's record name (under its txn's prefix) and value. The same partitions recur in
    txn after txn, and URL-encoding and JSON-escaping a topic name cost tens of microseconds
    (profiled: about a tenth of tc-server's CPU per produce+commit pair)."""
    return participant.name(), participant.to_json()


@dataclass(frozen=True, slots=True)
class PartitionConfig:
    default_timeout_ms: int = 60_000
    max_timeout_ms: int = 86_400_000  # --max-txn-timeout-ms (config.py)
    id_block_size: int = 1000
    # Open txns tracked here before NEW_TXN is refused (Pulsar's maxActiveTransactionsPerCoordinator); 0: none.
    max_active_txns: int = 0
    # Open txns of one principal across the coordinators led here before NEW_TXN is refused; 0: none.
    max_open_txns_per_principal: int = 0
    # Participants (topics and subscriptions of today's brokers) recorded for one txn by this leader
    # before its ADD is refused; 0: none.
    max_participants_per_txn: int = 0
    # Undelivered decisions across the instance's partitions (the outboxes passed in) before NEW_TXN is refused.
    max_undelivered: int = 0
    # Participants being told a decision across the instance's partitions (the Owed passed in), likewise.
    max_undelivered_participants: int = 0


@dataclass
class Owed:
    """Participants being told a decision they have not acknowledged yet, across the partitions led here: each is
    a delivery retrying in a task of its own until its broker acknowledges (ParticipantSender.end_txn_on)."""

    participants: int = 0


class CoordinatorPartition:
    def __init__(
        self,
        tc_id: int,
        store: MetadataStore,
        config: PartitionConfig,
        metrics: Metrics,
        clock: Clock = coordinator_clock,
        sweep_timeouts: bool = True,
        sender: ParticipantSender | None = None,
        open_by_principal: OpenByPrincipal | None = None,
        lease: Callable[[], float] | None = None,
        outboxes: list[Sized] | None = None,
        owed: Owed | None = None,
    ) -> None:
        self.tc_id = tc_id
        # Until when (lease_clock()) this instance surely still holds the leader record, on a store
        # where that can end unnoticed (MetadataStore.ephemeral_lease); None: while it is led.
        self._lease = lease
        # Shared by every partition of the instance (coordinator.py); one of its own when used alone.
        self._principals = open_by_principal or OpenByPrincipal(config.max_open_txns_per_principal)
        # least -> owner of each OPEN txn counted in _principals (txns without an owner are not).
        self._owners: dict[int, str] = {}
        self._store = store
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self._sweep_timeouts = sweep_timeouts
        self._ids = IdAllocator(store, tc_id, config.id_block_size, clock)
        # Resolve labelled children once: prometheus_client's labels() costs microseconds per call.
        labels = metrics.tc(tc_id)
        self._created = metrics.created.labels(**labels)
        self._committed = metrics.committed.labels(**labels)
        self._aborted = metrics.aborted.labels(**labels)
        self._timed_out = metrics.timed_out.labels(**labels)
        # Read when scraped (a set() on every NEW_TXN and END_TXN was per-request cost, profiled); a
        # stopped partition reports none, also when a later leader's partition has not replaced it yet.
        metrics.active.labels(**labels).set_function(lambda: 0 if self._stopped else len(self._open))
        self._latency = metrics.execution_latency.labels(**labels)
        self._cas_ok = metrics.header_cas.labels("ok")
        self._cas_conflict = metrics.header_cas.labels("conflict")
        self._cas_reject = metrics.header_cas.labels("reject")
        self._header_writes = metrics.op_writes.labels("header")
        # least -> when to look at it next (its deadline, or a retry time after a failed abort), for
        # the OPEN txns opened or recovered here.
        self._open: dict[int, int] = {}
        self._deadlines: list[tuple[int, int]] = []  # heap of (deadline ms, least); stale entries skipped
        # Header and store version of each OPEN txn created here. END_TXN and ADD_* decide from it
        # and go straight to the CAS, saving a store read per request; a stale entry (someone else
        # wrote the header) only makes the CAS fail, and then the header is read. Recovered txns are
        # not cached: their header is read on their first request (500,000 recovered headers cost
        # ~200 MB more, docs/performance.md, "500,000 open transactions").
        self._headers: dict[int, tuple[TxnHeader, int]] = {}
        # Open txns whose decision CAS ended with an unknown outcome (its request's deadline passed while
        # the store held the write): the header may be decided on disk although the txn is open here. The
        # value: whether that decision was the timeout's (EXPIRE), which the header does not tell (a client's
        # ABORT after the deadline is not a timeout); _adopt_decision counts it as it was decided.
        self._unsure: dict[int, bool] = {}
        # Open txns whose NEW_TXN header write ended with an unknown outcome: counted as created when a read
        # finds the header (_apply), or its timeout abort was counted with no creation to match, and
        # TcServerTransactionsTimingOut's ratio grew past 1 with store trouble (a review).
        self._created_unsure: set[int] = set()
        # least -> the deadline of an adopted txn stamped by a clock ahead of this one (adopt_one), which the
        # decisions go by instead of its header's; empty but for such txns.
        self._capped: dict[int, int] = {}
        # Decisions whose events could not all be written after the CAS (store error, request
        # timeout): the sweeper writes them again so participants do not wait for GC.
        self._unpublished: dict[int, TxnState] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._dropping = asyncio.Lock()  # admin drops of participants, one at a time (drop_participant)
        self._owed_events: asyncio.Task[None] | None = None  # see _publish_owed_events
        self._log = log.bind(coordinator_id=tc_id)
        # -- participants of today's brokers (docs/participants.md) --
        self._sender = sender
        # Participant records written, per OPEN txn: a repeated ADD of the same participant writes nothing.
        self._recorded: dict[int, dict[str, Participant]] = {}
        # Participant records being written (ADD not answered yet): a decision taken meanwhile delivers
        # to them too, so the txn is held (low watermark) while their brokers may hear of it.
        self._recording: dict[int, dict[str, Participant]] = {}
        # Txns created by this leader: every ADD went through here, so _recorded lists all their
        # participants and END_TXN needs no store scan to find them.
        self._complete: set[int] = set()
        # Decided txns whose participants have not all acknowledged: the outbox in memory. They hold
        # the low watermark down until every broker acknowledged.
        self._undelivered: dict[int, _Outbox] = {}
        # Every led partition's outbox (this one's included while it leads), counted by NEW_TXN.
        self._outboxes = outboxes if outboxes is not None else []
        self._outboxes.append(self._undelivered)
        # Participants being told a decision, across the partitions led here (shared like the outboxes).
        self._owed = owed if owed is not None else Owed()
        # Heaps of the ids in _open and _undelivered, stale entries skipped and dropped lazily: the
        # low watermark is asked once per END_TXN_ON_* and must not scan every open txn each time.
        self._open_ids: list[int] = []
        self._undelivered_ids: list[int] = []
        # True once recovery adopted the open txns and re-drove the outbox: only then is the low
        # watermark computed from what is held here.
        self._recovered = False
        # ABORT reminders not yet due, oldest first: (when, least, its partitions). One task waits for them all
        # (_remind_of_aborts); a task per aborted txn sleeping ABORT_REMINDER_S held ~1.8 KB each, 20 s of the
        # abort rate (an entry here is ~0.2 KB).
        self._abort_reminders: deque[tuple[float, int, list[Participant]]] = deque()
        self._reminding: asyncio.Task[None] | None = None
        self._reminders: set[asyncio.Task[None]] = set()  # that task and its sends' tasks, cancelled by stop()
        # Looks at the header of a txn whose participant records landed as it may have been decided, when the ADD
        # could not look itself (_record), one per txn at a time: cancelled by stop().
        self._rechecks: dict[int, asyncio.Task[None]] = {}
        # Decided txns an END_TXN delivered before recover_outbox was done (end_txn): the scan leaves them be,
        # also once that delivery is over (its records, read by the scan before, deleted since).
        self._delivered_early: set[int] = set()
        # The txns that left the open set before recovery was over (see _forget); emptied then.
        self._gone_while_recovering: set[int] = set()
        self._stopped = False
        # The loop of the first request, kept: asyncio.get_running_loop() makes a getpid() system call
        # per call in CPython 3.11 (its fork check), which showed in the profile (issue 13).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._participant_writes = metrics.op_writes.labels("participant")
        self._undelivered_gauge = metrics.undelivered.labels(**labels)
        self._undelivered_gauge.set_function(lambda: len(self._undelivered))
        self._oldest_gauge = metrics.oldest_undelivered.labels(**labels)
        self._oldest_gauge.set_function(self._oldest_undelivered_s)
        self._delivery_latency = metrics.delivery_latency.labels(**labels)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin leading: start the timeout sweeper."""
        if self._sweep_timeouts:
            self._sweeper = asyncio.create_task(self._run_timeouts(), name=f"timeouts-{self.tc_id}")

    def adopt(self, open_txns: Iterable[tuple[int, TxnHeader, int]]) -> None:
        """Track the OPEN txns found in the store: (least, header, store version)."""
        for least, header, _ in open_txns:
            self.adopt_one(least, header.deadline_ms, header.owner, header.timeout_ms)
        self.finish_adopting()

    def adopt_one(self, least: int, deadline_ms: int, owner: str | None, timeout_ms: int | None = None) -> None:
        """Track one OPEN txn found in the deadline index: only its deadline and owner are kept (the
        recovery scan streams every open txn through here; call :meth:`finish_adopting` after). With its
        ``timeout_ms``, a deadline further away than that is cut to it."""
        if self._stopped:
            return  # stepped down during the scan: the owners' counts are the next leader's
        if least in self._gone_while_recovering:
            return  # ended (or found absent) after the scan read it as OPEN
        if least not in self._open:
            if timeout_ms is not None and (bound := self._clock() + timeout_ms) < deadline_ms:
                # Created "in the future": stamped by a clock ahead of this one (this instance's before the
                # system clock was corrected back, a peer's on Oxia). It was created before now, so its
                # timeout from now is at least as long as its client asked for; left at its stamp, a txn of
                # 1 s stayed OPEN for the clocks' difference (an hour), pinning its brokers' readers.
                self._capped[least] = deadline_ms = bound
            if least in self._unsure:
                # An END_TXN served here before the scan wrote its decision with an unknown outcome (_apply)
                # and found the txn untracked: look soon, as _apply does for a tracked one, or a decision that
                # lands after the scan read OPEN reaches its brokers only at the deadline (hours for some).
                deadline_ms = min(deadline_ms, self._clock() + TIMEOUT_RETRY_MS)
            self._track(least, deadline_ms)
        if owner is not None and least not in self._owners:
            self._owners[least] = self._principals.add(owner)

    def finish_adopting(self) -> None:
        """The recovery scan is over (the open count is read when scraped: nothing to do here)."""

    async def stop(self) -> None:
        self._stopped = True
        await _cancel_all(task for task in (self._sweeper, self._owed_events) if task is not None)
        self._sweeper = None
        # Decisions whose events are not all written (a failed write, or the sweeper's timeout abort
        # cancelled just now between its CAS and its events): this list lives only here. One more try
        # now; the next leader writes what is left as it takes over (_publish_owed_events).
        if self._unpublished:
            with contextlib.suppress(StoreError, TimeoutError):
                await asyncio.wait_for(self.publish_pending(), STOP_PUBLISH_TIMEOUT_S)
            if self._unpublished:
                self._log.warning("decisions whose events could not be written before stepping down; the "
                                  "next leader writes them", txns=sorted(self._unpublished)[:20],
                                  count=len(self._unpublished))
        # Deliveries stop with leadership; the records stay and the next leader re-drives them.
        # By identity: list.remove() compares dicts by content, and took another partition's empty outbox.
        self._outboxes[:] = [outbox for outbox in self._outboxes if outbox is not self._undelivered]
        await _cancel_all(task for outbox in self._undelivered.values() for task in outbox.tasks)
        await _cancel_all(list(self._reminders))
        await _cancel_all(list(self._rechecks.values()))
        self._abort_reminders.clear()
        for outbox in self._undelivered.values():
            if not outbox.done.done():
                outbox.done.set_result(None)  # END_TXN waiting here answers now: the decision is durable
        self._undelivered_gauge.set_function(lambda: 0)
        self._oldest_gauge.set_function(lambda: 0)
        # Their owners' counts were this instance's while it led; the next leader counts them.
        for owner in self._owners.values():
            self._principals.remove(owner)
        self._owners.clear()
        for outbox in self._undelivered.values():
            if outbox.owner is not None:
                self._principals.remove_undelivered(outbox.owner)
                outbox.owner = None
        await self._ids.close()

    @property
    def open_count(self) -> int:
        return len(self._open)

    def lowest_held(self) -> int | None:
        """The smallest id of the txns held here: open, or decided and not yet told to every participant
        (no copy of either set); None when none is."""
        held = [least for least in (_smallest(self._open_ids, self._open),
                                    _smallest(self._undelivered_ids, self._undelivered)) if least is not None]
        return min(held, default=None)

    @property
    def reserved_next(self) -> int:
        return self._ids.reserved_next

    def lease_lapsed(self) -> bool:
        """Whether this instance's hold on the coordinator may have lapsed (MetadataStore.ephemeral_lease):
        its writes are then answered TransactionCoordinatorNotFound until a keep-alive renews it, or the
        session expires and another instance leads."""
        return self._lease is not None and lease_clock() >= self._lease()

    @property
    def last_issued(self) -> int:
        """The last txn id this instance handed out on this coordinator since it led it (-1: none)."""
        return self._ids.last_issued

    # -- requests --------------------------------------------------------------------------------

    async def new_txn(self, ttl_ms: int, owner: str | None) -> int:
        """Create an OPEN txn and return its leastSigBits. Raises NotAllowed for a timeout above the
        configured maximum; StoreError when the store fails."""
        if ttl_ms < 0:
            raise NotAllowed(f"transaction timeout {ttl_ms} ms is negative")
        if ttl_ms == 0:
            ttl_ms = self._config.default_timeout_ms
        if ttl_ms > self._config.max_timeout_ms:
            raise NotAllowed(
                f"transaction timeout {ttl_ms} ms is above the maximum of {self._config.max_timeout_ms} ms"
            )
        # Decided txns whose participants were not all told count too, as in Pulsar's coordinator (a txn stays
        # in its map, COMMITTING or ABORTING, until its brokers acknowledged): each holds ~6 KB here, and a client
        # naming a topic no broker knows in every txn grew them without bound (a review: 30,000, +164 MiB).
        if 0 < self._config.max_undelivered <= (undelivered := sum(map(len, self._outboxes))) and (
                owner is None or self._principals.owes(owner)):
            # Only those who owe some are refused: a principal's own undelivered decisions are bounded by its
            # limit (principals.py), and one role's must not deny the others new txns (a review's).
            raise NotAllowed(f"this instance holds {undelivered} decided transactions whose brokers have not all "
                             "acknowledged, its limit (--max-undelivered-decisions); see "
                             "/admin/v3/transactions/undelivered and the brokers it names")
        if 0 < self._config.max_undelivered_participants <= (owed := self._owed.participants) and (
                owner is None or self._principals.owes(owner)):
            raise NotAllowed(f"this instance is telling {owed} topics and subscriptions decisions their brokers have "
                             "not acknowledged yet, its limit (--max-undelivered-participants); see "
                             "/admin/v3/transactions/undelivered and the brokers it names")
        if 0 < self._config.max_active_txns <= len(self._open) + len(self._undelivered):
            # Pulsar's broker leaves such a NEW_TXN unanswered so the client does not retry it
            # (apache/pulsar#15133); an answer that is not retried says the same and names the limit.
            raise NotAllowed(f"transaction coordinator {self.tc_id} has {len(self._open)} open transactions and "
                             f"{len(self._undelivered)} decided ones its brokers have not all acknowledged, its limit "
                             "(--max-active-transactions-per-coordinator); end some first, or see "
                             "/admin/v3/transactions/undelivered")
        if owner is not None:  # check() passes no principal at once: a call less per NEW_TXN (issue 13)
            self._principals.check(owner)
        least = self._ids.take()
        if least is None:
            least = await self._ids.next_id()
        if owner is not None:
            # Re-checked after the await: concurrent NEW_TXNs of one principal must not overshoot.
            self._principals.check(owner)
        header = TxnHeader(TxnState.OPEN, created_ms=self._clock(), timeout_ms=ttl_ms, owner=owner)
        key = layout.txn_key(self.tc_id, least)
        path = layout.HEADER_PREFIX + key  # layout.header_path(), from the key: a call less (issue 13)
        # Track the deadline before writing: if the write's outcome is unknown (store error, request
        # timeout) the header may exist, and it must still be aborted on time. If it does not
        # exist, the timeout finds nothing and forgets the id.
        self._track(least, header.deadline_ms)
        if owner is not None and not self._stopped:  # stopped: stop() already handed the counts back
            # Counted from here, not only once the write lands: otherwise a principal's concurrent
            # NEW_TXNs all pass the check before the first write lands. It leaves the count with
            # the open set (_forget), also when the write failed and the timeout forgets the id.
            self._owners[least] = self._principals.add(owner)
        # The write goes on on its own (start_put), so that it finishes (and is counted when it lands)
        # also if this request is cancelled by its timeout meanwhile (issue 15: such txns were aborted
        # later but never counted as created). This request waits on a plain future that _written
        # resolves: cancelling the request cancels only that future, never the write (what
        # asyncio.shield() did, with one future and callback less: profiled, issue 13).
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        write = self._store.start_put(
            path,
            header.to_json(),
            expected_version=EXPECT_ABSENT,
            partition_key=key,
            secondary_indexes=header.index_entries(),
        )
        if write.done():
            # Refused before anything was sent (start_put: a future that has failed as it returns wrote
            # nothing; a store whose writer is too far behind refuses so): no header will ever exist, so
            # the id leaves the open set now, or it would hold a place under the active-txn limit and its
            # principal's until its whole timeout, refusing healthy NEW_TXNs after a short disk stall.
            self._forget(least)
            write.result()
        landed: asyncio.Future[None] = loop.create_future()
        write.add_done_callback(functools.partial(self._written, least, header, landed))
        await landed
        try:
            write.result()
        except BadVersionError:
            # Only possible if someone else wrote a header under an id reserved by our CAS.
            raise CoordinatorError(f"header for new txn ({key}) already exists: id space corrupted") from None
        self._check_still_leading(least, "header")
        return least

    def _written(self, least: int, header: TxnHeader, landed: asyncio.Future[None],
                 write: asyncio.Future[Record]) -> None:
        """The header write of a NEW_TXN finished (runs before the request resumes)."""
        if not landed.done():
            landed.set_result(None)
        if write.cancelled() or write.exception() is not None:
            if least in self._open and not self._stopped:
                # Its outcome is unknown (the header may or may not be written): look early, not at the
                # deadline, so that a header never written does not hold its place in the open set for the
                # whole timeout. expire() forgets an id without a header and puts one whose header exists
                # back at its deadline; one that lands after that look is the overdue scan's.
                self._track(least, min(header.deadline_ms, self._clock() + TIMEOUT_RETRY_MS))
                self._created_unsure.add(least)
            return
        if least not in self._open and not self._stopped:
            # The write was slower than the txn's timeout: the sweep looked for the header before it
            # existed and forgot the id. Track it again, so that it is aborted now that it exists.
            self._track(least, header.deadline_ms)
        self._header_writes.inc()
        self._created.inc()
        self._headers[least] = (header, write.result().version)
        self._complete.add(least)

    async def add_participants(self, least: int, principal: str | None,
                               participants: Sequence[Participant] = (), superuser: bool = False) -> None:
        """ADD_PARTITION_TO_TXN / ADD_SUBSCRIPTION_TO_TXN: the txn must be OPEN and in time. The
        participants (today's brokers; v5 participants pass none) are recorded before this returns,
        so a decision can always reach them (docs/participants.md). An empty topic or subscription
        name is refused with NotAllowed: no broker could ever be told about it; so are a request naming
        more than MAX_PARTICIPANTS_PER_ADD and a name longer than MAX_PARTICIPANT_NAME_BYTES."""
        if len(participants) > MAX_PARTICIPANTS_PER_ADD:
            raise NotAllowed(f"transaction ({self.tc_id},{least}): {len(participants)} topics or subscriptions in one "
                             f"request; at most {MAX_PARTICIPANTS_PER_ADD} (send the others in further requests)")
        for participant in participants:
            if not participant.topic.strip() or (participant.subscription is not None
                                                 and not participant.subscription.strip()):
                raise NotAllowed(f"transaction ({self.tc_id},{least}): empty topic or subscription name "
                                 f"in {participant}")
            longest = max(len(participant.topic.encode()), len((participant.subscription or "").encode()))
            if longest > MAX_PARTICIPANT_NAME_BYTES:
                raise NotAllowed(f"transaction ({self.tc_id},{least}): a topic or subscription name of {longest} "
                                 f"bytes; at most {MAX_PARTICIPANT_NAME_BYTES} (topic {participant.topic[:100]!r}...)")
            if participant.topic.startswith(NON_PERSISTENT):
                # Its broker has no transaction buffer: it refuses transactional sends and answers every
                # END_TXN_ON_* with an error, so the decision could never be delivered, and the pinned
                # low watermark would hold back every later txn of this coordinator.
                raise NotAllowed(f"transaction ({self.tc_id},{least}): {participant.topic}: non-persistent topics "
                                 "take no part in transactions")
        decision, header = await self._apply(least, Request.ADD, principal, superuser)
        if decision is Decision.EXPIRE:
            raise InvalidTxnStatus(f"transaction ({self.tc_id},{least}) timed out and was aborted")
        if decision is Decision.CONFLICT:
            raise InvalidTxnStatus(f"transaction ({self.tc_id},{least}) is already {header.state.value}")
        if participants:
            await self._record(least, participants)

    async def end_txn(self, least: int, commit: bool, principal: str | None,
                      superuser: bool = False) -> asyncio.Future[None] | None:
        """END_TXN, by ``principal`` (its owner, or a superuser: either may end it). Idempotent: ending a
        txn again in the same way succeeds. Returns, while the decision's delivery to the participants is
        under way, its future (done once every broker acknowledged); None when there is nothing to wait for."""
        request = Request.COMMIT if commit else Request.ABORT
        decision, header = await self._apply(least, request, principal, superuser)
        # A COMMIT of a txn that was aborted (by its timeout, now or before, or by an ABORT) is answered as
        # Pulsar's coordinator answers it, TransactionNotFound, not InvalidTxnStatus: Flink's Pulsar sink
        # (PulsarCommitter) takes InvalidTxnStatus for "already committed" and goes on without the
        # checkpoint's output, where TransactionNotFound on a first attempt fails the job (a review's).
        if decision is Decision.EXPIRE:
            raise TransactionNotFound(f"cannot commit transaction ({self.tc_id},{least}): it timed out and was "
                                      "aborted")
        if decision is Decision.CONFLICT:
            self._cas_reject.inc()
            if commit:
                raise TransactionNotFound(f"cannot commit transaction ({self.tc_id},{least}): it was aborted")
            raise InvalidTxnStatus(
                f"cannot {request.value} transaction ({self.tc_id},{least}): it is already {header.state.value}"
            )
        if decision in (Decision.COMMIT, Decision.ABORT, Decision.ALREADY):
            # ALREADY too: a retry (after a lost answer) waits for the delivery still under way, as
            # the first END_TXN did, so that consumers see a commit once commit() returns.
            outbox = self._undelivered.get(least)
            if outbox is None and decision is Decision.ALREADY and not self._recovered:
                # The outbox is not recovered yet (a restart, a take-over): this txn's participants may still
                # be owed the decision. Delivered from its records now, as recover_outbox would (which then
                # leaves it be: _delivered_early), so the retry waits as the first END_TXN did; it answered at
                # once, before any broker was told, and commit() returned with the messages not visible yet.
                self._delivered_early.add(least)
                return self._start_delivery(least, header.state, None, header.finalized_ms or self._clock(),
                                            header.owner)
            return outbox.done if outbox is not None else None
        return None

    async def force_abort(self, least: int) -> TxnState:
        """Operator abort (apache/pulsar#19786): no owner check; returns the final state."""
        _, header = await self._apply(least, Request.ABORT, None, superuser=True)
        return header.state

    def tracks(self, least: int) -> bool:
        """Whether the deadline queue holds ``least`` as an open txn."""
        return least in self._open

    def open_txns(self) -> dict[int, int]:
        """Snapshot of the open txns tracked here: least -> deadline ms."""
        return dict(self._open)

    # -- the state machine -----------------------------------------------------------------------

    async def _apply(
        self, least: int, request: Request, principal: str | None, superuser: bool = False
    ) -> tuple[Decision, TxnHeader]:
        """Read the header, decide by the transition table, CAS if the decision writes, publish
        events after a successful CAS (never before: participants rely on that order). Only the txn's
        owner acts on it, or a ``superuser`` (a superuser role's request, the timeout sweep, an admin's
        force-abort)."""
        key = layout.txn_key(self.tc_id, least)
        path = layout.HEADER_PREFIX + key  # layout.header_path(), from the key: a call less (issue 13)
        for _ in range(MAX_CAS_ATTEMPTS):
            cached = self._headers.get(least)
            if cached is not None:
                header, version = cached
            else:
                record = await self._store.get(path, partition_key=key)
                if record is None:
                    raise TransactionNotFound(f"transaction ({self.tc_id},{least}) not found")
                try:
                    header = TxnHeader.from_json(record.value)
                except ValueError as exc:
                    # The detail (which may quote stored bytes) goes to the log, not to the client.
                    self._log.warning("unreadable txn header", txn=f"({self.tc_id},{least})", error=str(exc)[:200])
                    if principal is not None and not superuser:
                        # Its owner cannot be read: a role answered otherwise than for an id that does not
                        # exist learnt that this one does (a review). The log line above says what it is.
                        raise TransactionNotFound(f"transaction ({self.tc_id},{least}) not found") from None
                    raise StoreCorrupted(f"header of ({self.tc_id},{least}) is unreadable") from None
                version = record.version
                if least in self._created_unsure:  # its NEW_TXN's header did land
                    self._created_unsure.discard(least)
                    self._created.inc()
            if not (superuser or header.owner is None or header.owner == principal):
                # Pulsar answers TransactionNotFound here, so the id's existence is not revealed: the
                # same words as for an id that does not exist (above), not a word more.
                raise TransactionNotFound(f"transaction ({self.tc_id},{least}) not found")
            if cached is None and header.state.terminal and least in self._open:
                # Decided on disk but still open here: a CAS of this leader whose answer was lost (below), or an
                # earlier leader's. Take the decision's own steps now, before anything answers from this header
                # (after the owner check: another role's request learnt of the id from how they went).
                await self._adopt_decision(least, header)
            now = self._clock()
            decision = decide(header.state, request, now >= self._deadline_of(least, header))
            if decision in (Decision.COMMIT, Decision.ABORT, Decision.EXPIRE):
                # Positional, not dataclasses.replace(): two headers are built per transaction (profiled). Never
                # stamped before its creation: a header created by a clock ahead of this one (a restart after
                # the system clock was stepped back, a peer's on Oxia) was otherwise ended "before" it began,
                # which the audit reports as an illegal header.
                # A createdAt kept as stored may lie within its millisecond (Pulsar's nanoseconds): the earliest
                # end then is the next millisecond, or the end was written before the beginning (a review).
                earliest = header.created_ms if header.created_text is None else header.created_ms + 1
                ended = TxnHeader(target_state(decision), header.created_ms, header.timeout_ms,
                                  now if now >= earliest else earliest, header.owner, header.created_text)
                try:
                    await self._store.put(
                        path,
                        ended.to_json(),
                        expected_version=version,
                        partition_key=key,
                        secondary_indexes=ended.index_entries(),
                    )
                except BadVersionError:
                    self._cas_conflict.inc()
                    self._headers.pop(least, None)  # someone else wrote it: read it next time
                    continue
                except BaseException:
                    # The outcome is unknown (the request's deadline, a store error): the header may
                    # be written. The next request reads it instead of deciding from this copy, and
                    # the sweep looks soon, so a decision that landed is delivered without waiting
                    # for a retry or the txn's deadline.
                    self._headers.pop(least, None)
                    self._unsure[least] = decision is Decision.EXPIRE
                    deadline = self._open.get(least)
                    if deadline is not None and not self._stopped:
                        self._track(least, min(deadline, self._clock() + TIMEOUT_RETRY_MS))
                    raise
                self._cas_ok.inc()
                self._header_writes.inc()
                await self._decided(least, ended, timed_out=decision is Decision.EXPIRE)
                self._check_still_leading(least, "decision")
                return decision, ended
            if decision is Decision.ALREADY:
                # A retry after a reconnect: the events may not all have been written the first
                # time (the store failed after the CAS), so write them again. Participants treat
                # a repeated decision as a no-op.
                await self._publish(least, header.state)
            if header.state.terminal:
                self._forget(least)
                # Not from a partition that stepped down: the next leader may hold the txn open (a
                # decision that landed after its scan) and deliver it only at the txn's deadline. The
                # client's retry there adopts the decision and delivers it at once.
                self._check_still_leading(least, "decision")
            elif decision is Decision.ACCEPT:
                # Decided from the header in memory, with nothing written (a v5 ADD, or participants already
                # recorded): a partition whose lease lapsed may be answering for a txn the next leader has
                # aborted meanwhile, and the client would go on producing into it.
                self._check_still_leading(least, "participants")
            return decision, header
        raise CoordinatorError(f"header of ({self.tc_id},{least}) changed {MAX_CAS_ATTEMPTS} times in a row")

    async def _decided(self, least: int, header: TxnHeader, timed_out: bool, counted: bool = True) -> None:
        """What follows a decision's CAS: the outbox, the open set, the metrics (unless ``counted`` is
        False), the events."""
        # Into the outbox before leaving the open set, in the same step: the txn must never be
        # neither OPEN nor undelivered while its brokers have not heard (the low watermark).
        self._hold(least, header)
        self._ended(least, header, timed_out=timed_out, counted=counted)
        # Nothing to publish where the store knows no participant wrote an op record (today's brokers on
        # the embedded store): three coroutines and a scan's metric less per END_TXN (issue 13).
        if self._store.index_surely_empty(layout.IDX_OPS_BY_TXN):
            return
        # _publish, inlined: a coroutine less per END_TXN (issue 13).
        try:
            await publish_decision(self._store, self._metrics, self.tc_id, least, header.state)
        except BaseException:
            self._unpublished[least] = header.state
            raise

    async def _adopt_decision(self, least: int, header: TxnHeader) -> None:
        """A decided ``header`` read for a txn still in the open set: take the decision's own steps (a
        txn leaves the open set only into the outbox, or the low watermark would pass it and its
        brokers abort a commit)."""
        # This leader's own decision says whether it was the timeout's; an earlier leader's, only its time.
        timed_out = header.state is TxnState.ABORTED and (
            self._unsure[least] if least in self._unsure
            else header.finalized_ms is not None and header.finalized_ms >= header.deadline_ms)
        # Counted here only when the decision may be this leader's own CAS whose answer was lost (it
        # counted nothing then). Otherwise an earlier leader took it and counted it when its CAS
        # succeeded; counting it again made the cluster's pulsar_txn_committed_total / _aborted_total,
        # summed over instances, count every txn decided around a hand-over twice. (An earlier
        # leader's CAS whose answer it lost is then counted by no one: rarer, and never twice.)
        await self._decided(least, header, timed_out=timed_out, counted=least in self._unsure)

    def _hold_undeliverable(self, least: int, headerless: bool = False) -> None:
        """Keep a txn whose decision cannot be read in the outbox, undelivered: it holds the low
        watermark (its brokers must not abort what may be a commit) and shows in the admin's
        "undelivered" until an operator repairs the header and the coordinator is led again, or, for a
        ``headerless`` one, drops its participants (drop_participant)."""
        if least not in self._undelivered:
            self._undelivered[least] = _Outbox(self._clock(), TxnState.OPEN, asyncio.get_running_loop().create_future(),
                                               headerless=headerless)
            heapq.heappush(self._undelivered_ids, least)

    def _check_still_leading(self, least: int, what: str) -> None:
        """After a write: raise CoordinatorNotFound if this partition stepped down while it was in
        flight. The next leader may have scanned the store before the write landed (it would neither
        track that NEW_TXN nor deliver that decision), so the client must hear it from the next
        leader, where its retry goes (the Java client retries on this code after a lookup)."""
        if self._stopped:
            raise CoordinatorNotFound(f"transaction coordinator {self.tc_id} stepped down on this instance while "
                                      f"the {what} of ({self.tc_id},{least}) was being written; look it up again")
        # The leader record's session may have expired on the store while this process did not hear
        # (stalled longer than the session timeout): another instance may lead and have scanned the
        # store already, and would not track a txn whose NEW_TXN is answered here (its low watermark
        # could pass it). Answered only while the session surely lived when the write landed.
        if self.lease_lapsed():
            raise CoordinatorNotFound(f"transaction coordinator {self.tc_id}: this instance's hold on it may have "
                                      f"lapsed (no store keep-alive answered within the session timeout) while "
                                      f"the {what} of ({self.tc_id},{least}) was being written; look it up again")

    async def _publish(self, least: int, decision: TxnState) -> None:
        """Write the decision's events. Should that fail or be cancelled, the decision is kept for the
        sweeper (publish_pending) and stop() to write again, whichever path published it."""
        try:
            await publish_decision(self._store, self._metrics, self.tc_id, least, decision)
        except BaseException:
            self._unpublished[least] = decision
            raise

    # -- timeouts --------------------------------------------------------------------------------

    def _deadline_of(self, least: int, header: TxnHeader) -> int:
        """The deadline the decisions go by: the header's, or the one adopt_one cut it to."""
        return header.deadline_ms if not self._capped else self._capped.get(least, header.deadline_ms)

    def _track(self, least: int, deadline_ms: int) -> None:
        if least not in self._open:
            heapq.heappush(self._open_ids, least)
        self._open[least] = deadline_ms
        heapq.heappush(self._deadlines, (deadline_ms, least))

    def _forget(self, least: int) -> None:
        if not self._recovered:
            # Requests are served before recovery lands: a page of the scan read before this txn
            # ended must not bring it back as open (adopt_one).
            self._gone_while_recovering.add(least)
        owner = self._owners.pop(least, None)
        if owner is not None:
            self._principals.remove(owner)
        self._headers.pop(least, None)
        self._unsure.pop(least, None)
        self._created_unsure.discard(least)
        self._capped.pop(least, None)
        self._recorded.pop(least, None)
        self._complete.discard(least)
        self._open.pop(least, None)
        _compact(self._open_ids, self._open)  # nothing else may ask for the lowest open id (no deliveries)

    def _ended(self, least: int, header: TxnHeader, timed_out: bool, counted: bool = True) -> None:
        self._forget(least)
        if not counted:
            return
        if header.state is TxnState.COMMITTED:
            self._committed.inc()
        else:
            self._aborted.inc()
            if timed_out:
                self._timed_out.inc()
        if header.finalized_ms is not None:
            latency_s = max(0, header.finalized_ms - header.created_ms) / 1000
            self._latency.observe(latency_s)

    def due_timeouts(self, now_ms: int) -> list[int]:
        """Pop every tracked txn whose deadline has passed (stale heap entries are dropped)."""
        if len(self._deadlines) > 2 * len(self._open) + 1024:
            # Ended txns leave their entry behind until its deadline; with long timeouts that is
            # rate x timeout entries, so rebuild from the open set when stale ones dominate.
            self._deadlines = [(deadline, least) for least, deadline in self._open.items()]
            heapq.heapify(self._deadlines)
        due: list[int] = []
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            deadline, least = heapq.heappop(self._deadlines)
            # A txn tracked again at the deadline it had (an early look that found it in time) has two equal
            # entries, which pop one after the other: it is due once, not expired twice at the same time.
            if self._open.get(least) == deadline and not (due and due[-1] == least):
                due.append(least)
        return due

    async def expire(self, least: int) -> None:
        """Abort one txn whose deadline passed, if it is still OPEN; on a store failure it is
        queued again so that it is retried. Also the early look after an END_TXN whose write's outcome
        was unknown: a decision found is delivered (_apply), a txn still in time goes back to its
        deadline."""
        try:
            _, header = await self._apply(least, Request.TIMEOUT, None, superuser=True)
        except TransactionNotFound:
            if self._headers.pop(least, None) is not None and not self._stopped:
                # Its NEW_TXN's header landed after this read was made and before its answer came
                # back: the write's own check (_written) found the txn still tracked and left it.
                # Look again now (reading the store: the header cached by the write is dropped, so
                # that a header gone meanwhile is forgotten next time), or it stays OPEN untracked
                # until the overdue scan.
                self._track(least, self._clock())
            else:
                self._forget(least)
        except Exception as exc:  # noqa: BLE001 - one bad txn must not stop every other timeout
            if isinstance(exc, CoordinatorNotFound) and least not in self._open:
                # The abort landed (the txn left the open set for the outbox), but this instance may have
                # stopped leading meanwhile (_check_still_leading): nothing to retry here.
                self._log.info("timeout abort written; this instance may no longer lead the coordinator",
                               txn=f"({self.tc_id},{least})")
                return
            if isinstance(exc, StoreError | CoordinatorError | TimeoutError):
                self._log.warning("timeout abort failed; will retry", txn=f"({self.tc_id},{least})",
                                  error=repr(exc))
            else:
                self._log.exception("timeout abort failed; will retry", txn=f"({self.tc_id},{least})")
            if least in self._open:
                self._track(least, self._clock() + TIMEOUT_RETRY_MS)
        else:
            if header.state is TxnState.OPEN and least in self._open:
                # Looked at before its deadline (an END_TXN's write whose outcome was unknown, in
                # _apply) and still open. That write may still be queued in the store (a stalled disk):
                # look again each TIMEOUT_RETRY_MS until the deadline, or a decision landing later waits
                # for the deadline (up to --max-txn-timeout-ms) before its brokers hear of it.
                retry = self._clock() + TIMEOUT_RETRY_MS
                deadline_ms = self._deadline_of(least, header)
                self._track(least, min(deadline_ms, retry) if least in self._unsure else deadline_ms)

    async def _run_timeouts(self) -> None:
        gate = asyncio.Semaphore(TIMEOUT_CONCURRENCY)

        async def one(least: int) -> None:
            async with gate:
                await self.expire(least)

        while True:
            due = self.due_timeouts(self._clock())
            if due:
                await asyncio.gather(*(one(least) for least in due))
            if self._unpublished:
                await self.publish_pending()
            await asyncio.sleep(TIMEOUT_TICK_S)

    async def publish_pending(self) -> None:
        """Write again the events of decisions whose first publication failed."""
        for least, state in list(self._unpublished.items()):
            try:
                await self._publish(least, state)
            except (StoreUnavailableError, TimeoutError) as exc:  # the store: the next ones would fail as well
                self._log.warning("publishing a decision failed; will retry", txn=f"({self.tc_id},{least})",
                                  error=repr(exc))
                return
            except Exception:  # noqa: BLE001 - this one (an unreadable record?): not the later ones, nor the sweeper
                self._log.exception("publishing a decision failed; will retry", txn=f"({self.tc_id},{least})")
                continue
            self._unpublished.pop(least, None)

    # -- participants of today's brokers: records, the outbox, delivery (docs/participants.md) -------

    async def _record(self, least: int, participants: Sequence[Participant]) -> None:
        """Write the participant records that are not written yet (one batch), then answer."""
        known = self._recorded.setdefault(least, {})
        prefix = layout.participants_prefix(self.tc_id, least)
        new: dict[str, tuple[Participant, bytes]] = {}
        for participant in participants:
            name, value = _encoded(participant)
            path = prefix + name
            if path not in known:
                new[path] = (participant, value)
        if not new:
            return
        limit = self._config.max_participants_per_txn
        if limit and len(known) + len(self._recording.get(least, {}).keys() | new.keys()) > limit:
            # Each participant is held in memory until the decision reaches its broker, and told at
            # the decision: without a bound one client could make one txn as large as it likes.
            raise NotAllowed(f"transaction ({self.tc_id},{least}): {len(known)} topics and subscriptions already, "
                             f"{len(new)} more would pass --max-participants-per-transaction ({limit})")
        key = layout.txn_key(self.tc_id, least)
        index = {layout.IDX_PARTICIPANTS_BY_COORDINATOR: layout.participants_by_coordinator_key(self.tc_id, least)}
        recording = self._recording.setdefault(least, {})
        for path, (participant, _) in new.items():
            recording[path] = participant
        try:
            await self._store.write_batch([
                Put(path, value, partition_key=key, secondary_indexes=index)
                for path, (_, value) in new.items()
            ])
        except BaseException:
            # Failed or given up (the request's deadline), these records may still land: memory no
            # longer knows them all, so the decision reads them from the store.
            self._complete.discard(least)
            raise
        finally:
            for path in new:
                recording.pop(path, None)
            if not recording and self._recording.get(least) is recording:
                del self._recording[least]
        self._participant_writes.inc(len(new))
        try:
            self._check_still_leading(least, "participant records")
        except CoordinatorNotFound:
            # Landed but refused: a lapsed lease may be renewed and this instance decide the txn after all,
            # from memory that never learnt of these records. The decision reads them from the store.
            self._complete.discard(least)
            raise
        if least in self._open:
            for path, (participant, _) in new.items():
                known[path] = participant
            if least not in self._unsure:
                return
            # Open here, but a decision of this partition's had an unknown outcome (_unsure). That write
            # was queued before these records, so it has landed by now if it ever will: look.
        else:
            # Decided while these records were being written (a timeout, an END_TXN on another
            # connection), or a txn not loaded yet: its delivery may have listed the participants
            # before these records existed, so look at the header and deliver them too if decided.
            self._recorded.pop(least, None)
        try:
            record = await self._store.get(layout.header_path(self.tc_id, least), partition_key=key)
        except BaseException:
            if least not in self._open:
                # The look failed (the store, the request's deadline): a decision's delivery may have listed the
                # participants before these records existed, and they waited for the next leader (a review).
                self._recheck(least)
            raise
        if record is None:
            return
        header = TxnHeader.from_json(record.value)  # unreadable: ValueError, answered as an error
        if not header.state.terminal:
            return
        if least in self._open:
            await self._adopt_decision(least, header)  # its outbox lists these records too (known above)
        else:
            self._start_delivery(least, header.state, None, header.finalized_ms or self._clock(), header.owner)
        # The client must not send in it: its brokers may have heard the decision already.
        raise InvalidTxnStatus(f"transaction ({self.tc_id},{least}) is already {header.state.value}")

    def _recheck(self, least: int) -> None:
        """Look at ``least``'s header until the store answers, and deliver its decision from the records if it
        was decided (once more to those already told, which brokers ignore)."""
        if self._stopped or least in self._rechecks:  # stepped down: the next leader's scan finds the records
            return
        task = asyncio.get_running_loop().create_task(self._deliver_if_decided(least))
        self._rechecks[least] = task
        task.add_done_callback(lambda _: self._rechecks.pop(least, None))

    async def _deliver_if_decided(self, least: int) -> None:
        path, key = layout.header_path(self.tc_id, least), layout.txn_key(self.tc_id, least)
        record = await self._retrying_store(lambda: self._store.get(path, partition_key=key))
        if record is None or self._stopped or least in self._open:
            return
        try:
            header = TxnHeader.from_json(record.value)
        except ValueError as exc:
            self._log.warning("unreadable txn header", txn=f"({self.tc_id},{least})", error=str(exc)[:200])
            return
        if header.state.terminal:
            self._start_delivery(least, header.state, None, header.finalized_ms or self._clock(), header.owner)

    def _hold(self, least: int, ended: TxnHeader) -> None:
        """Put a txn just decided into the outbox, unless it is known to have no participant records."""
        complete = least in self._complete
        recorded, recording = self._recorded.get(least), self._recording.get(least)
        if complete and not recorded and not recording:
            return  # the common END_TXN without participants: no merged dict built (issue 13)
        participants = list({**(recorded or {}), **(recording or {})}.items()) if complete else None
        self._start_delivery(least, ended.state, participants, ended.finalized_ms or self._clock())

    def _start_delivery(self, least: int, state: TxnState, participants: list[tuple[str, Participant]] | None,
                        decided_ms: int, owner: str | None = None) -> asyncio.Future[None]:
        """Deliver ``state`` to the participants (None: read their records from the store). ``owner``: the
        txn's, when it is no longer open here (recovered from its header)."""
        outbox = self._undelivered.get(least)
        if self._stopped:  # stepped down meanwhile: the next leader re-drives the records
            stepped_down: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            stepped_down.set_result(None)
            return stepped_down
        if outbox is None:
            outbox = _Outbox(decided_ms, state, asyncio.get_running_loop().create_future())
            # Still open when just decided: _decided holds before it forgets.
            if (owner := self._owners.get(least, owner)) is not None:
                outbox.owner = self._principals.add_undelivered(owner)
            self._undelivered[least] = outbox
            heapq.heappush(self._undelivered_ids, least)
        task = asyncio.create_task(self._deliver(least, state, participants, outbox.done),
                                   name=f"deliver-({self.tc_id},{least})")
        outbox.tasks.add(task)
        task.add_done_callback(lambda done: self._delivery_finished(least, outbox, done))
        return outbox.done

    def _delivery_finished(self, least: int, outbox: _Outbox, task: asyncio.Task[bool]) -> None:
        outbox.tasks.discard(task)
        if task.cancelled():
            return  # stepping down: the next leader re-drives the records
        error = task.exception()
        if error is not None:
            # A bug, not a broker or store failure (those are retried inside): start over from the
            # records a little later rather than leave the decision undelivered until a restart.
            self._log.error("delivering a decision failed; starting over", txn=f"({self.tc_id},{least})",
                            exc_info=error)
            # Held until then, also should a sibling delivery of the txn end well meanwhile: its participants were
            # not all told, and a watermark past the txn would tell their brokers to abort it (a review).
            outbox.restarts_pending += 1
            asyncio.get_running_loop().call_later(OUTBOX_RETRY_MAX_S, self._restart_delivery, least, outbox)
            return
        # Without a sender the records stay (held), but END_TXN need not wait for what cannot happen.
        if not outbox.done.done():
            outbox.done.set_result(None)
        if (task.result() and not outbox.tasks and not outbox.restarts_pending
                and self._undelivered.get(least) is outbox):
            self._delivered(least, outbox)
            self._delivery_latency.observe(max(0, self._clock() - outbox.decided_ms) / 1000)

    def _restart_delivery(self, least: int, outbox: _Outbox) -> None:
        outbox.restarts_pending -= 1
        if not self._stopped:
            self._start_delivery(least, outbox.state, None, outbox.decided_ms)

    def _delivered(self, least: int, outbox: _Outbox) -> None:
        """The outbox entry leaves: every participant acknowledged (or was dropped)."""
        del self._undelivered[least]
        # Its id stays in the heap until popped: only a lowest_held() pops, and a workload that only commits may
        # never ask it (a review: one id kept per delivered commit, ~700 MB an hour at 5,000 commits/s).
        _compact(self._undelivered_ids, self._undelivered)
        if outbox.owner is not None:
            self._principals.remove_undelivered(outbox.owner)

    async def _deliver(self, least: int, state: TxnState, participants: list[tuple[str, Participant]] | None,
                       acknowledged: asyncio.Future[None]) -> bool:
        """Tell every participant; resolve ``acknowledged`` (END_TXN answers) once all acknowledged;
        True once their records are deleted too. A txn with a participant record that cannot be read is never
        done here: the others are told and their records deleted, and the txn stays held (the low watermark
        below it, listed as undelivered) until an operator drops that record by its key (a review: the txn left
        the outbox, and the next watermark told the unread participant's broker to abort a commit)."""
        unreadable: list[str] = []
        if participants is None:
            participants, unreadable = await self._retrying_store(lambda: self._read_participants(least))
        if unreadable:
            self._log.error("participant records that cannot be read: the decision is held, and holds the low "
                            "watermark, until an operator drops them by key (docs/participants.md)",
                            txn=f"({self.tc_id},{least})", keys=unreadable[:10], count=len(unreadable))
        if not participants:
            if unreadable and not acknowledged.done():
                acknowledged.set_result(None)  # END_TXN answers: the decision is durable, the rest is held
            return not unreadable
        if self._sender is None:
            global _warned_no_sender
            if not _warned_no_sender:
                _warned_no_sender = True
                self._log.warning("no --upstream-url: decisions cannot reach today's brokers; their participant "
                                  "records are kept (the outbox) until an instance with an upstream leads",
                                  txn=f"({self.tc_id},{least})")
            return False
        sender = self._sender
        committed = state is TxnState.COMMITTED

        # Read at each send (a retry may carry a higher one): the txn's own commands may cover it (low_watermark).
        watermark = functools.partial(self.low_watermark, least)
        owed = self._owed
        if len(participants) == 1:  # the common case (one produced message): no group, no extra task
            owed.participants += 1
            try:
                await sender.end_txn_on(participants[0][1], self.tc_id, least, committed, watermark)
            finally:
                owed.participants -= 1
        else:
            outbox = self._undelivered.get(least)
            told: set[str] = set()
            if outbox is not None:
                if outbox.told is None:
                    outbox.told = told
                told = outbox.told

            async def tell(path: str, participant: Participant) -> None:
                owed.participants += 1
                try:
                    await sender.end_txn_on(participant, self.tc_id, least, committed, watermark)
                finally:
                    owed.participants -= 1
                told.add(path)

            # A group, not gather(): should one fail (a bug; broker and store failures are retried
            # inside), the others are cancelled rather than left running untracked past a stop().
            async with asyncio.TaskGroup() as group:
                for path, participant in participants:
                    group.create_task(tell(path, participant))
        # Every broker acknowledged: END_TXN may answer now, without waiting for the records' deletion
        # (bookkeeping only: a record left by a crash here is delivered again, which brokers ignore).
        # The txn stays in the outbox, holding the low watermark, until its records are gone.
        if not acknowledged.done():
            acknowledged.set_result(None)
        # Deleted only now that all acknowledged, and in one batch rather than one write each.
        key = layout.txn_key(self.tc_id, least)
        deletes = [Delete(path, partition_key=key) for path, _ in participants]
        await self._retrying_store(lambda: self._store.write_batch(deletes))
        if not committed:
            partitions = [participant for _, participant in participants if participant.subscription is None]
            if partitions and not self._stopped:
                due = asyncio.get_running_loop().time() + ABORT_REMINDER_S
                self._abort_reminders.append((due, least, partitions))
                if self._reminding is None:
                    self._reminding = self._track_reminder(self._remind_of_aborts(), f"abort-reminders-{self.tc_id}")
        return not unreadable

    def _track_reminder(self, reminder: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(reminder, name=name)
        self._reminders.add(task)
        task.add_done_callback(self._reminders.discard)
        return task

    async def _remind_of_aborts(self) -> None:
        """ABORT_REMINDER_S after each ABORT was delivered, send it to its partitions again (see there): wait for
        the oldest entry of _abort_reminders, send every entry due by then, until none is left."""
        loop = asyncio.get_running_loop()
        try:
            while self._abort_reminders:
                wait = self._abort_reminders[0][0] - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                now = loop.time()
                due: list[tuple[int, list[Participant]]] = []
                while self._abort_reminders and self._abort_reminders[0][0] <= now:
                    _, least, partitions = self._abort_reminders.popleft()
                    due.append((least, partitions))
                # Sent beside this loop: a reminder waits up to ABORT_REMINDER_BOUND_S for its broker, and must
                # not hold back the ones due after it.
                self._track_reminder(self._remind_of(due), f"abort-reminder-({self.tc_id},{due[0][0]})")
        finally:
            self._reminding = None

    async def _remind_of(self, due: list[tuple[int, list[Participant]]]) -> None:
        sender = self._sender
        if sender is None or self._stopped:
            return
        # All at once, each one attempt within its bound: one after another, each retried to its bound, a broker
        # gone meanwhile held back the reminder to the txn's other partitions by 30 s each (a review's).
        await asyncio.gather(*(
            asyncio.wait_for(sender.remind_txn_on(participant, self.tc_id, least, False,
                                                  functools.partial(self.low_watermark, least)),
                             ABORT_REMINDER_BOUND_S)
            for least, partitions in due for participant in partitions), return_exceptions=True)

    async def _read_participants(self, least: int) -> tuple[list[tuple[str, Participant]], list[str]]:
        return await read_participant_records(self._store, self.tc_id, least, self._log)

    async def _retrying_store(self, operation: Callable[[], Awaitable[_T]]) -> _T:
        backoff = Backoff(OUTBOX_RETRY_INITIAL_S, OUTBOX_RETRY_MAX_S)
        while True:
            try:
                return await operation()
            except (StoreError, TimeoutError) as exc:
                self._log.warning("participant record operation failed; retrying", error=repr(exc))
                await asyncio.sleep(backoff.next_delay())

    async def recover_outbox(self) -> int:
        """At leadership, after :meth:`adopt`: re-drive every decided txn of this coordinator that still
        has participant records (a previous leader stopped between the decision and the brokers'
        acknowledgements), then compute the low watermark from what is held. Returns the number of
        txns re-driven. Raises StoreError (the caller retries)."""
        start, end = layout.participants_by_coordinator_range(self.tc_id)
        unreadable: set[int] = set()
        found: dict[int, list[tuple[str, Participant]]] = defaultdict(list)
        async for record in self._store.scan_index(layout.IDX_PARTICIPANTS_BY_COORDINATOR, start, end):
            try:
                most, least = layout.parse_participant_path(record.key)
            except ValueError as exc:
                self._log.error("participant record under a key that names no txn", key=record.key, error=str(exc))
                continue
            if most != self.tc_id:
                continue
            try:
                found[least].append((record.key, Participant.from_json(record.value)))
            except ValueError:
                # Its txn is still owed the decision there: delivered from its records (participants None),
                # where _deliver holds it for the unreadable one (a review: the scan skipped it, and a txn
                # with only such a record was never held).
                found.setdefault(least, [])
                unreadable.add(least)
        redriven = 0
        for least, readable in sorted(found.items()):
            participants = None if least in unreadable else readable
            if least in self._undelivered or least in self._delivered_early:
                continue
            key = layout.txn_key(self.tc_id, least)
            stored = await self._store.get(layout.header_path(self.tc_id, least), partition_key=key)
            if least in self._undelivered or least in self._delivered_early:
                continue  # an END_TXN delivered it during that read (end_txn)
            if stored is None:
                if not any(await self._read_participants(least)):
                    continue  # delivered meanwhile (the previous leader's last acknowledgements)
                # tc-server's GC never deletes a header with participant records, but a Pulsar 5 broker's
                # coordinator sharing the store does: its GC looks at op records only, and deletes a decided
                # header past its retention while this instance was away (a review, with a real 5.0.0-M1
                # broker). The decision is unknown here: told ABORTED, a committed txn's messages were lost.
                # Held instead, holding the low watermark, until an operator drops its participants.
                self._log.error("participant records without a header: the decision was deleted by another "
                                "coordinator's garbage collection (a Pulsar 5 broker's?) and is unknown here; its "
                                "participants are not told and hold the low watermark until an operator drops "
                                "them (docs/participants.md)", txn=f"({self.tc_id},{least})",
                                participants=len(readable))
                self._hold_undeliverable(least, headerless=True)
                continue
            try:
                header = TxnHeader.from_json(stored.value)
            except ValueError as exc:
                self._log.error("unreadable header; its participants wait, holding the low watermark",
                                txn=f"({self.tc_id},{least})", error=str(exc))
                self._hold_undeliverable(least)
                continue
            if header.state is TxnState.OPEN:
                if least not in self._open:
                    self.adopt([(least, header, stored.version)])  # created after the deadline scan
                continue
            if least in self._open:
                # Adopted as OPEN by the deadline scan, decided since by the previous leader (it
                # stepped down before its brokers acknowledged): deliver it now, not at its deadline.
                await self._adopt_decision(least, header)
            else:
                self._start_delivery(least, header.state, participants, header.finalized_ms or self._clock(),
                                     header.owner)
            redriven += 1
        self._recovered = True
        self._gone_while_recovering.clear()
        self._delivered_early.clear()
        if redriven:
            self._log.info("re-driving undelivered decisions", count=redriven)
        # Its own task, retried on its own: a failure here must not send the coordinator through the
        # whole recovery again (a second deadline scan, without the guard _gone_while_recovering was).
        if self._owed_events is None and not self._stopped:
            self._owed_events = asyncio.create_task(self._publish_owed_events_retrying(),
                                                    name=f"owed-events-{self.tc_id}")
        return redriven

    async def _publish_owed_events_retrying(self) -> None:
        backoff = Backoff(OUTBOX_RETRY_INITIAL_S, OUTBOX_RETRY_MAX_S)
        while not self._stopped:
            try:
                await self._publish_owed_events()
                return
            except (StoreError, TimeoutError) as exc:
                self._log.warning("writing the events a previous leader owed failed; retrying", error=repr(exc))
                await asyncio.sleep(backoff.next_delay())

    async def _publish_owed_events(self) -> None:
        """At leadership: write again the events of every decided txn of this coordinator whose op
        records remain (Pulsar 5's participants delete theirs once they applied the decision).

        A participant re-reads a header only on an event (or at its own recovery), and the events
        follow the CAS: a leader that died between the two, or whose event writes failed until it
        stopped, left its participants waiting, for good or until GC past the retention. Its list of
        what it owed died with it, so the next leader writes them all again; a second event is harmless
        (docs/semantics.md §4). OPEN txns are skipped without a read; the cost is one header read per
        decided txn whose participants have not finished."""
        start, end = layout.ops_by_txn_coordinator_range(self.tc_id)
        owed: set[int] = set()
        async for record in self._store.scan_index(layout.IDX_OPS_BY_TXN, start, end):
            try:
                most, least = layout.parse_op_key(record.key)
            except ValueError:
                continue  # not Pulsar's op key form: its writer is not a participant we can tell
            if most == self.tc_id and least not in self._open:
                owed.add(least)
        published = 0
        for least in sorted(owed):
            if self._stopped:
                return
            stored = await self._store.get(layout.header_path(self.tc_id, least),
                                           partition_key=layout.txn_key(self.tc_id, least))
            try:
                header = None if stored is None else TxnHeader.from_json(stored.value)
            except ValueError:
                continue  # logged where it is served (_apply); no decision to tell
            if header is not None and header.state.terminal:
                try:
                    await self._publish(least, header.state)
                except (StoreUnavailableError, TimeoutError):
                    raise  # the store: the whole scan again, later (_publish_owed_events_retrying)
                except Exception as exc:  # noqa: BLE001 - this txn only (kept in _unpublished), not the ones after it
                    self._log.warning("writing the events of a decided txn failed", txn=f"({self.tc_id},{least})",
                                      error=repr(exc))
                    continue
                published += 1
        if published:
            self._log.info("wrote again the events of decided txns whose participants have not finished",
                           count=published)

    def low_watermark(self, ending: int | None = None) -> int:
        """What END_TXN_ON_* carries: (the smallest txn id of this coordinator that is OPEN or has
        undelivered participants) - 1, never more. A 4.x broker aborts its earliest open txn of this
        coordinator at or below it and refuses later sends there (docs/participants.md).

        ``ending``: the txn whose own END_TXN_ON_* carries it, left out of that set. A 4.2.4 broker ends that
        txn before it takes the watermark (TopicTransactionBuffer and PendingAckHandleImpl apply it after
        the decision's marker is written), so the txn's own command may cover it; and only the txn's own
        may: a send of it that reaches the partition afterwards (a producer's resend after a reconnect) is
        then refused, where it opened the txn again on the broker, which nobody would ever end: the
        partition's readers stayed pinned. Nothing else held: the watermark is the txn itself (every other id
        handed out here was ended)."""
        if not self._recovered or self._stopped or self.lease_lapsed():
            # Stopping: a txn decided meanwhile leaves the open set without entering the outbox (the next
            # leader re-drives it), so memory no longer holds everything below a watermark. Lapsed: another
            # instance may lead and have handed out ids this one never saw, below an id block this one took
            # since (a NEW_TXN refused for the lapse), and a watermark from here could cover them (a review).
            return UNKNOWN_WATERMARK
        if ending is not None and ending in self._undelivered and ending not in self._open:
            # From the heaps, not a pass over the outbox: asked at every send, its cost grew with the backlog's
            # square while a broker refused (a review: 244 us a send with 10,000 undelivered).
            others = [least for least in (_smallest(self._open_ids, self._open),
                                          _smallest_except(self._undelivered_ids, self._undelivered, ending))
                      if least is not None]
            return min(others) - 1 if others else ending
        lowest = self.lowest_held()
        if lowest is None:
            return UNKNOWN_WATERMARK  # nothing held; never asked then (the txn being delivered is held)
        return lowest - 1

    async def drop_participant(self, least: int, participant: Participant | str) -> int:
        """An operator's last resort (admin): forget ``participant`` of a decided txn in the outbox, one
        that can never be told (its topic or namespace deleted), so it no longer holds the txn in the
        outbox and the low watermark below it. Its broker never learns the decision. The txn's delivery
        starts over with the participants left. ``participant``: the participant, or the key of its record
        (one that cannot be read names no participant). Returns how many are left. Raises TransactionNotFound (no
        such participant record of this txn), InvalidTxnStatus (not in the outbox here as decided: open,
        delivered, or its header unreadable), CoordinatorNotFound (not leading), StoreError, TimeoutError.

        Drops run one at a time (a second drop of the same txn would start a delivery from records the
        first is deleting). A step-down in the moment of the delete answers CoordinatorNotFound: the next
        leader may have read the record already and tell that broker from memory; the same drop there
        answers TransactionNotFound, having started that txn's delivery again from the records."""
        async with self._dropping:
            return await self._drop_participant(least, participant)

    async def _drop_participant(self, least: int, participant: Participant | str) -> int:
        txn = f"({self.tc_id},{least})"
        outbox = self._undelivered.get(least)
        if self._stopped:
            raise CoordinatorNotFound(f"transaction coordinator {self.tc_id} is not led by this instance")
        if outbox is None or not (outbox.state.terminal or outbox.headerless):
            # Not terminal: held because its header is unreadable (_hold_undeliverable). Delivering the
            # others would tell them a decision nobody can read.
            raise InvalidTxnStatus(f"transaction {txn} has no decision waiting for its participants here")
        key = layout.txn_key(self.tc_id, least)
        record_key = participant if isinstance(participant, str) else participant.path(self.tc_id, least)
        named = f"record {record_key!r}" if isinstance(participant, str) else f"topic {participant.topic!r}" + (
            "" if participant.subscription is None else f" subscription {participant.subscription!r}")
        present = await self._store.get(record_key, partition_key=key) is not None
        # The delivery under way tells every participant together: stopped, and started over in any case
        # (should the delete fail, with every participant, or the txn would wait for a leadership change).
        # Also when the record is gone already: dropped at a leader that stepped down in that moment,
        # whose successor may have read it before, and tells that broker from memory.
        await _cancel_all(outbox.tasks)
        left: list[tuple[str, Participant]] | None = None
        unreadable: list[str] = []
        try:
            if not present:
                raise TransactionNotFound(f"transaction {txn} has no participant {named} (its delivery was "
                                          "started again from the participant records)")
            self._check_still_leading(least, "participant drop")
            await self._store.delete(record_key, partition_key=key)
            left, unreadable = await self._read_participants(least)
            self._log.warning("participant dropped by an operator: its broker is never told the decision",
                              txn=txn, participant=named,
                              decision="unknown" if outbox.headerless else outbox.state.value,
                              participants_left=len(left) + len(unreadable))
        finally:
            if self._undelivered.get(least) is outbox:
                if not outbox.headerless:
                    # From the records again while one cannot be read (_deliver holds the txn for it).
                    self._start_delivery(least, outbox.state, None if unreadable else left, outbox.decided_ms)
                elif left == [] and not unreadable:  # no decision to tell: held until the last is dropped
                    self._delivered(least, outbox)
                    if not outbox.done.done():  # a stop() meanwhile answered it
                        outbox.done.set_result(None)
        self._check_still_leading(least, "participant drop")
        return len(left) + len(unreadable)

    def undelivered(self) -> dict[int, int]:
        """least -> decision time (ms) of each decided txn still in the outbox here."""
        return {least: outbox.decided_ms for least, outbox in self._undelivered.items()}

    def told(self, least: int) -> AbstractSet[str]:
        """Record paths of the participants of an undelivered txn whose brokers acknowledged already (the live
        set: read it, do not keep it)."""
        outbox = self._undelivered.get(least)
        return outbox.told if outbox is not None and outbox.told is not None else frozenset()

    def _oldest_undelivered_s(self) -> float:
        if not self._undelivered:
            return 0.0
        oldest = min(outbox.decided_ms for outbox in self._undelivered.values())
        return max(0, self._clock() - oldest) / 1000


async def read_participant_records(store: MetadataStore, most: int, least: int,
                                   logger: Any) -> tuple[list[tuple[str, Participant]], list[str]]:
    """The participant records of a txn (docs/participants.md): (key and participant of each readable one, the
    keys of the unreadable ones, each logged on ``logger``). An unreadable record stays, and holds its txn in
    the outbox (_deliver) until an operator drops it by its key (admin "undelivered")."""
    found = []
    unreadable = []
    async for record in store.scan_prefix(layout.participants_prefix(most, least),
                                          partition_key=layout.txn_key(most, least)):
        try:
            found.append((record.key, Participant.from_json(record.value)))
        except ValueError as exc:
            logger.error("unreadable participant record", key=record.key, error=str(exc))  # noqa: TRY400 - damage, not a bug
            unreadable.append(record.key)
    return found, unreadable


def _compact(heap: list[int], live: Mapping[int, object]) -> None:
    """Rebuild ``heap`` from ``live`` when its stale entries dominate (ids ended since, which only its top
    is ever popped of: an old txn that stays open keeps every later one in)."""
    if len(heap) > 2 * len(live) + 1024:
        heap[:] = list(live)
        heapq.heapify(heap)


async def _cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until each has ended (a copy is taken: their done callbacks may change
    the collection they came from)."""
    cancelled = list(tasks)
    for task in cancelled:
        task.cancel()
    await asyncio.gather(*cancelled, return_exceptions=True)


def _smallest_except(heap: list[int], live: Mapping[int, object], excluded: int) -> int | None:
    """The smallest id of ``heap`` still in ``live`` other than ``excluded`` (which stays in ``heap``)."""
    _compact(heap, live)
    set_aside = 0
    while heap and (heap[0] == excluded or heap[0] not in live):
        if heapq.heappop(heap) == excluded:
            set_aside += 1
    smallest = heap[0] if heap else None
    for _ in range(set_aside):
        heapq.heappush(heap, excluded)
    return smallest


def _smallest(heap: list[int], live: Mapping[int, object]) -> int | None:
    """The smallest id of ``heap`` still in ``live``: stale tops are popped (after :func:`_compact`)."""
    _compact(heap, live)
    while heap and heap[0] not in live:
        heapq.heappop(heap)
    return heap[0] if heap else None
