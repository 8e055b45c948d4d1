"""Oxia frozen (the STAND-IN, SIGSTOPped: a partition between tc-server and its store) under `--workers 2`: once
no keep-alive is answered within the session timeout every worker refuses its coordinators' requests (its
/readyz says so). Every worker went on exporting tc_server_coordinator_has_leader 1 for every coordinator, so the
critical alert TcServerCoordinatorWithoutLeader (`max by (cluster, coordinator_id) (...) == 0`) could never fire
while no transaction could be served (a review's)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from tc_server.bench.process import TcServerProcess
from tc_server.client import connect_coordinators
from tests.support.oxia_standin import standin_oxia_and_process
from tests.support.routed_txns import txns_on_coordinators
from tests.support.server_process import started
from tests.support.waiting import async_wait_for
from tests.workers.helpers import COORDINATORS, WORKERS, scrape, workers_server

SESSION_TIMEOUT_MS = 3000


def lapsed(server: TcServerProcess, worker: int) -> bool:
    code, body = server.get_json("/readyz", timeout_s=10, worker=worker)
    return code == 503 and any("no store keep-alive answered" in p for p in body.get("problems", []))


def has_leader(server: TcServerProcess, worker: int) -> dict[int, float]:
    """tc_server_coordinator_has_leader of one worker's scrape, by coordinator."""
    series = scrape(server, worker)
    return {tc_id: series[f'tc_server_coordinator_has_leader{{cluster="standalone",coordinator_id="{tc_id}"}}']
            for tc_id in range(COORDINATORS)}


async def test_coordinators_refused_after_a_lapsed_session_are_not_reported_as_led(tmp_path: Path) -> None:
    with standin_oxia_and_process(tmp_path / "oxia.log", shards=2) as (address, oxia):
        server = started(workers_server(tmp_path, "--oxia-address", address, "--oxia-session-timeout-ms",
                                        str(SESSION_TIMEOUT_MS), store="oxia"))
        try:
            await txns_on_coordinators(server.port, COORDINATORS, range(COORDINATORS))
            assert all(value == 1 for w in range(WORKERS) for value in has_leader(server, w).values())
            routed = await connect_coordinators("127.0.0.1", server.port, COORDINATORS)
            os.kill(oxia.pid, signal.SIGSTOP)
            for worker in range(WORKERS):
                await async_wait_for(lambda w=worker: lapsed(server, w),  # type: ignore[misc]
                                     f"worker {worker}'s /readyz names its coordinators as lapsed", bound_s=30,
                                     step_s=0.2)
            try:
                answer = await asyncio.wait_for(routed[0].new_txn(tc_id=0, ttl_ms=60_000), 15)
                assert answer.error is not None, "a NEW_TXN was served while the session had lapsed"
            except TimeoutError:
                pass  # no answer is a refusal too
            finally:
                for client in {id(c): c for c in routed}.values():
                    client.close()
            # What TcServerCoordinatorWithoutLeader reads: the max over every scraped worker, per coordinator.
            scraped = [await asyncio.to_thread(has_leader, server, worker) for worker in range(WORKERS)]
            best = {tc_id: max(s[tc_id] for s in scraped) for tc_id in range(COORDINATORS)}
            assert set(best.values()) == {0.0}, f"max by (coordinator_id) (has_leader) = {best}"
        finally:
            os.kill(oxia.pid, signal.SIGCONT)
            server.stop(timeout_s=40)
