"""A NEW_TXN whose header write the embedded store refused outright (its writer process stalled past the
queue bound: StoreUnavailableError before anything was sent) created nothing, yet the partition kept the id
in its open set until the requested timeout. Those phantom txns counted against
--max-active-transactions-per-coordinator (10,000 by default) and the active-txn gauge: after a short store
stall with clients retrying NEW_TXN (the Java client retries TransactionCoordinatorNotFound), the healthy
coordinator refused every NEW_TXN with NotAllowedError (which clients do not retry) for up to the requested
timeout (an hour at most). tests/coordinator/test_failures.py has the unknown-outcome case."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
from functools import partial
from pathlib import Path

import pytest

from tc_server.bench.process import descendants_of
from tc_server.client import connect
from tc_server.wire import ServerError
from tests.support.server_process import ServerProcess, started
from tests.support.waiting import until_served

pytestmark = pytest.mark.slow

LIMIT = 50
TTL_MS = 600_000  # the client's timeout: the phantoms would stay this long
RETRY_BOUND_S = 30.0


def stored_open(data_dir: Path, tc_id: int) -> int:
    conn = sqlite3.connect(f"file:{data_dir / 'tc-server.sqlite3'}?mode=ro", uri=True)
    try:
        prefix = f"/txn/id/{tc_id}_"
        rows = conn.execute("SELECT value FROM records WHERE substr(key, 1, ?) = ?", (len(prefix), prefix)).fetchall()
    finally:
        conn.close()
    return sum(1 for (value,) in rows if b'"state":"OPEN"' in bytes(value))


def active_gauge(server: ServerProcess, tc_id: int) -> float:
    _, body = server.get("/metrics")
    found = re.search(rf'^pulsar_txn_active_count{{[^}}]*coordinator_id="{tc_id}"[^}}]*}} (\S+)', body.decode(), re.M)
    assert found, body.decode()[:2000]
    return float(found.group(1))


async def test_new_txns_refused_by_a_stalled_store_do_not_fill_the_active_limit(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = started(ServerProcess(data, "--coordinators", "2", "--request-timeout-s", "1",
                                   "--max-active-transactions-per-coordinator", str(LIMIT)))
    try:
        client = await connect("127.0.0.1", server.port)
        assert (await client.new_txn(tc_id=0, ttl_ms=TTL_MS)).error is None  # the writer process is up
        assert server.proc is not None
        writers = descendants_of(server.proc.pid)
        assert writers
        for pid in writers:
            os.kill(pid, signal.SIGSTOP)
        try:
            # A client retrying NEW_TXN through the stall: the first ones wait on the stopped writer, the
            # later ones are refused at once (the writer is past --request-timeout-s / 2 behind).
            first = [asyncio.ensure_future(client.new_txn(tc_id=0, ttl_ms=TTL_MS)) for _ in range(5)]
            # Well past the queue bound (half the request timeout, 0.5 s): the server measures it on its own clock,
            # and a slow machine that reads these 5 late must still find the writer behind by then.
            await asyncio.sleep(2.0)
            refused = [await client.new_txn(tc_id=0, ttl_ms=TTL_MS) for _ in range(LIMIT - 10)]
            assert all(a.error is ServerError.TransactionCoordinatorNotFound for a in refused), refused[:3]
            assert all("store unavailable" in (a.message or "") for a in refused), refused[:3]
            await asyncio.gather(*first)
        finally:
            for pid in writers:
                os.kill(pid, signal.SIGCONT)
        await asyncio.sleep(1.0)  # the writer catches up with what it had been sent
        really_open = stored_open(data, 0)
        assert really_open < LIMIT, really_open
        for _ in range(10):  # the limit leaves room for these: they are all that is really open
            # A store refusal (TransactionCoordinatorNotFound, "store unavailable": a stall of the loaded machine
            # past half the 1 s request timeout) is retried, as clients do; the limit's NotAllowedError is not.
            after = await until_served(partial(client.new_txn, tc_id=0, ttl_ms=TTL_MS), RETRY_BOUND_S)
            if after.error is not None:
                break
        assert after.error is None, (after, f"{really_open} txns are OPEN in the store",
                                     f"active gauge {active_gauge(server, 0)}")
        assert active_gauge(server, 0) == stored_open(data, 0)
        client.close()
    finally:
        server.stop()
