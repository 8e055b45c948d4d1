"""Telling today's brokers a decision: END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION (docs/participants.md).

One job: given a participant (a partition topic, or a topic and subscription), a txn id, the decision
and the coordinator's low watermark, find the broker owning the topic (LOOKUP through the upstream,
following redirects: :func:`tc_server.server.upstream.follow_lookup`), send the command on a pooled
connection opened with tc-server's own broker credential (brokers accept these commands from a
superuser only), and return once the broker acknowledged. Never gives up: the decision stands, and a
broker that is not told keeps the partition's read horizon pinned.

- Retryable answers (ServiceNotReady, a timeout, a closed connection, a failed lookup) are retried with
  backoff and a fresh lookup; a non-retryable one (e.g. TransactionNotFound "... is not a super user")
  is logged with the broker and the error, counted, and retried slowly.
- Deliveries to one topic share one lookup, and failures are logged at most once a second per command and
  error: while a broker is down, every decision owed to its partitions retries, and each used to send
  the upstream a lookup and the log a line of its own each round.
- Requests in flight are bounded overall and per broker: Pulsar's own coordinator got stuck with an
  unbounded queue of these (apache/pulsar#23550).
- A standalone broker answers LOOKUP with proxy_through_service_url=true; tc-server is not a client
  behind a proxy, so it connects to the broker URL in the answer all the same.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

import structlog

from tc_server.backoff import Backoff
from tc_server.client import (
    BrokerError,
    ClientError,
    ConnectionClosed,
    ConnectionFailed,
    ConnectionPool,
    HandshakeRefused,
    PulsarConnection,
    error_of,
    is_retryable,
)
from tc_server.config import speaks_tls
from tc_server.coordinator.layout import Participant
from tc_server.logs import LogLimiter
from tc_server.metrics import Metrics
from tc_server.server.deadlines import RequestDeadlines
from tc_server.server.upstream import follow_lookup
from tc_server.wire import (
    EndTxnOnPartition,
    EndTxnOnSubscription,
    Lookup,
    LookupResponse,
    LookupType,
    ServerError,
    Subscription,
    TxnAction,
)

log = structlog.get_logger("tc_server.delivery")

# Retryable failures: first retry after 100 ms, doubling up to 5 s. Pulsar's own coordinator retries
# every 1 s; starting faster matters because END_TXN waits for the acknowledgements.
RETRY_INITIAL_S = 0.1
RETRY_MAX_S = 5.0
# A non-retryable answer (a refused credential, a topic the broker will not serve): the decision
# stands, so keep trying, slowly, until an operator fixes the cause.
NON_RETRYABLE_RETRY_S = 30.0
# A delivery still failing after this long (the backoff at its longest) is said at warning, not info: a topic
# moving between brokers is retried away within it, unseen at --log-level warning; a broker that stays
# unreachable is an incident (docs/alerts.md, TcServerDecisionsUndelivered).
FAILING_WARN_AFTER_S = RETRY_MAX_S
# Topics whose owner is remembered, and the bytes of their names; past either the memory is dropped and refilled
# by fresh lookups. The bytes too: 100,000 names of 2 KB (the longest a txn may record) were ~200 MB, and a client
# naming new topics in namespaces that create them on lookup fills it (a review). Names of 60 bytes reach the
# count first.
MAX_REMEMBERED_OWNERS = 100_000
MAX_REMEMBERED_OWNER_BYTES = 16 * 1024 * 1024
PARTITION_COMMAND = "END_TXN_ON_PARTITION"
SUBSCRIPTION_COMMAND = "END_TXN_ON_SUBSCRIPTION"


class _SharedLookup:
    """The lookup of one topic under way, and how many deliveries wait for it (BrokerDelivery._owner)."""

    __slots__ = ("task", "waiters")

    def __init__(self, task: asyncio.Task[str]) -> None:
        self.task = task
        self.waiters = 0


class BrokerDelivery:
    """Implements the coordinator's ParticipantSender over the Pulsar protocol."""

    def __init__(self, upstream_urls: list[str], pool: ConnectionPool, *, request_timeout_s: float,
                 max_in_flight: int, max_in_flight_per_broker: int, metrics: Metrics) -> None:
        if not upstream_urls:
            raise ValueError("delivering decisions needs at least one upstream URL")
        self._urls = list(upstream_urls)
        self._preferred = 0  # the index of the upstream URL lookups go to first (_pass_over)
        self._use_tls = speaks_tls(upstream_urls)
        self._pool = pool
        # One timer per 100 ms of requests rather than an asyncio.timeout() each (~5 us, issue 13).
        self._deadlines = RequestDeadlines(request_timeout_s)
        self._overall = asyncio.Semaphore(max_in_flight)
        # Lookups under way at once (each a topic's, shared by every delivery to it): a bound of their own. Under
        # _overall, every delivery waiting for one topic's slow lookup held a slot, and 1,000 of them stalled the
        # deliveries to every other broker (a review).
        self._lookup_gate = asyncio.Semaphore(max_in_flight)
        self._per_broker_limit = max_in_flight_per_broker
        self._per_broker: dict[str, asyncio.Semaphore] = {}
        # topic -> broker URL of its last successful lookup; dropped on any failure (fresh lookup).
        self._owners: dict[str, str] = {}
        # The bytes of the topic names and URLs remembered there.
        self._owner_bytes = 0
        # topic -> the lookup under way, which every delivery to that topic waits for (_owner).
        self._lookups: dict[str, _SharedLookup] = {}
        # Failure lines, keyed by command and error: one per second, with how many were left out.
        self._log_limiter = LogLimiter(interval_s=1.0)
        self._requests = metrics.participant_requests
        # The success counters resolved once: labels() costs microseconds per call (profiled).
        self._acknowledged = {command: self._requests.labels(command, "ok")
                              for command in (PARTITION_COMMAND, SUBSCRIPTION_COMMAND)}

    async def end_txn_on(self, participant: Participant, most: int, least: int, committed: bool,
                         low_watermark: Callable[[], int]) -> None:
        """Return once the broker owning the participant acknowledged the decision."""
        command = _command_of(participant)
        backoff: Backoff | None = None  # made at the first failure: most deliveries succeed at once
        failing_since = 0.0  # loop time of the first failure, once there is one
        while True:
            broker: str | None = None
            try:
                await self._attempt(participant, most, least, committed, low_watermark, command)
            except (ClientError, TimeoutError) as exc:
                broker = self._owners.get(participant.topic)  # known once its lookup succeeded
                now = asyncio.get_running_loop().time()
                if backoff is None:
                    backoff = Backoff(RETRY_INITIAL_S, RETRY_MAX_S)
                    failing_since = now
                self._forget_owner(participant.topic)
                outcome = _outcome(exc)
                self._requests.labels(command, outcome).inc()
                # Cut: a name is up to 2,048 bytes, and a line per failure of each is what the limiter is for.
                where = {"txn": f"({most},{least})", "topic": participant.topic[:200], "broker": broker,
                         "error": (str(exc) or type(exc).__name__)[:300]}
                if participant.subscription is not None:
                    where["subscription"] = participant.subscription[:200]
                retryable = isinstance(exc, TimeoutError) or is_retryable(exc)
                # Per broker, never per topic: a client naming a new topic no broker knows in every txn got a
                # line per txn, every NON_RETRYABLE_RETRY_S, for good (9,220 lines for 30,000 txns; a review),
                # and a key per topic was never forgotten. Every one: admin "undelivered".
                left_out = self._log_limiter.allow(f"{command}:{outcome}:{broker}")
                failing_s = now - failing_since
                if left_out is not None and retryable and failing_s < FAILING_WARN_AFTER_S:
                    log.info(f"{command} failed; retrying", left_out_since_last_line=left_out, **where)
                elif left_out is not None and retryable:
                    log.warning(f"{command} failing for {failing_s:.0f} s; the decision stands, retrying: check that "
                                "broker and the route to it (--upstream-url, its lookups)",
                                left_out_since_last_line=left_out, **where)
                elif left_out is not None:
                    log.warning(f"{command} refused by the broker; the decision stands, retrying slowly (every "
                                "decision not delivered: GET /admin/v3/transactions/undelivered)",
                                retry_in_s=NON_RETRYABLE_RETRY_S, left_out_since_last_line=left_out, **where)
                delay = backoff.next_delay() if retryable else NON_RETRYABLE_RETRY_S
            else:
                self._acknowledged[command].inc()
                return
            # Slept outside the except clause: inside it, the exception and its traceback (the frames of the
            # failed attempt) stayed alive for the whole wait, per undelivered participant.
            await asyncio.sleep(delay)

    async def remind_txn_on(self, participant: Participant, most: int, least: int, committed: bool,
                            low_watermark: Callable[[], int]) -> bool:
        """One attempt to tell the participant's broker a decision it acknowledged before (the ABORT reminder,
        tc_server/coordinator/partition.py): True once acknowledged. A failure is counted, logged at info at
        most once a second, and not retried: the decision was delivered, this is best effort."""
        command = _command_of(participant)
        try:
            await self._attempt(participant, most, least, committed, low_watermark, command)
        except (ClientError, TimeoutError) as exc:
            self._forget_owner(participant.topic)
            outcome = _outcome(exc)
            self._requests.labels(command, outcome).inc()
            if (left_out := self._log_limiter.allow(f"reminder:{command}:{outcome}")) is not None:
                log.info(f"{command} sent again after its delivery failed; not retried", txn=f"({most},{least})",
                         topic=participant.topic, error=str(exc) or type(exc).__name__,
                         left_out_since_last_line=left_out)
            return False
        self._acknowledged[command].inc()
        return True

    async def _attempt(self, participant: Participant, most: int, least: int, committed: bool,
                       low_watermark: Callable[[], int], command: str) -> None:
        """Look the participant's broker up (unless known: _owners) and send it the decision once. Raises
        ClientError or TimeoutError."""
        # The deadlines bound the lookup and the request, not the wait for a slot under the
        # gates: a queue of decisions is not a broker failure.
        broker = self._owners.get(participant.topic)
        if broker is None:  # a remembered owner needs no lookup
            broker = await self._owner(participant.topic)
        # The broker's own gate first, and an overall slot only inside it: a delivery queued
        # for a broker that does not answer must not hold a slot the others need.
        async with self._broker_gate(broker), self._overall:
            with self._deadlines.bound(command):
                await self._send(broker, participant, most, least, committed, low_watermark())

    def _broker_gate(self, broker: str) -> asyncio.Semaphore:
        gate = self._per_broker.get(broker)
        if gate is None:
            gate = self._per_broker[broker] = asyncio.Semaphore(self._per_broker_limit)
        return gate

    async def _owner(self, topic: str) -> str:
        """The URL of the broker that owns ``topic``, from the lookup under way for it if there is one, else
        from a new one. Raises ClientError (BrokerError for a failed lookup), TimeoutError past the
        lookup's deadline."""
        shared = self._lookups.get(topic)
        if shared is None:
            task = asyncio.create_task(self._gated_look_up(topic), name=f"lookup {topic}")
            shared = self._lookups[topic] = _SharedLookup(task)
            task.add_done_callback(functools.partial(self._lookup_done, topic, shared))
        shared.waiters += 1
        try:
            # Shielded: one delivery cancelled while it waits does not end the others' lookup.
            return await asyncio.shield(shared.task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this delivery was cancelled (a stop, a step-down)
            # The lookup was, and not this delivery: a failure to retry, never a delivery that ends
            # quietly with its participant untold.
            raise ConnectionClosed(self._urls[self._preferred], f"the lookup of {topic} was cancelled") from None
        finally:
            shared.waiters -= 1
            if not shared.waiters and not shared.task.done():
                # Every delivery waiting for it was cancelled: so is the lookup. It ran on untracked to its
                # own deadline before, past the partition's stop(), and then passed over the upstream URL
                # for every later lookup. Forgotten now, so that a delivery arriving meanwhile starts anew.
                del self._lookups[topic]
                shared.task.cancel()

    def _lookup_done(self, topic: str, shared: _SharedLookup, lookup: asyncio.Task[str]) -> None:
        if self._lookups.get(topic) is shared:
            del self._lookups[topic]
        if not lookup.cancelled():
            lookup.exception()  # retrieved here too: with every waiter gone, asyncio would log it as lost

    async def _gated_look_up(self, topic: str) -> str:
        async with self._lookup_gate:
            return await self._look_up(topic)

    async def _look_up(self, topic: str) -> str:
        asking: list[str] = []  # the upstream URL being connected to or asked (_upstream_connection)
        try:
            # The lookup's own deadline, not its waiters': one of them giving up must not end it for the rest.
            with self._deadlines.bound(f"the lookup of {topic}"):
                conn, url = await self._upstream_connection(asking)
                try:
                    answer, _ = await follow_lookup(conn, Lookup(topic, 0), self._pool.get, use_tls=self._use_tls,
                                                    request_id_for=lambda c: c.next_request_id())
                except ClientError:
                    self._pass_over(url)
                    raise
        except TimeoutError:
            # Past its deadline while connecting to or asking that URL (a host that is gone, a hung broker).
            # A lookup cancelled because nobody waits for it any more (_owner) passes over nothing.
            if asking:
                self._pass_over(asking[-1])
            raise
        failure = error_of(answer)
        if failure is not None:
            raise BrokerError(url, failure[0], f"lookup of {topic}: {failure[1]}")
        if not isinstance(answer, LookupResponse) or answer.response is not LookupType.CONNECT:
            raise BrokerError(url, ServerError.ServiceNotReady,
                              f"lookup of {topic} ended without a broker: {answer}")
        owner = answer.broker_service_url_tls if self._use_tls else answer.broker_service_url
        if not owner:
            raise BrokerError(url, ServerError.ServiceNotReady, f"lookup of {topic} named no broker URL")
        if self._use_tls and not owner.startswith("pulsar+ssl://"):
            # As follow_lookup refuses such a redirect: the brokers are reached over TLS, and this URL is not.
            raise BrokerError(url, ServerError.ServiceNotReady, f"lookup of {topic} named {owner[:256]!r} in its TLS "
                              "field, not a pulsar+ssl:// URL (the broker's advertised listeners?)")
        if len(self._owners) >= MAX_REMEMBERED_OWNERS or self._owner_bytes >= MAX_REMEMBERED_OWNER_BYTES:
            self._owners.clear()
            self._owner_bytes = 0
        self._forget_owner(topic)  # one remembered already (a lookup cancelled as it ended): counted once
        self._owners[topic] = owner
        self._owner_bytes += len(topic) + len(owner)
        return owner

    def _forget_owner(self, topic: str) -> None:
        """Drop ``topic``'s remembered owner (its next delivery looks it up again)."""
        owner = self._owners.pop(topic, None)
        if owner is not None:
            self._owner_bytes -= len(topic) + len(owner)

    async def _upstream_connection(self, asking: list[str]) -> tuple[PulsarConnection, str]:
        """A connection to the upstream URL that answered last, else the next ones in turn; each URL is
        appended to ``asking`` as it is tried."""
        last: ClientError | None = None
        for attempt in range(len(self._urls)):
            url = self._urls[(self._preferred + attempt) % len(self._urls)]
            asking.append(url)
            try:
                conn = await self._pool.get(url)
            except (ConnectionFailed, HandshakeRefused) as exc:
                last = exc
                self._pass_over(url)
                continue
            return conn, url
        assert last is not None
        raise last

    def _pass_over(self, url: str) -> None:
        """A lookup at upstream ``url`` failed (refused, unanswered within its deadline, a hung broker
        that still answers PING): the next lookups go to the next URL first. Before, every lookup went
        to the first URL, and one that took connections but answered no lookup held every delivery."""
        if self._urls[self._preferred] == url:
            self._preferred = (self._preferred + 1) % len(self._urls)

    async def _send(self, broker: str, participant: Participant, most: int, least: int, committed: bool,
                    low_watermark: int) -> None:
        conn = await self._pool.get(broker)
        action = TxnAction.COMMIT if committed else TxnAction.ABORT
        request_id = conn.next_request_id()
        if participant.subscription is None:
            request: EndTxnOnPartition | EndTxnOnSubscription = EndTxnOnPartition(
                request_id, most, least, participant.topic, action, low_watermark)
        else:
            request = EndTxnOnSubscription(request_id, most, least,
                                           Subscription(participant.topic, participant.subscription),
                                           action, low_watermark)
        answer = await conn.request(request)
        failure = error_of(answer)
        if failure is not None:
            raise BrokerError(broker, failure[0], failure[1])


def _command_of(participant: Participant) -> str:
    """The command that tells ``participant`` a decision (a partition's, or a subscription's)."""
    return PARTITION_COMMAND if participant.subscription is None else SUBSCRIPTION_COMMAND


def _outcome(exc: ClientError | TimeoutError) -> str:
    """A failed attempt's outcome label of tc_server_participant_requests_total: the broker's error, or the
    failure's kind."""
    return exc.error.name if isinstance(exc, BrokerError | HandshakeRefused) else type(exc).__name__
