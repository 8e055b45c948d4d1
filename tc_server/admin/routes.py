"""Admin endpoints: probes, Prometheus, and the ``/admin/v3/transactions`` reads that
``pulsar-admin transactions`` uses (pulsar-protocol.md §6), plus a force-abort (apache/pulsar#19786).

aiohttp handlers; who may call which is decided before them, in tc_server/admin/http.py.
"""

from __future__ import annotations

import asyncio
import json

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tc_server.coordinator import layout
from tc_server.coordinator.coordinator import TransactionCoordinator
from tc_server.coordinator.errors import CoordinatorNotFound, TransactionNotFound
from tc_server.coordinator.layout import TxnHeader, TxnState
from tc_server.metrics import Metrics
from tc_server.store.api import StoreError

log = structlog.get_logger("tc_server.admin")

PREFIX = "/admin/v3/transactions"
READY_PROBE_TIMEOUT_S = 2.0
# Any path segment: a bad number is answered 400 naming the parameter (see number()), not 404.
_ID = r"{%s:[^/]+}"
# Txn id halves are Java longs in Pulsar (TxnID), and so are timeouts in ms.
MAX_LONG = 2**63 - 1


def number(text: str, name: str, maximum: int = MAX_LONG) -> int:
    """A decimal parameter from 0 to ``maximum``, or 400 naming it (issue 15: '²' passes str.isdigit()
    and breaks int(); Unicode digits would be read by int(); 5,000 digits break it)."""
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(maximum))) or int(text) > maximum:
        # ascii(): the reason also goes into the status line, which must stay ASCII.
        raise web.HTTPBadRequest(reason=f"{name}: expected a number from 0 to {maximum}, got {ascii(text[:40])}")
    return int(text)


def json_response(status: int, doc: object) -> web.Response:
    return web.json_response(doc, status=status, dumps=lambda d: json.dumps(d, separators=(",", ":")))


def txn_metadata(most: int, least: int, header: TxnHeader) -> dict[str, object]:
    """Pulsar's ``TransactionMetadata`` shape; ``timeoutAt`` is the relative timeout, as Pulsar
    fills it. Participants are recorded by the participants themselves, so the two maps are empty."""
    return {
        "txnId": f"({most},{least})",
        "status": header.state.value,
        "openTimestamp": header.created_ms,
        "timeoutAt": header.timeout_ms,
        "finalizedTimestamp": header.finalized_ms,
        "producedPartitions": {},
        "ackedPartitions": {},
        "owner": header.owner,
    }


