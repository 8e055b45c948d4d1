"""Admin endpoints: probes, Prometheus, and the ``/admin/v3/transactions`` reads that
``pulsar-admin transactions`` uses (pulsar-protocol.md §6), plus a force-abort (apache/pulsar#19786), the
outbox listing and the drop of a participant that can never be told (docs/participants.md).

aiohttp handlers; who may call which is decided before them, in tc_server/admin/http.py.
"""

from __future__ import annotations

import asyncio
import heapq
import json
from collections.abc import AsyncIterator, Iterable
from collections.abc import Set as AbstractSet
from typing import TypeVar
from urllib.parse import urlencode

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tc_server.auth.certificates import ServerTlsContext
from tc_server.coordinator import events, layout
from tc_server.coordinator.coordinator import TransactionCoordinator
from tc_server.coordinator.errors import CoordinatorNotFound, InvalidTxnStatus, StoreCorrupted, TransactionNotFound
from tc_server.coordinator.layout import TxnHeader, TxnState
from tc_server.coordinator.partition import CoordinatorPartition, read_participant_records
from tc_server.metrics import (
    HAS_LEADER,
    HAS_LEADER_HELP,
    TC_LABELS,
    Metrics,
    ScrapedGauge,
    build_info,
    process_series,
    ready_gauge,
    tls_certificate_expiry,
)
from tc_server.store.api import Record, StoreError

log = structlog.get_logger("tc_server.admin")

_T = TypeVar("_T")

PREFIX = "/admin/v3/transactions"
READY_PROBE_TIMEOUT_S = 2.0
# Any path segment: a bad number is answered 400 naming the parameter (see number()), not 404.
_ID = r"{%s:[^/]+}"
# Txn id halves are Java longs in Pulsar (TxnID), and so are timeouts in ms.
MAX_LONG = 2**63 - 1
# Listings that grow with the open or undelivered txns answer one page (issue 15: slowTransactions with
# 200,000 open built a 37 MB answer, 1.47 GB for 8 at once). ?limit= entries (~250 B of JSON each), in
# txn id order after ?after=(most,least); the rest is named by the X-Next-After and Link headers, so the
# body keeps the shape Pulsar's admin returns (a map of txn id -> TransactionMetadata for
# slowTransactions) and pulsar-admin reads the first page unchanged.
DEFAULT_PAGE = 1000
MAX_PAGE = 10_000
# A page is the smallest ids of one scan of the index: scans at once (the rest wait), so that many
# concurrent listings cannot take every turn of the event loop from the coordinators.
LISTING_SCANS = 2
# Index records read between two turns of the event loop (a store that answers without suspending).
LISTING_YIELD_EVERY = 1000
NEXT_HEADER = "X-Next-After"
# The participants of the txns of one page of slowTransactions are read this many txns at a time (one or two
# store scans each).
PARTICIPANT_READS = 16
# The transactions paths a broker serves from its own topics' state (transaction buffers, pending acks):
# answered 404 saying so, not "no such endpoint".
BROKER_SIDE_PATHS = ("transactionInBufferStats", "transactionInPendingAckStats", "transactionBufferStats",
                     "pendingAckStats", "pendingAckInternalStats", "positionStatsInPendingAck")


def number(text: str, name: str, maximum: int = MAX_LONG, minimum: int = 0) -> int:
    """A decimal parameter from ``minimum`` to ``maximum``, or 400 naming it (issue 15: '²' passes
    str.isdigit() and breaks int(); Unicode digits would be read by int(); 5,000 digits break it)."""
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(maximum))) or not (
            minimum <= int(text) <= maximum):
        # ascii(): the reason also goes into the status line, which must stay ASCII.
        raise web.HTTPBadRequest(
            reason=f"{name}: expected a number from {minimum} to {maximum}, got {ascii(text[:40])}")
    return int(text)


