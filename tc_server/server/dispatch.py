"""Requests to answers: routes each typed command to the coordinator and turns every failure into
the typed error response, in exactly one place (:func:`to_server_error`).

The transport (connection.py) knows nothing of transactions and the coordinator knows nothing of
commands; this module is the seam between them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from tc_server.coordinator.coordinator import TransactionCoordinator
from tc_server.coordinator.errors import CoordinatorError
from tc_server.coordinator.layout import Participant
from tc_server.logs import LogLimiter
from tc_server.metrics import Metrics
from tc_server.server import discovery
from tc_server.server.deadlines import RequestDeadlines
from tc_server.store.api import StoreClosedError, StoreError, StoreUnavailableError
from tc_server.wire import (
    AddPartitionToTxn,
    AddPartitionToTxnResponse,
    AddSubscriptionToTxn,
    AddSubscriptionToTxnResponse,
    EndTxn,
    EndTxnResponse,
    LookupResponse,
    LookupType,
    NewTxn,
    NewTxnResponse,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    ServerError,
    TcAssignment,
    TcAssignmentsSnapshot,
    TcClientConnect,
    TcClientConnectResponse,
    TxnAction,
)
from tc_server.wire import Lookup as LookupRequest

log = structlog.get_logger("tc_server.dispatch")

# The codes a txn request can be answered with; their series exist from the start.
EXPECTED_ERRORS = (
    ServerError.TransactionCoordinatorNotFound,
    ServerError.TransactionNotFound,
    ServerError.InvalidTxnStatus,
    ServerError.NotAllowedError,
    ServerError.MetadataError,
    ServerError.UnknownError,
)

TxnRequest = NewTxn | AddPartitionToTxn | AddSubscriptionToTxn | EndTxn
TxnResponse = NewTxnResponse | AddPartitionToTxnResponse | AddSubscriptionToTxnResponse | EndTxnResponse


def to_server_error(exc: BaseException, command: str) -> tuple[ServerError, str]:
    """The one mapping from an exception to a Pulsar error code and message."""
    if isinstance(exc, CoordinatorError):
        return ServerError[exc.server_error], str(exc) or type(exc).__name__
    if isinstance(exc, StoreUnavailableError | StoreClosedError | asyncio.TimeoutError | TimeoutError):
        # The Java client retries exactly this code with a fresh lookup, inside its op timeout
        # (TransactionMetaStoreHandler.checkIfNeedRetryByError); the request is idempotent for
        # END_TXN and harmless for NEW_TXN (a leaked id times out).
        if isinstance(exc, TimeoutError):
            # Not "store unavailable": the store may have done it (issue 15: ~47,000 such NEW_TXN had
            # created a txn). Say what is known; a txn created this way times out like any other.
            return ServerError.TransactionCoordinatorNotFound, (
                f"{command} not finished within the request timeout (--request-timeout-s); its outcome is "
                "unknown: a transaction it created times out unless ended")
        return ServerError.TransactionCoordinatorNotFound, f"metadata store unavailable: {exc!r}"
    if isinstance(exc, StoreError):
        return ServerError.MetadataError, f"metadata store error: {exc}"
    log.error("unexpected error", command=command, exc_info=exc)
    return ServerError.UnknownError, f"internal error: {type(exc).__name__}"


class Dispatcher:
    def __init__(
        self,
        coordinator: TransactionCoordinator,
        metrics: Metrics,
        request_timeout_s: float,
        participant_wait_s: float = 25.0,
    ) -> None:
        self.coordinator = coordinator
        self.metrics = metrics
        self.request_timeout_s = request_timeout_s
        self._deadlines = RequestDeadlines(request_timeout_s)
        self._log_limiter = LogLimiter(interval_s=1.0)  # "request failed" lines, per command and error
        self._early_answers_log = LogLimiter(interval_s=1.0)  # END_TXN answered before its participants
        # END_TXN answers once every participant broker acknowledged the decision, or after this long
        # (the decision is durable either way; docs/participants.md).
        self.participant_wait_s = participant_wait_s
        self._participant_deadlines = RequestDeadlines(participant_wait_s)
        self._stopping = False  # the server stops: END_TXN no longer waits for the participants
        commands = ("NEW_TXN", "ADD_PARTITION_TO_TXN", "ADD_SUBSCRIPTION_TO_TXN", "END_TXN")
        self._observe = {name: metrics.request_seconds.labels(name).observe for name in commands}
        for name in commands:
            for error in EXPECTED_ERRORS:
                metrics.request_errors.labels(name, error.name)

    # -- discovery (answered synchronously) ----------------------------------------------------

    def partitioned_metadata(self, cmd: PartitionedMetadata) -> PartitionedMetadataResponse:
        """The assign topic has one partition per coordinator; one of its partitions is not partitioned."""
        if discovery.is_assign_topic(cmd.topic):
            return PartitionedMetadataResponse(cmd.request_id, partitions=self.coordinator.num_partitions)
        return PartitionedMetadataResponse(cmd.request_id, partitions=0)

    def lookup(self, cmd: LookupRequest) -> LookupResponse:
        tc_id = discovery.assign_partition(cmd.topic)
        if tc_id is None or tc_id >= self.coordinator.num_partitions:
            return LookupResponse(
                cmd.request_id, LookupType.FAILED, error=ServerError.TopicNotFound,
                message=f"{cmd.topic}: there are {self.coordinator.num_partitions} transaction coordinators",
            )
        url = self.coordinator.leader_url(tc_id)
        if url is None:
            # MetadataError, not ServiceNotReady, on which the Java client closes the whole connection
            # (ClientCnx.checkServerError): the coordinator handlers Ready on it reconnected, and each failure
            # doubled a handler's backoff, up to 60 s, in the moments of a hand-over (a review of rolling
            # restarts). Forwarded lookups are answered the same way (upstream.py).
            return LookupResponse(
                cmd.request_id, LookupType.FAILED, error=ServerError.MetadataError,
                message=f"transaction coordinator {tc_id} has no leader yet; retry",
            )
        return LookupResponse(cmd.request_id, LookupType.CONNECT, broker_service_url=url,
                              broker_service_url_tls=self.coordinator.tls_url(url), authoritative=True)

    def not_served(self, cmd: PartitionedMetadata | LookupRequest) -> PartitionedMetadataResponse | LookupResponse:
        """A topic that is not the coordinator's, with no upstream broker to forward it to."""
        message = f"{cmd.topic}: {discovery.NOT_SERVED}"
        if isinstance(cmd, PartitionedMetadata):
            return PartitionedMetadataResponse(cmd.request_id, error=ServerError.TopicNotFound, message=message)
        return LookupResponse(cmd.request_id, LookupType.FAILED, error=ServerError.TopicNotFound, message=message)

    def tc_client_connect(self, cmd: TcClientConnect) -> TcClientConnectResponse:
        if self.coordinator.leads(cmd.tc_id):
            return TcClientConnectResponse(cmd.request_id)
        leader = self.coordinator.leader_url(cmd.tc_id)
        where = f"; its leader is {leader}" if leader else ""
        return TcClientConnectResponse(
            cmd.request_id,
            error=ServerError.TransactionCoordinatorNotFound,
            message=f"transaction coordinator {cmd.tc_id} is not led by this instance{where}",
        )

    def assignments_snapshot(self, leaders: dict[int, str] | None = None) -> TcAssignmentsSnapshot:
        """WATCH_TC_ASSIGNMENTS' answer: the full map every time (PIP-473); a coordinator in
        mid-election is just missing."""
        leaders = self.coordinator.assignments() if leaders is None else leaders
        return TcAssignmentsSnapshot(
            parallelism=self.coordinator.num_partitions,
            assignments=tuple(TcAssignment(tc_id, url, self.coordinator.tls_url(url))
                              for tc_id, url in sorted(leaders.items())),
        )

    # -- transaction requests (awaited; many in flight per connection) -------------------------

    async def transaction(self, cmd: TxnRequest, principal: str | None, superuser: bool = False,
                          conn_log: Any = log) -> TxnResponse:
        """Serve one txn request, as ``principal`` (a superuser acts on any txn); never raises. A failure is
        logged to ``conn_log``, the connection's logger (its peer, role and client bound). The
        response always carries txnid_most_bits = tcId, errors included: the Java client routes
        responses by it and closes the connection on an unknown one (pulsar-protocol.md §3, Routing)."""
        started = time.perf_counter()
        name, response_type = _KINDS[type(cmd)]
        if isinstance(cmd, NewTxn):  # _txn_id, inlined: a call less per request (issue 13)
            most, least = cmd.tc_id, 0
        else:
            most, least = cmd.most, cmd.least
        error: ServerError | None = None
        message: str | None = None
        delivery: asyncio.Future[None] | None = None  # END_TXN: its decision's delivery, while under way
        try:
            with self._deadlines.bound(name):
                # The partition's coroutine is awaited right here, not through a helper per command:
                # each coroutine layer is resumed on every step of the request (profiled, issue 13).
                partition = self.coordinator.partition(most)
                if isinstance(cmd, NewTxn):
                    least = await partition.new_txn(cmd.ttl_ms, principal)
                elif isinstance(cmd, EndTxn):
                    delivery = await partition.end_txn(least, commit=cmd.action is TxnAction.COMMIT,
                                                       principal=principal, superuser=superuser)
                else:
                    await partition.add_participants(least, principal, _participants(cmd), superuser=superuser)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a typed answer
            error, message = to_server_error(exc, name)
            self.metrics.request_errors.labels(name, error.name).inc()
            # At most one line per command and error per second: a client can fail requests at will
            # (issue 15, log amplification); tc_server_request_errors_total counts every one.
            if (left_out := self._log_limiter.allow(f"{name}:{error.name}")) is not None:
                conn_log.info("request failed", command=name, request_id=cmd.request_id, txn=f"({most},{least})",
                         error=error.name, message=message, left_out_since_last_line=left_out)
            # A fact for /readyz (tc_server/health.py), and a deadline passed is one too: a store whose
            # writes never complete (a stalled disk, a hung writer process) raises nothing, requests just
            # run out of time.
            if isinstance(exc, StoreUnavailableError | TimeoutError):
                self.coordinator.health.failed("metadata store", message)
        else:
            # Only a NEW_TXN, which always writes its header, clears it: a request that writes nothing
            # (a repeated ADD) succeeds while every write hangs. Cleared at once, not after a window: a
            # sidecar's readiness is its broker pod's, which one transient store error must not take out
            # of its Service for long.
            if type(cmd) is NewTxn:
                self.coordinator.health.recovered("metadata store")
            if delivery is not None:
                await self._wait_delivered(delivery, most, least)
        self._observe[name](time.perf_counter() - started)
        return response_type(cmd.request_id, most, least, error, message)

    @staticmethod
    def error_response(cmd: TxnRequest, error: ServerError, message: str) -> TxnResponse:
        """``cmd``'s typed response carrying ``error`` (txnid_most_bits set: the Java client routes on it)."""
        return _KINDS[type(cmd)][1](cmd.request_id, *_txn_id(cmd), error, message)

    def failures_left_out(self) -> dict[str, int]:
        """Failed requests not logged one by one since their kind's last "request failed" line ("COMMAND:ERROR"
        -> count): the stop's summary, for requests the stop itself cut."""
        return self._log_limiter.left_out()

    def stop_waiting_for_participants(self) -> None:
        """The server stops: END_TXN answers without waiting for the participants' acknowledgements, those
        waiting now at once (see :meth:`_wait_delivered`), so that draining the connections answers them."""
        self._stopping = True
        self._participant_deadlines.expire_all()

    def expire_requests(self) -> None:
        """The stop's drain ends before the requests' own deadlines (--request-timeout-s above DRAIN_MAX_S):
        every request in flight sees its deadline now and is answered (TransactionCoordinatorNotFound,
        outcome unknown: the client retries elsewhere) rather than closed unanswered."""
        self._deadlines.expire_all()

    async def _wait_delivered(self, delivery: asyncio.Future[None], most: int, least: int) -> None:
        """As Pulsar's own coordinator does, answer END_TXN once every participant broker acknowledged,
        so that consumers see a commit once commit() returns; outside the request timeout, which
        bounds the decision only. Past participant_wait_s (below the Java client's 30 s operation
        timeout; a shared deadline tick, so up to 0.1 s more), or once the server stops, answer anyway:
        the decision is durable and delivery goes on."""
        if delivery.done():
            return
        if self.participant_wait_s > 0 and not self._stopping:
            try:
                await self._participant_deadlines.wait(delivery, "the participants' acknowledgements")
                return
            except TimeoutError:
                pass
        # One line a second: a participant broker that is down makes every commit that involves it wait
        # here, and the delivery's own failure lines (participants/delivery.py) say why.
        reason = "stopping" if self._stopping else f"waited participant_wait_s={self.participant_wait_s}"
        if (left_out := self._early_answers_log.allow(reason)) is not None:
            log.info("answering END_TXN before every participant acknowledged; delivery continues",
                     txn=f"({most},{least})", reason=reason, left_out_since_last_line=left_out)


