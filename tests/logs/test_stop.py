"""SIGTERM while requests wait on a stalled disk (the embedded store's writer stopped with SIGSTOP): what the
stop's lines tell an operator about the requests it cut and the writer it killed. One real process, stopped
once for the module (~13 s)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tc_server.client import connect
from tc_server.wire import ServerError
from tests.logs.support import named
from tests.support.disk import writer_pid
from tests.support.server_process import ServerProcess, started

REQUESTS = 20


async def stop_with_requests_held(server: ServerProcess) -> tuple[list[Any], float]:
    assert server.proc is not None
    client = await connect("127.0.0.1", server.port)
    os.kill(writer_pid(server.proc.pid), signal.SIGSTOP)  # the writer holds every write from now on
    held = [asyncio.ensure_future(client.new_txn(tc_id=0)) for _ in range(REQUESTS)]
    await asyncio.sleep(0.5)
    began = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    answers = await asyncio.gather(*held, return_exceptions=True)
    await asyncio.to_thread(server.proc.wait, 40)
    client.close()
    return answers, time.monotonic() - began


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Any], float]]:
    tmp = tmp_path_factory.mktemp("stop")
    server = started(ServerProcess(tmp / "data", "--coordinators", "1", "--request-timeout-s", "3"))
    try:
        answers, took = asyncio.run(stop_with_requests_held(server))
        yield server.log_path, answers, took
    finally:
        server.kill()


def test_every_request_cut_by_the_stop_is_counted_in_the_log(stopped: tuple[Path, list[Any], float]) -> None:
    # Each cut request is a "request failed" line, of which the limiter lets one a second out and leaves
    # the count of the others to the next one. The process ended first: one line, left_out 0, for 20
    # requests whose outcome is unknown (transactions that may exist and will time out), and no summary.
    # The stopped line now counts what the limiter left out.
    log_path, answers, _ = stopped
    assert {getattr(a, "error", a) for a in answers} == {ServerError.TransactionCoordinatorNotFound}, answers
    failed = named(log_path, "request failed")
    counted = sum(1 + int(e.get("left_out_since_last_line") or 0) for e in failed)
    (stopped_line,) = named(log_path, "stopped")
    counted += sum(stopped_line.get("request_failures_not_logged", {}).values())
    assert counted >= REQUESTS, (
        f"{REQUESTS} requests cut by the stop, the log accounts for {counted}: {failed} {stopped_line}")


def test_the_stuck_writer_line_says_how_long_it_was_waited_for(stopped: tuple[Path, list[Any], float]) -> None:
    # The stop waited WRITER_EXIT_S (10 s) for the stopped writer's last write, then killed it; the line
    # said waited_s=0.0.
    log_path, _, took = stopped
    stuck = named(log_path, "store_writer_stuck")
    assert len(stuck) == 1, stuck
    assert stuck[0]["waited_s"] >= 5, (stuck[0], f"the stop took {took:.1f} s")