def json_response(status: int, doc: object) -> web.Response:
    return web.json_response(doc, status=status, dumps=lambda d: json.dumps(d, separators=(",", ":")))


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """``registry`` in Prometheus' text format."""
    # CONTENT_TYPE_LATEST carries a charset, which aiohttp's content_type argument refuses.
    return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


def txn_id(most: int, least: int) -> str:
    """Pulsar's ``TxnID.toString()``: the keys of its admin maps."""
    return f"({most},{least})"


def parse_txn_id(text: str, name: str) -> tuple[int, int]:
    """``(most,least)`` (or ``most,least``), each half a number from 0 to a Java long, or 400 naming ``name``."""
    inner = text[1:-1] if text.startswith("(") and text.endswith(")") else text
    most, sep, least = inner.partition(",")
    if not sep:
        raise web.HTTPBadRequest(reason=f"{name}: expected a transaction id (most,least), got {ascii(text[:40])}")
    return number(most, name), number(least, name)


def page_parameters(request: web.Request) -> tuple[int, tuple[int, int] | None]:
    """``?limit=`` (1 to MAX_PAGE, default DEFAULT_PAGE) and ``?after=(most,least)``; 400 naming a bad one."""
    limit_text = request.query.get("limit")
    limit = DEFAULT_PAGE if limit_text is None else number(limit_text, "limit", MAX_PAGE, minimum=1)
    after_text = request.query.get("after")
    return limit, None if after_text is None else parse_txn_id(after_text, "after")


def paged(response: web.Response, request: web.Request, last: tuple[int, int] | None) -> web.Response:
    """Name the next page when this one is full and more may follow: ``X-Next-After`` (the value for
    ``?after=``) and an RFC 8288 ``Link: <...>; rel="next"``. No header: this was the last page."""
    if last is not None:
        after = txn_id(*last)
        query = {**request.query, "after": after}
        response.headers[NEXT_HEADER] = after
        response.headers["Link"] = f'<{request.path}?{urlencode(query)}>; rel="next"'
    return response


# Pulsar's TransactionMetadata maps: topic -> TransactionInBufferStats, topic -> subscription ->
# TransactionInPendingAckStats. The stats live on the brokers: each value here is an empty object.
Produced = dict[str, dict[str, object]]
Acked = dict[str, dict[str, dict[str, object]]]


def txn_metadata(most: int, least: int, header: TxnHeader, produced: Produced, acked: Acked) -> dict[str, object]:
    """Pulsar's ``TransactionMetadata`` shape; ``timeoutAt`` is the relative timeout, as Pulsar fills it."""
    return {
        "txnId": f"({most},{least})",
        "status": header.state.value,
        "openTimestamp": header.created_ms,
        "timeoutAt": header.timeout_ms,
        "finalizedTimestamp": header.finalized_ms,
        "producedPartitions": produced,
        "ackedPartitions": acked,
        "owner": header.owner,
    }


def _low_watermark(partition: CoordinatorPartition) -> int:
    """The lowest txn held here (open, or decided but not yet told to its brokers) minus one; 0 with none,
    as Pulsar's getLowWaterMark."""
    held = partition.lowest_held()
    return 0 if held is None else held - 1


class StartingRoutes:
    """The admin port while the start waits for a store that does not answer yet (app.open_store_waiting):
    the process lives (/healthz 200), and is not ready (/readyz 503 naming the store's last error)."""

    def __init__(self, cluster: str, coordinators: int, tls: ServerTlsContext | None = None) -> None:
        self.problem = "waiting for the metadata store"
        # tc_server_ready (0) and build_info: a scrape meanwhile finds an instance that is not ready, not one that is
        # down (a failed scrape), and the alert rules say which (deploy/prometheus/alerts.yml). And no leader known
        # from here for any coordinator: when every instance of a cluster waits (Oxia down, a wrong address),
        # TcServerCoordinatorWithoutLeader fires, and the dashboard lists the cluster and its instances.
        self._registry = CollectorRegistry(auto_describe=True)
        ready_gauge(self._registry).set(0)
        build_info(self._registry)
        process_series(self._registry)
        unknown = ScrapedGauge(HAS_LEADER, HAS_LEADER_HELP, TC_LABELS, self._registry)
        unknown.read = lambda: [((cluster, str(tc_id)), 0.0) for tc_id in range(coordinators)]
        if tls is not None:
            # Its certificate is served meanwhile: the expiry alerts were blind to an instance that waited long
            # for Oxia (a review).
            tls_certificate_expiry(self._registry).read = tls.expiry_samples

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response(200, {"status": "starting"})

    async def readyz(self, request: web.Request) -> web.Response:
        return json_response(503, {"ready": False, "problems": [self.problem]})

    async def metrics(self, request: web.Request) -> web.Response:
        return metrics_response(self._registry)

    def stopping(self) -> None:
        """Not ready already."""


