"""The supervisor's /admin/v3/transactions forwarded to the workers (tc_server/admin/workers_front.py) must not
starve the supervisor's own readiness probes of those workers: a busy admin API is no hung worker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from tests.support.routed_txns import txns_on_coordinators
from tests.support.server_process import started
from tests.workers.helpers import worker_pids, workers_server

# Long enough for a few of the supervisor's poll rounds (0.5 s each).
OBSERVED_S = 10.0
# Two operators' tools (dashboards, scripts), each from its own address and within the supervisor's own admin
# limits (admin/http.py: 128 connections, 32 per address), asking for coordinator 0's slow transactions.
CLIENT_ADDRESSES = ("127.0.0.2", "127.0.0.3")
PER_ADDRESS = 20


async def test_admin_requests_forwarded_to_a_worker_do_not_get_it_killed_as_hung(tmp_path: Path) -> None:
    server = started(workers_server(tmp_path))
    try:
        await txns_on_coordinators(server.port, 4, [0] * 3000, commit=None)
        pids = worker_pids(server)
        url = f"{server.admin_url}/admin/v3/transactions/slowTransactions/0?coordinatorId=0"
        stop = asyncio.Event()

        async def operator(session: aiohttp.ClientSession) -> None:
            while not stop.is_set():
                try:
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=60)) as answer:
                        await answer.read()
                except (aiohttp.ClientError, TimeoutError):
                    await asyncio.sleep(0.05)

        sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, local_addr=(address, 0)))
                    for address in CLIENT_ADDRESSES]
        tasks = [asyncio.create_task(operator(s)) for s in sessions for _ in range(PER_ADDRESS)]
        said: list[str] = []
        own: list[int] = []  # worker 0's own /readyz, asked from an address of its own
        asker = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, local_addr=("127.0.0.4", 0)))
        try:
            deadline = time.monotonic() + OBSERVED_S
            while time.monotonic() < deadline:
                await asyncio.sleep(1)
                code, body = await asyncio.to_thread(server.get_json, "/readyz", 10.0)
                if code != 200:
                    said.append(str(body["workers"][0]["readyz"])[:160])
                async with asker.get(server.worker_admin_url(0) + "/readyz") as answer:
                    own.append(answer.status)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            for session in [*sessions, asker]:
                await session.close()
        killed = [line[:200] for line in server.log_path.read_text().splitlines() if "not answering" in line]
        _, ready = await asyncio.to_thread(server.get_json, "/readyz", 10.0)
        assert not killed and [w["pid"] for w in ready["workers"]] == pids, f"a healthy worker killed as hung: {killed}"
        # Worker 0 is ready all along (its own /readyz says 200 to anyone but the supervisor, whose
        # connections from 127.0.0.1 the forwarded requests use up: 32 per address, admin/http.py). Once the
        # supervisor's probes have found it silent for WORKER_HUNG_S it is killed (seen: "worker not
        # answering; killing it", silent_s 30.4, with the same load held 40 s).
        # A loaded CI machine may make a probe miss its budget now and then (the store's probe, the supervisor's):
        # a tenth of the answers, not the whole observation, which is what the bug was.
        assert own.count(200) >= 0.9 * len(own), own
        assert len(said) <= max(1, len(own) // 10), (
            f"the supervisor's /readyz said 503 {len(said)} times in {OBSERVED_S:.0f} s while both workers were "
            f"ready: {said[:1]}")
    finally:
        assert server.stop(timeout_s=30) == 0, server.log_tail()
