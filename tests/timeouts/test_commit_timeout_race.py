"""END_TXN COMMIT racing the timeout sweep on a real tc-server process (embedded store), with the store's
writer process stopped (SIGSTOP) across the deadlines so that some decisions' outcomes are unknown when their
requests run out of time. Whatever happened, the answer a client finally got must be the stored decision:
success => COMMITTED, TransactionNotFound ("aborted", as Pulsar answers a commit of an aborted txn) => ABORTED,
and asking again answers the same."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from functools import partial
from pathlib import Path

import pytest

from tc_server.bench.process import descendants_of
from tc_server.client import connect
from tc_server.wire import ServerError
from tests.support.server_process import ServerProcess, started
from tests.support.waiting import until_served

pytestmark = pytest.mark.slow

TXNS = 300
TTL_MS = 2_500
RETRY_BOUND_S = 40.0


async def commit_until_answered(client, most: int, least: int) -> tuple[ServerError | None, str | None]:
    answer = await until_served(partial(client.end_txn, most, least, commit=True), RETRY_BOUND_S)
    return answer.error, answer.message


@pytest.mark.parametrize("stall_writer", [False, True])
async def test_the_final_answer_to_a_commit_at_the_deadline_is_the_stored_decision(tmp_path: Path,
                                                                                 stall_writer: bool) -> None:
    server = started(ServerProcess(tmp_path / "data", "--coordinators", "4", "--request-timeout-s", "0.5"))
    rng = random.Random(7)
    try:
        client = await connect("127.0.0.1", server.port)
        opened = await asyncio.gather(*(until_served(partial(client.new_txn, tc_id=i % 4, ttl_ms=TTL_MS), RETRY_BOUND_S)
                                        for i in range(TXNS)))
        assert all(o.error is None for o in opened), [o for o in opened if o.error][:3]
        start = time.monotonic()

        async def commit_at(o, at_s: float):
            await asyncio.sleep(max(0.0, start + at_s - time.monotonic()))
            return await commit_until_answered(client, o.most, o.least)

        tasks = [asyncio.ensure_future(commit_at(o, rng.uniform(TTL_MS / 1000 - 0.6, TTL_MS / 1000 + 0.4)))
                 for o in opened]
        if stall_writer:
            assert server.proc is not None
            writers = descendants_of(server.proc.pid)
            assert writers, "the embedded store's writer process"
            await asyncio.sleep(TTL_MS / 1000 - 0.4)
            for pid in writers:
                os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(1.2)
            for pid in writers:
                os.kill(pid, signal.SIGCONT)
        answers = await asyncio.gather(*tasks)
        wrong = []
        for o, (error, message) in zip(opened, answers, strict=True):
            code, doc = server.get_json(f"/admin/v3/transactions/transactionMetadata/{o.most}/{o.least}")
            status = doc.get("status") if code == 200 else code
            again = await until_served(partial(client.end_txn, o.most, o.least, commit=True), RETRY_BOUND_S)
            expected = {None: "COMMITTED", ServerError.TransactionNotFound: "ABORTED"}.get(error)
            if status != expected or again.error is not error:
                wrong.append(((o.most, o.least), error, message, status, again.error, again.message))
        assert not wrong, (len(wrong), wrong[:5])
        client.close()
    finally:
        server.stop()