class AdminRoutes:
    def __init__(self, coordinator: TransactionCoordinator, metrics: Metrics) -> None:
        self._tc = coordinator
        self._metrics = metrics

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get(f"{PREFIX}/coordinators", self.coordinators)
        app.router.add_get(f"{PREFIX}/coordinatorStats", self.coordinator_stats)
        app.router.add_get(f"{PREFIX}/transactionMetadata/{_ID % 'most'}/{_ID % 'least'}", self.metadata)
        app.router.add_get(f"{PREFIX}/slowTransactions/{_ID % 'timeout'}", self.slow)
        app.router.add_post(f"{PREFIX}/abort/{_ID % 'most'}/{_ID % 'least'}", self.force_abort)
        app.router.add_get(f"{PREFIX}/undelivered", self.undelivered)

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response(200, {"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        problems = []
        try:
            async with asyncio.timeout(READY_PROBE_TIMEOUT_S):
                await self._tc.store.get(layout.PARALLELISM_PATH)
        except (StoreError, TimeoutError) as exc:
            problems.append(f"metadata store unreachable: {exc!r}")
        if not self._tc.ready:
            problems.append("not every transaction coordinator has a leader yet")
        problems.extend(self._tc.health.problems())
        if problems:
            return json_response(503, {"ready": False, "problems": problems})
        return json_response(200, {"ready": True, "led": [p.tc_id for p in self._tc.led_partitions()]})

    async def metrics(self, request: web.Request) -> web.Response:
        # CONTENT_TYPE_LATEST carries a charset, which aiohttp's content_type argument refuses.
        return web.Response(body=generate_latest(self._metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

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
                # The next id this instance may hand out is below this (ids are reserved in blocks).
                "leastSigBits": partition.reserved_next if partition else 0,
                "lowWaterMark": min(partition.open_txns(), default=-1) if partition else -1,
                "ongoingTxnSize": partition.open_count if partition else 0,
                "recoverStartTime": 0,
                "recoverEndTime": 0,
            }

        coordinator_id = request.query.get("coordinatorId")
        if coordinator_id is None:
            return json_response(200, {str(i): stats(i) for i in range(self._tc.num_partitions)})
        tc_id = number(coordinator_id, "coordinatorId")
        if tc_id >= self._tc.num_partitions:
            return json_response(404, {"reason": f"no transaction coordinator {tc_id}"})
        return json_response(200, stats(tc_id))

    async def metadata(self, request: web.Request) -> web.Response:
        most, least = number(request.match_info["most"], "most"), number(request.match_info["least"], "least")
        record = await self._tc.store.get(layout.header_path(most, least), partition_key=layout.txn_key(most, least))
        if record is None:
            return json_response(404, {"reason": f"transaction ({most},{least}) not found"})
        try:
            header = TxnHeader.from_json(record.value)
        except ValueError as exc:
            # The detail may quote stored bytes: it goes to the log, not into the answer.
            log.warning("unreadable txn header", txn=f"({most},{least})", error=str(exc)[:200])
            return json_response(500, {"reason": f"the stored header of transaction ({most},{least}) is unreadable"})
        return json_response(200, txn_metadata(most, least, header))

    async def slow(self, request: web.Request) -> web.Response:
        """Open txns whose configured timeout is greater than the argument (as Pulsar; not age)."""
        timeout_ms = number(request.match_info["timeout"], "timeout")
        coordinator_id = request.query.get("coordinatorId")
        if coordinator_id is not None:
            coordinator_id = str(number(coordinator_id, "coordinatorId"))
        found: dict[str, object] = {}
        async for most, least, header, _ in self._tc.open_headers():
            if coordinator_id is not None and str(most) != coordinator_id:
                continue
            if header.timeout_ms > timeout_ms:
                found[f"({most},{least})"] = txn_metadata(most, least, header)
        return json_response(200, found)

    async def force_abort(self, request: web.Request) -> web.Response:
        most, least = number(request.match_info["most"], "most"), number(request.match_info["least"], "least")
        try:
            state = await self._tc.partition(most).force_abort(least)
        except CoordinatorNotFound as exc:
            return json_response(409, {"reason": str(exc), "leader": self._tc.leader_url(most)})
        except TransactionNotFound as exc:
            return json_response(404, {"reason": str(exc)})
        except StoreError as exc:
            return json_response(503, {"reason": f"metadata store error: {exc!r}"})
        if state is not TxnState.ABORTED:
            return json_response(409, {"reason": f"transaction ({most},{least}) is already {state.value}",
                                       "status": state.value})
        return json_response(200, {"txnId": f"({most},{least})", "status": state.value})

    async def undelivered(self, request: web.Request) -> web.Response:
        """Decided txns whose participant brokers have not all acknowledged the decision (the outbox,
        docs/participants.md), from the store, every coordinator (``?coordinatorId=`` for one): txn id,
        decision, when it was decided, and the participants still to be told."""
        query = request.query.get("coordinatorId")
        coordinator_id = None if query is None else number(query, "coordinatorId")
        if coordinator_id is not None and coordinator_id >= self._tc.num_partitions:
            return json_response(404, {"reason": f"no transaction coordinator {coordinator_id}"})
        start, end = layout.participants_by_coordinator_range(coordinator_id)
        waiting: dict[tuple[int, int], list[dict[str, str]]] = {}
        async for record in self._tc.store.scan_index(layout.IDX_PARTICIPANTS_BY_COORDINATOR, start, end):
            try:
                txn = layout.parse_participant_path(record.key)
                participant = layout.Participant.from_json(record.value)
            except ValueError as exc:
                waiting.setdefault((-1, -1), []).append({"key": record.key, "unreadable": str(exc)})
                continue
            entry = {"topic": participant.topic}
            if participant.subscription is not None:
                entry["subscription"] = participant.subscription
            waiting.setdefault(txn, []).append(entry)
        found = []
        for (most, least), participants in sorted(waiting.items()):
            doc: dict[str, object] = {"txnId": f"({most},{least})", "participants": participants}
            if most >= 0:
                header = await self._tc.store.get(layout.header_path(most, least),
                                                  partition_key=layout.txn_key(most, least))
                if header is not None:
                    parsed = TxnHeader.from_json(header.value)
                    if parsed.state is TxnState.OPEN:
                        continue  # not decided yet: nothing to deliver
                    doc["status"] = parsed.state.value
                    doc["finalizedTimestamp"] = parsed.finalized_ms
                else:
                    doc["status"] = None  # no header: delivered as ABORTED (docs/participants.md)
            found.append(doc)
        return json_response(200, found)
