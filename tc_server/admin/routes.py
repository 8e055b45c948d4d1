"""Admin endpoints: probes, Prometheus, and the ``/admin/v3/transactions`` reads that
``pulsar-admin transactions`` uses (pulsar-protocol.md §6), plus a force-abort (apache/pulsar#19786).
"""

from __future__ import annotations

import asyncio
import re

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tc_server.admin.http import Request, Response
from tc_server.coordinator import layout
from tc_server.coordinator.coordinator import TransactionCoordinator
from tc_server.coordinator.errors import CoordinatorNotFound, TransactionNotFound
from tc_server.coordinator.layout import TxnHeader, TxnState
from tc_server.metrics import Metrics
from tc_server.store.api import StoreError

PREFIX = "/admin/v3/transactions"
READY_PROBE_TIMEOUT_S = 2.0

_METADATA = re.compile(rf"^{PREFIX}/transactionMetadata/(\d+)/(\d+)$")
_SLOW = re.compile(rf"^{PREFIX}/slowTransactions/(\d+)$")
_ABORT = re.compile(rf"^{PREFIX}/abort/(\d+)/(\d+)$")


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
        self._started_ms = 0

    async def __call__(self, req: Request) -> Response:
        path = req.path.rstrip("/") or "/"
        if req.method not in ("GET", "POST"):
            return Response.json(405, {"reason": f"{req.method} not allowed"})
        if req.method == "POST":
            if match := _ABORT.match(path):
                return await self._force_abort(int(match[1]), int(match[2]))
            return Response.json(404, {"reason": f"no such endpoint: POST {path}"})
        if path == "/healthz":
            return Response.json(200, {"status": "ok"})
        if path == "/readyz":
            return await self._ready()
        if path == "/metrics":
            return Response(200, generate_latest(self._metrics.registry), CONTENT_TYPE_LATEST)
        if path == f"{PREFIX}/coordinators":
            return Response.json(200, [
                {"id": i, "brokerServiceUrl": self._tc.leader_url(i)} for i in range(self._tc.num_partitions)
            ])
        if path == f"{PREFIX}/coordinatorStats":
            return self._coordinator_stats(req.query.get("coordinatorId"))
        if match := _METADATA.match(path):
            return await self._metadata(int(match[1]), int(match[2]))
        if match := _SLOW.match(path):
            return await self._slow(int(match[1]), req.query.get("coordinatorId"))
        return Response.json(404, {"reason": f"no such endpoint: {path}"})

    async def _ready(self) -> Response:
        problems = []
        try:
            async with asyncio.timeout(READY_PROBE_TIMEOUT_S):
                await self._tc.store.get(layout.PARALLELISM_PATH)
        except (StoreError, TimeoutError) as exc:
            problems.append(f"metadata store unreachable: {exc!r}")
        if not self._tc.ready:
            problems.append("not every transaction coordinator has a leader yet")
        if problems:
            return Response.json(503, {"ready": False, "problems": problems})
        return Response.json(200, {"ready": True, "led": [p.tc_id for p in self._tc.led_partitions()]})

    def _coordinator_stats(self, coordinator_id: str | None) -> Response:
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

        if coordinator_id is None:
            return Response.json(200, {str(i): stats(i) for i in range(self._tc.num_partitions)})
        if not coordinator_id.isdigit() or int(coordinator_id) >= self._tc.num_partitions:
            return Response.json(404, {"reason": f"no transaction coordinator {coordinator_id}"})
        return Response.json(200, stats(int(coordinator_id)))

    async def _metadata(self, most: int, least: int) -> Response:
        record = await self._tc.store.get(layout.header_path(most, least), partition_key=layout.txn_key(most, least))
        if record is None:
            return Response.json(404, {"reason": f"transaction ({most},{least}) not found"})
        return Response.json(200, txn_metadata(most, least, TxnHeader.from_json(record.value)))

    async def _slow(self, timeout_ms: int, coordinator_id: str | None) -> Response:
        """Open txns whose configured timeout is greater than the argument (as Pulsar; not age)."""
        found: dict[str, object] = {}
        async for most, least, header, _ in self._tc.open_headers():
            if coordinator_id is not None and str(most) != coordinator_id:
                continue
            if header.timeout_ms > timeout_ms:
                found[f"({most},{least})"] = txn_metadata(most, least, header)
        return Response.json(200, found)

    async def _force_abort(self, most: int, least: int) -> Response:
        try:
            state = await self._tc.partition(most).force_abort(least)
        except CoordinatorNotFound as exc:
            leader = self._tc.leader_url(most)
            return Response.json(409, {"reason": str(exc), "leader": leader})
        except TransactionNotFound as exc:
            return Response.json(404, {"reason": str(exc)})
        except StoreError as exc:
            return Response.json(503, {"reason": f"metadata store error: {exc!r}"})
        if state is not TxnState.ABORTED:
            return Response.json(409, {"reason": f"transaction ({most},{least}) is already {state.value}",
                                       "status": state.value})
        return Response.json(200, {"txnId": f"({most},{least})", "status": state.value})