def _txn_id(cmd: TxnRequest) -> tuple[int, int]:
    """The (most, least) a request's answer carries: NEW_TXN has no txn yet, only its coordinator."""
    return (cmd.tc_id, 0) if isinstance(cmd, NewTxn) else (cmd.most, cmd.least)


# The topics of Pulsar 5's metadata-backed transaction buffer: their brokers read the decision from the
# store (PIP-473), nobody tells them. persistent:// topics keep the legacy buffer in 5.x too, which waits
# for END_TXN_ON_PARTITION / _SUBSCRIPTION (non-persistent:// ones have none: the partition refuses them).
_SCALABLE_TOPIC_SCHEMES = ("segment://", "topic://")


def _participants(cmd: AddPartitionToTxn | AddSubscriptionToTxn) -> tuple[Participant, ...]:
    """What an ADD_* records: the participants that must be told the decision. A scalable command
    (the v5 SDK, or a 4.x client with scalableTransactions) records only its legacy topics: its
    segment:// and topic:// participants read the decision from the store. Not by the flag alone: a
    persistent:// partition added by such a client would never be told, and stay pinned."""
    if isinstance(cmd, AddPartitionToTxn):
        found = tuple(Participant(topic) for topic in cmd.partitions)
    else:
        found = tuple(Participant(s.topic, s.subscription) for s in cmd.subscriptions)
    if cmd.scalable:
        return tuple(p for p in found if not p.topic.startswith(_SCALABLE_TOPIC_SCHEMES))
    return found


# Each txn request type's metric label and response type, looked up once per request.
_KINDS: dict[type, tuple[str, type[TxnResponse]]] = {
    NewTxn: ("NEW_TXN", NewTxnResponse),
    AddPartitionToTxn: ("ADD_PARTITION_TO_TXN", AddPartitionToTxnResponse),
    AddSubscriptionToTxn: ("ADD_SUBSCRIPTION_TO_TXN", AddSubscriptionToTxnResponse),
    EndTxn: ("END_TXN", EndTxnResponse),
}
