"""A worker whose store does not answer (Oxia hung: a network partition, a frozen Oxia; here the STAND-IN
Oxia, the real one cannot be installed here) answers /readyz 503: README, *Several cores*: "one that answers
503 (its store is down) is not hung" and is not killed."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from tests.support.oxia_standin import standin_oxia_and_process
from tests.support.server_process import started
from tests.workers.helpers import worker_pids, workers_server

# supervisor.WORKER_HUNG_S (30 s) and a few poll rounds more.
OBSERVED_S = 40.0


# Its waits are long by design (the hang, the supervisor's probes), and a loaded CI machine is slower still: past
# the suite's 120 s default.
pytestmark = pytest.mark.timeout(300)


async def test_a_worker_whose_oxia_hangs_answers_503_and_is_not_killed_as_hung(tmp_path: Path) -> None:
    # The supervisor asked each worker's /readyz for 2 s, and the worker waits as long for its store before
    # answering 503: no answer was ever in time, and after 30 s both workers were killed as hung.
    with standin_oxia_and_process(tmp_path / "oxia.log", shards=2) as (address, oxia):
        server = started(workers_server(tmp_path, "--oxia-address", address, store="oxia"))
        try:
            pids = worker_pids(server)
            os.kill(oxia.pid, signal.SIGSTOP)  # Oxia takes connections' bytes and answers nothing
            # The worker itself answers its /readyz, 503 naming the store, to a patient client. Not the first
            # answer necessarily: a probe of the store under way when Oxia stopped (the supervisor's poll's) may
            # have been answered, and a /readyz made meanwhile shares it (admin/routes.py).
            for _ in range(int(OBSERVED_S / 2)):
                code, body = await asyncio.to_thread(server.get_json, "/readyz", 10.0, 0)
                if code == 503:
                    break
                await asyncio.sleep(0.5)
            assert code == 503 and any("metadata store" in p for p in body["problems"]), body
            await asyncio.sleep(OBSERVED_S)
            log_text = server.log_path.read_text()
            assert "worker not answering; killing it" not in log_text, (
                "workers answering 503 (their store unreachable) were killed as hung:\n"
                + "\n".join(line[:300] for line in log_text.splitlines() if "not answering" in line))
            assert await asyncio.to_thread(worker_pids, server) == pids
        finally:
            os.kill(oxia.pid, signal.SIGCONT)
            server.stop(timeout_s=40)
