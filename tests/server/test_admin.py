"""The admin HTTP endpoints over a real socket."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from dataclasses import replace
from typing import Any, cast

import structlog
from aiohttp.test_utils import make_mocked_request

from tc_server.admin.routes import AdminRoutes
from tc_server.coordinator import layout
from tc_server.coordinator.layout import OpKind, TxnOp
from tc_server.store.api import StoreUnavailableError
from tc_server.workers import WorkerRole


def fetch(app, path: str, method: str = "GET") -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{app.admin.port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


async def get(app, path: str, method: str = "GET") -> tuple[int, Any]:
    return await asyncio.to_thread(fetch, app, path, method)


async def test_slow_transactions_and_stats(app, client):
    short = await client.new_txn(tc_id=1, ttl_ms=5_000)
    long = await client.new_txn(tc_id=2, ttl_ms=120_000)
    status, slow = await get(app, "/admin/v3/transactions/slowTransactions/60000")
    assert status == 200 and list(slow) == [f"(2,{long.least})"]
    status, only_1 = await get(app, "/admin/v3/transactions/slowTransactions/1000?coordinatorId=1")
    assert status == 200 and list(only_1) == [f"(1,{short.least})"]
    status, stats = await get(app, "/admin/v3/transactions/coordinatorStats?coordinatorId=2")
    assert status == 200 and stats["ongoingTxnSize"] == 1 and stats["state"] == "Ready"


async def test_metadata_and_force_abort(app, client):
    t = await client.new_txn(tc_id=3, ttl_ms=60_000)
    status, doc = await get(app, f"/admin/v3/transactions/transactionMetadata/3/{t.least}")
    assert status == 200 and doc["status"] == "OPEN" and doc["timeoutAt"] == 60_000
    status, doc = await get(app, f"/admin/v3/transactions/abort/3/{t.least}", method="POST")
    assert status == 200 and doc["status"] == "ABORTED"
    status, doc = await get(app, f"/admin/v3/transactions/abort/3/{t.least}", method="POST")
    assert status == 200  # aborting again is idempotent
    committed = await client.new_txn(tc_id=3)
    await client.end_txn(3, committed.least, commit=True)
    status, doc = await get(app, f"/admin/v3/transactions/abort/3/{committed.least}", method="POST")
    assert status == 409 and doc["status"] == "COMMITTED"
    assert (await get(app, "/admin/v3/transactions/transactionMetadata/3/999999"))[0] == 404
    assert (await get(app, "/admin/v3/transactions/nope"))[0] == 404


async def test_a_coordinator_id_past_the_configured_number_is_404_on_every_endpoint_that_takes_one(app):
    n = app.coordinator.num_partitions
    for path, method in ((f"/admin/v3/transactions/abort/{n}/1", "POST"),
                         (f"/admin/v3/transactions/abortTransaction/{n}/1", "POST"),
                         (f"/admin/v3/transactions/transactionMetadata/{n}/1", "GET"),
                         (f"/admin/v3/transactions/slowTransactions/0?coordinatorId={n}", "GET"),
                         (f"/admin/v3/transactions/coordinatorStats?coordinatorId={n}", "GET"),
                         (f"/admin/v3/transactions/undelivered?coordinatorId={n}", "GET"),
                         (f"/admin/v3/transactions/undelivered/{n}/1/drop?topic=t", "POST")):
        status, doc = await get(app, path, method)
        assert status == 404 and doc["reason"] == f"no transaction coordinator {n} (there are {n})", (path, doc)


async def test_coordinator_stats_count_as_pulsars_do(app, client):
    # lowWaterMark is Pulsar's (MLTransactionMetadataStore.getLowWaterMark): the lowest open txn's id
    # minus one, 0 with none open; it was the lowest open id itself, -1 with none. leastSigBits is the
    # last id handed out; it was the end of the reserved id block.
    _, stats = await get(app, "/admin/v3/transactions/coordinatorStats?coordinatorId=4")
    assert (stats["lowWaterMark"], stats["leastSigBits"]) == (0, -1)
    first = await client.new_txn(tc_id=4)
    second = await client.new_txn(tc_id=4)
    _, stats = await get(app, "/admin/v3/transactions/coordinatorStats?coordinatorId=4")
    assert (stats["lowWaterMark"], stats["leastSigBits"]) == (first.least - 1, second.least)
    await client.end_txn(4, first.least, commit=True)
    _, stats = await get(app, "/admin/v3/transactions/coordinatorStats?coordinatorId=4")
    assert stats["lowWaterMark"] == second.least - 1
    await client.end_txn(4, second.least, commit=False)
    _, stats = await get(app, "/admin/v3/transactions/coordinatorStats?coordinatorId=4")
    assert (stats["lowWaterMark"], stats["leastSigBits"]) == (0, second.least)


async def test_readyz_names_coordinators_whose_lease_lapsed(app, client):
    # Their writes were refused (the session may have expired unnoticed, docs/semantics.md §8), yet the
    # instance said ready: nothing but the refusals showed it until the session expired.
    app.coordinator.partition(3)._lease = lambda: 0.0  # a lease that ran out (Oxia's; the memory store has none)
    status, doc = await get(app, "/readyz")
    assert status == 503 and any("[3]" in problem and "keep-alive" in problem for problem in doc["problems"]), doc


async def test_a_store_that_does_not_answer_is_503_on_every_page_that_reads_it(app, client, monkeypatch):
    # Reads of a store that was down answered 500 "internal error" with a traceback in the log per request;
    # only the abort and drop handlers had said 503. Now one place says it for every handler.
    t = await client.new_txn(tc_id=3, ttl_ms=60_000)
    store = app.coordinator.store

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailableError("metadata store: connection refused")

    def down_scan(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailableError("metadata store: connection refused")

    monkeypatch.setattr(store, "get", down)
    monkeypatch.setattr(store, "scan_index", down_scan)
    monkeypatch.setattr(store, "scan_prefix", down_scan)
    with structlog.testing.capture_logs() as logged:
        for path in (f"/admin/v3/transactions/transactionMetadata/3/{t.least + 1}",
                     "/admin/v3/transactions/undelivered", "/admin/v3/transactions/slowTransactions/0"):
            status, doc = await get(app, path)
            assert (status, doc["reason"]) == (503, "metadata store error: StoreUnavailableError("
                                                    "'metadata store: connection refused')"), (path, status, doc)
    assert not [line for line in logged if line["log_level"] == "error"]


async def test_a_page_limit_outside_its_range_names_the_range(app):
    for limit in ("0", "99999"):
        status, doc = await get(app, f"/admin/v3/transactions/undelivered?limit={limit}")
        assert (status, doc["reason"]) == (400, f"limit: expected a number from 1 to 10000, got '{limit}'")


async def test_a_wrong_method_is_named_as_such_not_as_a_missing_endpoint(app):
    # curl without -X POST on the force-abort got 405 with "no such endpoint: GET ...", as if this tc-server
    # had no force-abort.
    status, doc = await get(app, "/admin/v3/transactions/abort/1/0")
    assert status == 405, doc
    assert doc["reason"] == "GET is not allowed on /admin/v3/transactions/abort/1/0; use POST", doc


async def test_a_clients_http_lookup_is_told_to_use_the_pulsar_url(app):
    # A Java client given tc-server's admin address as an http:// service URL asks these paths first (the
    # coordinators' partitions, then a topic lookup) and failed with "Not found: Not Found"; the 404 now says
    # what to give it, for whoever looks at the port with curl.
    for path in ("/admin/v2/persistent/pulsar/system/transaction_coordinator_assign/partitions",
                 "/lookup/v2/topic/persistent/public/default/orders"):
        status, doc = await get(app, path)
        assert status == 404, doc
        assert doc["reason"] == (f"no such endpoint: GET {path}; tc-server answers lookups on its Pulsar protocol "
                                 "port only: give clients its pulsar:// (or pulsar+ssl://) URL as their service "
                                 "URL, not this HTTP address"), doc


async def test_metadata_lists_pulsar_5_participants_from_their_op_records(app, client):
    # A Pulsar 5 participant records each write and ack as an op record (PIP-473): transactionMetadata lists
    # their segments as a broker's coordinator lists its participants.
    t = await client.new_txn(tc_id=3, ttl_ms=60_000)
    for op in (TxnOp(OpKind.WRITE, "segment://public/default/orders/0", 7, 1),
               TxnOp(OpKind.ACK, "segment://public/default/payments/0", 8, 2, subscription="billing")):
        await app.coordinator.store.put_sequential(layout.op_prefix(3, t.least), op.to_json(),
                                                   partition_key=layout.txn_key(3, t.least),
                                                   secondary_indexes=op.index_entries(3, t.least))
    status, doc = await get(app, f"/admin/v3/transactions/transactionMetadata/3/{t.least}")
    assert status == 200
    assert doc["producedPartitions"] == {"segment://public/default/orders/0": {}}
    assert doc["ackedPartitions"] == {"segment://public/default/payments/0": {"billing": {}}}


async def test_on_a_shared_store_a_worker_answers_about_another_workers_coordinator_itself(app, client, settings):
    # --store oxia: every worker reads the one store, so worker 0 answers a read about coordinator 1 itself
    # rather than redirecting to "<this request's host>:<worker 1's port>", which a port-forward, an SSH tunnel
    # or a reverse proxy does not reach. (The in-process memory store stands in for the shared one.)
    t = await client.new_txn(tc_id=1, ttl_ms=60_000)
    oxia = replace(settings, store="oxia", workers=2, admin_listen="127.0.0.1:8080", listen="127.0.0.1:6650")
    assert WorkerRole.of(oxia, 0).other_admin_ports == {}
    embedded = replace(oxia, store="embedded")
    assert WorkerRole.of(embedded, 0).other_admin_ports == {tc_id: 8082 for tc_id in range(1, oxia.coordinators, 2)}
    routes = AdminRoutes(app.coordinator, app.metrics, other_admin_ports=WorkerRole.of(oxia, 0).other_admin_ports)
    request = make_mocked_request("GET", f"/admin/v3/transactions/transactionMetadata/1/{t.least}",
                                  headers={"Host": "localhost:18081"}, match_info={"most": "1", "least": str(t.least)})
    response = await routes.metadata(request)
    assert response.status == 200 and json.loads(cast(bytes, response.body))["status"] == "OPEN"
