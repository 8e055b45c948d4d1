"""A worker on Oxia answers on its admin port while it waits for its store (app.open_store_waiting, /readyz
503). Once the store answered, that port closed, and the admin port proper bound only after the coordinators
had started: on an Oxia that came back slow (each read a few seconds, all within --request-timeout-s) over
30 s later, and the supervisor killed the worker as hung in the middle of a start that was progressing, and
again after each restart (a review's). The waiting port now answers until the admin port proper binds
(app.OpenedStore), and a worker not ready yet is taken for hung only after 60 s of silence."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.oxia_standin import server as standin_server
from tests.oxia_standin.server import StandinOxia
from tests.workers.helpers import workers_server

READ_DELAY_S = 5.0  # each read: well within --request-timeout-s (10 s)


# Its waits are long by design (the hang, the supervisor's probes), and a loaded CI machine is slower still: past
# the suite's 120 s default.
pytestmark = pytest.mark.timeout(300)


async def test_a_worker_whose_start_is_slow_after_its_store_came_back_is_not_killed(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    original_read, original_scan = standin_server._Servicer.Read, standin_server._Servicer.RangeScan

    async def slow_read(self, request, context):
        await asyncio.sleep(READ_DELAY_S)
        async for response in original_read(self, request, context):
            yield response

    async def slow_scan(self, request, context):
        await asyncio.sleep(READ_DELAY_S)
        async for response in original_scan(self, request, context):
            yield response

    monkeypatch.setattr(standin_server._Servicer, "Read", slow_read)
    monkeypatch.setattr(standin_server._Servicer, "RangeScan", slow_scan)
    oxia = StandinOxia(shards=1)
    await oxia.start()
    await oxia.stop()  # Oxia down at the start (its port kept for the restart)
    server = workers_server(tmp_path, "--oxia-address", oxia.address, store="oxia", workers=2, coordinators=8)
    await asyncio.to_thread(server.start, False)
    try:
        # The workers wait for their store, answering 503 on their admin ports; the supervisor hears them.
        deadline = time.monotonic() + 30
        while "the metadata store does not answer yet" not in server.log_path.read_text():
            assert time.monotonic() < deadline, "precondition: the workers wait for Oxia"
            await asyncio.sleep(0.2)
        await asyncio.sleep(3)  # a supervisor poll round or two of the waiting admin ports
        await oxia.start()  # back, slow
        deadline = time.monotonic() + 150
        while True:
            log = server.log_path.read_text()
            assert "worker not answering; killing it" not in log, (
                "a worker was killed as hung while its start progressed on a slow store:\n"
                + "\n".join(line for line in log.splitlines() if "killing it" in line)[:600])
            # Both workers got through coordinator.start() and bound their ports (the service's "listening",
            # logged just before the admin port proper binds): their start was progressing, not hung.
            if log.count('"event": "listening"') >= 2:
                return
            assert time.monotonic() < deadline, "no worker got its ports bound within 150 s (and none was killed)"
            await asyncio.sleep(0.5)
    finally:
        await asyncio.to_thread(server.stop, 30)
        await oxia.stop()