class AdminRoutes:
    """``other_admin_ports``: with --workers, tc_id -> the admin port of the worker that leads it, for the
    coordinators another worker leads. A request about one of them is redirected there (307, as a broker
    redirects to a topic's owner, and PulsarAdmin follows): on the embedded store this worker's store does
    not hold them, and it would answer "not found" for a transaction that exists. ``own_coordinators``: with
    --workers, the coordinators this worker leads, which its ``undelivered`` lists without ``coordinatorId``
    (on Oxia every worker reads every coordinator's records, but only a coordinator's leader knows which of its
    participants acknowledged; the supervisor merges the workers' listings)."""

    def __init__(self, coordinator: TransactionCoordinator, metrics: Metrics,
                 other_admin_ports: dict[int, int] | None = None,
                 own_coordinators: frozenset[int] | None = None) -> None:
        self._tc = coordinator
        self._metrics = metrics
        self._other_admin_ports = other_admin_ports or {}
        self._own_coordinators = own_coordinators
        self._listing_scans = asyncio.Semaphore(LISTING_SCANS)
        self._stopping = False
        # The store probe under way: readiness checks (/readyz, /metrics) made while it is share its answer. Each
        # made a store read of its own, and /readyz is open to anyone (a review: 128 connections asking in a loop
        # loaded the store and the event loop). Never an answer older than the check (a store that stopped
        # answering is said at once).
        self._store_probe: asyncio.Task[str | None] | None = None

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get(f"{PREFIX}/coordinators", self.coordinators)
        app.router.add_get(f"{PREFIX}/coordinatorStats", self.coordinator_stats)
        app.router.add_get(f"{PREFIX}/transactionMetadata/{_ID % 'most'}/{_ID % 'least'}", self.metadata)
        app.router.add_get(f"{PREFIX}/slowTransactions/{_ID % 'timeout'}", self.slow)
        # pulsar-admin's (Transactions.abortTransaction, Pulsar 3.1+: 204 on success), and tc-server's earlier
        # path for the same, which answers the transaction's new state.
        app.router.add_post(f"{PREFIX}/abortTransaction/{_ID % 'most'}/{_ID % 'least'}", self.abort_transaction)
        app.router.add_post(f"{PREFIX}/abort/{_ID % 'most'}/{_ID % 'least'}", self.force_abort)
        app.router.add_post(f"{PREFIX}/transactionCoordinator/replicas", self.scale)
        for name in BROKER_SIDE_PATHS:
            app.router.add_route("*", f"{PREFIX}/{name}/{{tail:.*}}", self.served_by_brokers)
        app.router.add_get(f"{PREFIX}/undelivered", self.undelivered)
        app.router.add_post(f"{PREFIX}/undelivered/{_ID % 'most'}/{_ID % 'least'}/drop", self.drop_participant)

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response(200, {"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        problems = await self.problems()
        if problems:
            return json_response(503, {"ready": False, "problems": problems})
        return json_response(200, {"ready": True, "led": [p.tc_id for p in self._tc.led_partitions()]})

    def stopping(self) -> None:
        self._stopping = True

    async def problems(self) -> list[str]:
        """Why this instance is not ready, one line each; none when it is (/readyz and tc_server_ready)."""
        if self._stopping:
            return ["stopping: no new connections are taken, the open ones are drained"]
        problems = []
        probe = self._store_probe
        if probe is None or probe.done():
            probe = self._store_probe = asyncio.get_running_loop().create_task(self._probe_store())
        # Shielded: a caller that leaves (its client gone) must not cancel the others' answer.
        if (unreachable := await asyncio.shield(probe)) is not None:
            problems.append(unreachable)
        if (write_problem := self._tc.store.write_problem()) is not None:
            problems.append(write_problem)
        leaderless, held_elsewhere = self._tc.not_served()
        if unreadable := self._tc.unreadable_leader_records():
            problems.append(f"leader records that cannot be read: {', '.join(unreadable)} (another writer's? their "
                            "coordinators have no leader until each is deleted or replaced)")
        if leaderless:
            problems.append(f"transaction coordinators {leaderless} have no leader yet")
        if held_elsewhere:
            problems.append(
                f"transaction coordinators {held_elsewhere}: their leader records name this instance's URL "
                f"({self._tc.config.advertised_url}) but another store session holds them: this instance's "
                "predecessor's after a restart in place (until that session expires, --oxia-session-timeout-ms), "
                "or another instance started with the same --advertised-url")
        lapsed = [p.tc_id for p in self._tc.led_partitions() if p.lease_lapsed()]
        if lapsed:
            problems.append(f"transaction coordinators {lapsed}: no store keep-alive answered within the session "
                            "timeout, so this instance may no longer hold them; their requests are refused until one "
                            "is, or another instance leads them")
        problems.extend(self._tc.health.problems())
        return problems

    async def _probe_store(self) -> str | None:
        try:
            async with asyncio.timeout(READY_PROBE_TIMEOUT_S):
                await self._tc.store.get(layout.PARALLELISM_PATH)
        except (StoreError, TimeoutError) as exc:
            return f"metadata store unreachable: {exc!r}"
        return None

    async def metrics(self, request: web.Request) -> web.Response:
        # Alert rules read readiness from here (deploy/prometheus/alerts.yml): the same checks as /readyz,
        # the store's answer included (bounded by READY_PROBE_TIMEOUT_S, under Prometheus' scrape timeout).
        self._metrics.ready.set(0 if await self.problems() else 1)
        return metrics_response(self._metrics.registry)

    async def coordinators(self, request: web.Request) -> web.Response:
        def entry(tc_id: int) -> dict[str, object]:
            url = self._tc.leader_url(tc_id)
            doc: dict[str, object] = {"id": tc_id, "brokerServiceUrl": url}
            if (url_tls := self._tc.tls_url(url)) is not None:
                doc["brokerServiceUrlTls"] = url_tls
            return doc

        return json_response(200, [entry(i) for i in range(self._tc.num_partitions)])

    async def coordinator_stats(self, request: web.Request) -> web.Response:
        def stats(tc_id: int) -> dict[str, object]:
            led = self._tc.leads(tc_id)
            partition = self._tc.partition(tc_id) if led else None
            return {
                "state": "Ready" if led else "NotLeader",
                "leader": self._tc.leader_url(tc_id),
                # As Pulsar's broker: the last id handed out, and the lowest txn still held (open or, here,
                # not yet delivered to its brokers: what END_TXN_ON_* carries) minus one, 0 with none.
                "leastSigBits": partition.last_issued if partition else -1,
                "lowWaterMark": _low_watermark(partition) if partition else -1,
                "ongoingTxnSize": partition.open_count if partition else 0,
                "recoverStartTime": 0,
                "recoverEndTime": 0,
            }

        coordinator_id = request.query.get("coordinatorId")
        if coordinator_id is None:
            return json_response(200, {str(i): stats(i) for i in range(self._tc.num_partitions)})
        tc_id = number(coordinator_id, "coordinatorId")
        return self._not_here(request, tc_id) or json_response(200, stats(tc_id))

    def _no_such_coordinator(self, tc_id: int | None) -> web.Response | None:
        """The 404 of every endpoint given a coordinator id past the configured number, else None."""
        if tc_id is None or tc_id < self._tc.num_partitions:
            return None
        count = self._tc.num_partitions
        return json_response(404, {"reason": f"no transaction coordinator {tc_id} (there are {count})"})

    def _not_here(self, request: web.Request, tc_id: int | None) -> web.Response | None:
        """The answer of a request about coordinator ``tc_id`` that this instance does not give: 404 for one
        past the configured number, a redirect to the worker that leads it; None otherwise."""
        return self._no_such_coordinator(tc_id) or self._elsewhere(request, tc_id)

    def _elsewhere(self, request: web.Request, tc_id: int | None) -> web.Response | None:
        """The redirect (307) to the admin port of the worker that leads ``tc_id``, when another does (see
        the class text); None otherwise. Same scheme and host as this request, that worker's port."""
        port = None if tc_id is None else self._other_admin_ports.get(tc_id)
        if port is None:
            return None
        location = str(request.url.with_port(port))
        return web.Response(status=307, headers={"Location": location}, text=f"coordinator {tc_id} is served at "
                            f"{location}\n")

    async def participants(self, most: int, least: int) -> tuple[Produced, Acked]:
        """What Pulsar's TransactionMetadata lists as producedPartitions and ackedPartitions: the participants
        recorded for today's brokers (until each is told the decision, docs/participants.md) and the segments
        of Pulsar 5 participants' op records, each read as the coordinator reads them. Unreadable records are
        logged and left out."""
        produced: Produced = {}
        acked: Acked = {}

        def add(topic: str, subscription: str | None) -> None:
            if subscription is None:
                produced.setdefault(topic, {})
            else:
                acked.setdefault(topic, {}).setdefault(subscription, {})

        readable, _ = await read_participant_records(self._tc.store, most, least, log)  # unreadable: logged there
        for _, participant in readable:
            add(participant.topic, participant.subscription)
        ops = await events.participants(self._tc.store, self._metrics, most, least)
        for segment in ops.segments:
            add(segment, None)
        for segment, subscription in ops.subscriptions:
            add(segment, subscription)
        return produced, acked

    async def metadata(self, request: web.Request) -> web.Response:
        most, least = number(request.match_info["most"], "most"), number(request.match_info["least"], "least")
        if (elsewhere := self._not_here(request, most)) is not None:
            return elsewhere
        record = await self._tc.store.get(layout.header_path(most, least), partition_key=layout.txn_key(most, least))
        if record is None:
            return json_response(404, {"reason": f"transaction ({most},{least}) not found"})
        try:
            header = TxnHeader.from_json(record.value)
        except ValueError as exc:
            # The detail may quote stored bytes: it goes to the log, not into the answer.
            log.warning("unreadable txn header", txn=f"({most},{least})", error=str(exc)[:200])
            return json_response(500, {"reason": f"the stored header of transaction ({most},{least}) is unreadable"})
        return json_response(200, txn_metadata(most, least, header, *await self.participants(most, least)))

    async def slow(self, request: web.Request) -> web.Response:
        """Open txns whose configured timeout is greater than the argument (as Pulsar; not age), one page
        in txn id order (``?limit=``, ``?after=``; see DEFAULT_PAGE)."""
        timeout_ms = number(request.match_info["timeout"], "timeout")
        query = request.query.get("coordinatorId")
        coordinator_id = None if query is None else number(query, "coordinatorId")
        if (missing := self._not_here(request, coordinator_id)) is not None:
            return missing
        limit, after = page_parameters(request)
        # The deadline index is in deadline order, not id order: the page is the `limit` smallest ids
        # above `after`, kept in a max-heap of limit + 1 entries (one more tells that more follow).
        page: list[tuple[int, int, TxnHeader]] = []  # (-most, -least, header)
        async with self._listing_scans:
            async for most, least, header, _ in self._yielding(self._tc.open_headers()):
                if coordinator_id is not None and most != coordinator_id:
                    continue
                if header.timeout_ms <= timeout_ms or (after is not None and (most, least) <= after):
                    continue
                if len(page) <= limit:
                    heapq.heappush(page, (-most, -least, header))
                elif (most, least) < (-page[0][0], -page[0][1]):
                    heapq.heapreplace(page, (-most, -least, header))
        more = len(page) > limit
        if more:
            heapq.heappop(page)  # the largest: the first of the next page
        ordered = sorted((-most, -least, header) for most, least, header in page)
        reads = asyncio.Semaphore(PARTICIPANT_READS)

        async def described(most: int, least: int, header: TxnHeader) -> dict[str, object]:
            async with reads:
                return txn_metadata(most, least, header, *await self.participants(most, least))

        documents = await asyncio.gather(*(described(*entry) for entry in ordered))
        found = {txn_id(most, least): doc for (most, least, _), doc in zip(ordered, documents, strict=True)}
        last = (ordered[-1][0], ordered[-1][1]) if more else None
        return paged(json_response(200, found), request, last)

    async def _participant_records(self, coordinator_id: int | None,
                                   after: tuple[int, int] | None) -> AsyncIterator[Record]:
        """The participant records of one coordinator (None: each of this instance's in turn, see the class
        text), of txns after ``after``. One range per coordinator: Oxia orders keys with more '/' after those
        with fewer, so one range from ``pad(0)`` to ``~`` over every coordinator's ``<most>/<least>`` keys finds
        nothing there."""
        if coordinator_id is not None:
            wanted: Iterable[int] = (coordinator_id,)
        elif self._own_coordinators is not None:
            wanted = sorted(self._own_coordinators)
        else:
            wanted = range(self._tc.num_partitions)
        for tc_id in wanted:
            if after is not None and tc_id < after[0]:
                continue
            start, end = layout.participants_by_coordinator_range(tc_id)
            if after is not None and tc_id == after[0]:
                # The index key is the txn id, padded (layout.participants_by_coordinator_key): the next id on.
                start = layout.participants_by_coordinator_key(tc_id, after[1] + 1)
            async for record in self._tc.store.scan_index(layout.IDX_PARTICIPANTS_BY_COORDINATOR, start, end):
                yield record

    @staticmethod
    async def _yielding(items: AsyncIterator[_T]) -> AsyncIterator[_T]:
        """``items``, with a turn of the event loop every LISTING_YIELD_EVERY of them."""
        seen = 0
        async for item in items:
            seen += 1
            if seen % LISTING_YIELD_EVERY == 0:
                await asyncio.sleep(0)
            yield item

    async def abort_transaction(self, request: web.Request) -> web.Response:
        """pulsar-admin's abortTransaction: force_abort, whose success a broker answers 204, no body."""
        response = await self.force_abort(request)
        return web.Response(status=204) if response.status == 200 else response

    async def force_abort(self, request: web.Request) -> web.Response:
        most, least = number(request.match_info["most"], "most"), number(request.match_info["least"], "least")
        if (missing := self._not_here(request, most)) is not None:
            return missing
        try:
            state = await self._tc.partition(most).force_abort(least)
        except CoordinatorNotFound as exc:
            return json_response(409, {"reason": str(exc), "leader": self._tc.leader_url(most)})
        except TransactionNotFound as exc:
            return json_response(404, {"reason": str(exc)})
        except StoreCorrupted as exc:
            return self._damaged(most, least, exc)
        if state is not TxnState.ABORTED:
            return json_response(409, {"reason": f"transaction ({most},{least}) is already {state.value}",
                                       "status": state.value})
        return json_response(200, {"txnId": f"({most},{least})", "status": state.value})

    async def drop_participant(self, request: web.Request) -> web.Response:
        """Forget one participant of a decided txn that can never be told (docs/participants.md, "A
        participant that can never be told"): ``?topic=``, and ``&subscription=`` for an
        acknowledgement's, or ``?key=`` for a record that cannot be read (as the listing names it). Its broker
        never learns the decision."""
        most, least = number(request.match_info["most"], "most"), number(request.match_info["least"], "least")
        if (missing := self._not_here(request, most)) is not None:
            return missing
        topic, subscription, key = (request.query.get(name) for name in ("topic", "subscription", "key"))
        participant: layout.Participant | str
        if key and not topic:
            try:
                named = layout.parse_participant_path(key)
            except ValueError:
                named = None
            if named != (most, least):
                raise web.HTTPBadRequest(reason=f"{key[:200]!r} is no participant record key of transaction "
                                                f"({most},{least})")
            participant = key
        elif topic and not key:
            participant = layout.Participant(topic, subscription)
        else:
            raise web.HTTPBadRequest(reason="name the participant: ?topic=T, with &subscription=S for an "
                                            "acknowledgement's, or ?key=K for a record that cannot be read (as "
                                            "'undelivered' lists them)")
        try:
            left = await self._tc.partition(most).drop_participant(least, participant)
        except CoordinatorNotFound as exc:
            return json_response(409, {"reason": str(exc), "leader": self._tc.leader_url(most)})
        except TransactionNotFound as exc:
            return json_response(404, {"reason": str(exc)})
        except InvalidTxnStatus as exc:
            return json_response(409, {"reason": str(exc)})
        except StoreCorrupted as exc:
            return self._damaged(most, least, exc)
        dropped = {"key": participant} if isinstance(participant, str) else {"topic": participant.topic, **(
            {"subscription": subscription} if subscription is not None else {})}
        return json_response(200, {"txnId": txn_id(most, least), "dropped": dropped, "participantsLeft": left})

    async def served_by_brokers(self, request: web.Request) -> web.Response:
        name = request.path[len(PREFIX) + 1:].partition("/")[0]
        return json_response(404, {"reason": f"{name} is the state of a broker's topic, not of the coordinator: ask "
                                             "a broker's web service URL (pulsar-admin --admin-url http://BROKER:8080)"})

    async def scale(self, request: web.Request) -> web.Response:
        # As a broker refuses a count it cannot take (406): tc-server's is a setting, not an admin operation.
        return json_response(406, {"reason": f"the number of transaction coordinators ({self._tc.num_partitions}) is "
                                             "set by --coordinators, for every instance of the cluster at once"})

    @staticmethod
    def _damaged(most: int, least: int, exc: StoreCorrupted) -> web.Response:
        """A record of the txn the coordinator cannot read (as transactionMetadata answers it): the txn named,
        one warning, no traceback; the record is for an operator to look at, not a bug of this process."""
        log.warning("unreadable record of a transaction", txn=f"({most},{least})", error=str(exc)[:200])
        return json_response(500, {"reason": f"a stored record of transaction ({most},{least}) is unreadable: "
                                             f"{str(exc)[:200]}"})

    async def undelivered(self, request: web.Request) -> web.Response:
        """Decided txns whose participant brokers have not all acknowledged the decision (the outbox,
        docs/participants.md), from the store, every coordinator or a worker's own (``?coordinatorId=`` for
        one): txn id, decision, when it was decided, and its participants, those whose brokers acknowledged
        already marked ``"acknowledged": true`` where this instance leads the coordinator. One page in txn id order
        (``?limit=``, ``?after=``; see DEFAULT_PAGE); unreadable records are listed first on the first page."""
        query = request.query.get("coordinatorId")
        coordinator_id = None if query is None else number(query, "coordinatorId")
        if (missing := self._not_here(request, coordinator_id)) is not None:
            return missing
        limit, after = page_parameters(request)
        # Oxia scans shard after shard, each in index order, so the stream is not in txn id order overall;
        # one txn's records come together (one partition key: one shard). The page is the `limit` smallest
        # decided txns above `after`: a max-heap of limit + 1 ids (one more tells that more follow) and
        # their documents. A txn's header is read when it would enter the heap (still OPEN: left out).
        heap: list[tuple[int, int]] = []  # (-most, -least)
        chosen: dict[tuple[int, int], dict[str, object]] = {}
        left_out: tuple[int, int] | None = None  # the last txn found still OPEN (its other records follow)
        unreadable: list[dict[str, object]] = []
        # The participants its leader here knows were told, of the txn whose records are at hand (they come
        # together): read once per txn, and only for a txn of the page. A dict of every txn scanned held memory for
        # the whole range scanned, open txns included, not for the page (a review: 13.7 MB for 40,000 open txns).
        told_txn: tuple[int, int] | None = None
        told: AbstractSet[str] = frozenset()
        async with self._listing_scans:
            async for record in self._yielding(self._participant_records(coordinator_id, after)):
                try:
                    txn = layout.parse_participant_path(record.key)
                except ValueError as exc:
                    if after is None and len(unreadable) < limit:  # damage: on the first page, at most a page
                        unreadable.append({"txnId": None, "participants": [{"key": record.key,
                                                                             "unreadable": str(exc)}]})
                    continue
                entry: dict[str, object]
                try:
                    participant = layout.Participant.from_json(record.value)
                except ValueError as exc:
                    # Listed under the txn its key names (which it holds; drop it with ?key=), not as no txn's.
                    entry = {"key": record.key, "unreadable": str(exc)}
                else:
                    entry = {"topic": participant.topic}
                    if participant.subscription is not None:
                        entry["subscription"] = participant.subscription
                doc = chosen.get(txn)
                if doc is None:
                    if txn == left_out or (len(heap) > limit and txn > (-heap[0][0], -heap[0][1])):
                        continue
                    doc = await self._undelivered_doc(txn)
                    if doc is None:
                        left_out = txn
                        continue
                    if len(heap) > limit:
                        most, least = heapq.heapreplace(heap, (-txn[0], -txn[1]))
                        del chosen[(-most, -least)]
                    else:
                        heapq.heappush(heap, (-txn[0], -txn[1]))
                    chosen[txn] = doc
                if txn != told_txn:
                    told_txn = txn
                    told = self._tc.partition(txn[0]).told(txn[1]) if self._tc.leads(txn[0]) else frozenset()
                if record.key in told:
                    # Its broker acknowledged; the record stays until every participant's has (a review on two
                    # brokers: the listing named the broker that had answered as well as the one that had not).
                    entry["acknowledged"] = True
                participants = doc["participants"]
                assert isinstance(participants, list)
                participants.append(entry)
        more = len(heap) > limit
        if more:
            most, least = heapq.heappop(heap)
            del chosen[(-most, -least)]
        ordered = sorted(chosen)
        found = unreadable + [chosen[txn] for txn in ordered]
        full_at = ordered[-1] if more else None
        return paged(json_response(200, found), request, full_at)

    async def _undelivered_doc(self, txn: tuple[int, int]) -> dict[str, object] | None:
        """The listing's document of a txn with participant records (participants still to add); None
        while it is OPEN (not decided yet: nothing to deliver)."""
        most, least = txn
        doc: dict[str, object] = {"txnId": txn_id(most, least), "participants": []}
        header = await self._tc.store.get(layout.header_path(most, least), partition_key=layout.txn_key(most, least))
        if header is None:
            doc["status"] = None  # no header: the decision is unknown, held until dropped (docs/participants.md)
            return doc
        try:
            parsed = TxnHeader.from_json(header.value)
        except ValueError:
            log.warning("unreadable txn header", txn=txn_id(most, least))
            doc["status"] = "unreadable header"
            return doc
        if parsed.state is TxnState.OPEN:
            return None
        doc["status"] = parsed.state.value
        doc["finalizedTimestamp"] = parsed.finalized_ms
        return doc

