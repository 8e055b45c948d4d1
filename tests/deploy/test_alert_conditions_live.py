"""docs/alerts.md: "critical, transactions or clients are failing now". A worker whose embedded store's writer
process is stalled (SIGSTOP: a disk that stops answering) fails every request of its coordinators
(TransactionCoordinatorNotFound after --request-timeout-s), for as long as it lasts, and nothing restarts it.
A real Prometheus with the shipped rules scrapes the supervisor and both workers. While the requests failed,
the condition of no critical rule held (a review's): TcServerRequestsFailing leaves TransactionCoordinatorNotFound
out (clients retry it), and tc_server_coordinator_has_leader stays 1. TcServerTransactionsRefused's holds now."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import yaml

from tc_server.bench.process import descendants_of
from tc_server.client import connect_coordinators
from tests.deploy.test_alerts import RULES, Prometheus
from tests.support.server_process import started
from tests.support.waiting import async_wait_for
from tests.workers.helpers import COORDINATORS, scrape, worker_pids, workers_server

FAILED = 'tc_server_request_errors_total{command="NEW_TXN",error="TransactionCoordinatorNotFound"}'


def critical_rules() -> dict[str, str]:
    doc = yaml.safe_load(RULES.read_text())
    return {rule["alert"]: rule["expr"] for group in doc["groups"] for rule in group["rules"]
            if rule["labels"]["severity"] == "critical"}


async def _keep_asking(port: int, answers: list[str], stop: asyncio.Event) -> None:
    routed = await connect_coordinators("127.0.0.1", port, COORDINATORS)
    client = routed[1]
    try:
        assert (await client.tc_client_connect(1)).error is None
        while not stop.is_set():
            try:
                opened = await asyncio.wait_for(client.new_txn(tc_id=1, ttl_ms=60_000), 10)
                answers.append("ok" if opened.error is None else opened.error.name)
            except TimeoutError:
                answers.append("no answer")
    finally:
        for each in {id(c): c for c in routed}.values():
            each.close()


async def test_a_store_failing_every_transaction_meets_a_critical_rule(tmp_path: Path) -> None:
    server = started(workers_server(tmp_path, "--request-timeout-s", "1"))
    prometheus = None
    writer = None
    stop = asyncio.Event()
    asker = None
    try:
        (tmp_path / "prometheus").mkdir()
        prometheus = Prometheus(tmp_path / "prometheus", *(server.admin_port + i for i in range(3)))
        await async_wait_for(lambda: len(prometheus.query('up{job="tc-server"} == 1')) == 3,
                             "Prometheus scrapes the supervisor and both workers", step_s=0.2)
        (writer,) = descendants_of(worker_pids(server)[1])
        os.kill(writer, signal.SIGSTOP)
        answers: list[str] = []
        asker = asyncio.create_task(_keep_asking(server.port, answers, stop))
        await async_wait_for(lambda: scrape(server, 1).get(FAILED, 0) >= 3,
                             "worker 1 fails NEW_TXNs while its writer is stalled", bound_s=60, step_s=0.2)
        await async_wait_for(lambda: prometheus.query(f"{FAILED} >= 3"), "Prometheus has scraped the failures",
                             bound_s=30, step_s=0.2)
        assert "ok" not in answers[-3:], answers[-10:]
        holding = {name: prometheus.query(expr) for name, expr in critical_rules().items()}
        assert holding["TcServerTransactionsRefused"], (
            f"coordinators 1 and 3 fail every request ({answers[-5:]}), yet no critical rule's condition holds: "
            f"{sorted(holding)}; pending/firing now: {prometheus.alerts()}")
    finally:
        stop.set()
        if writer is not None:
            os.kill(writer, signal.SIGCONT)
        if asker is not None:
            await asyncio.gather(asker, return_exceptions=True)
        if prometheus is not None:
            prometheus.stop()
        server.stop()
