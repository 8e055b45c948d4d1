"""Everything acknowledged survives ``kill -9`` of a real tc-server process on the embedded store,
and txn ids after the restart are greater than every id handed out before."""

from __future__ import annotations

import asyncio

import pytest

from tc_server.client import connect
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.slow


async def test_sigkill_loses_nothing_and_ids_never_go_back(tmp_path):
    server = ServerProcess(tmp_path / "data", "--id-block-size", "50").start()
    try:
        client = await connect("127.0.0.1", server.port)
        opened = await asyncio.gather(*(client.new_txn(tc_id=i % 4, ttl_ms=600_000) for i in range(400)))
        assert all(r.error is None for r in opened)
        committed = opened[:150]
        aborted = opened[150:300]
        left_open = opened[300:]
        results = await asyncio.gather(
            *(client.end_txn(r.most, r.least, commit=True) for r in committed),
            *(client.end_txn(r.most, r.least, commit=False) for r in aborted),
        )
        assert all(r.error is None for r in results)
        # Requests still in flight at the kill have unknown outcomes; everything above was answered.
        pending = [asyncio.ensure_future(client.new_txn(tc_id=0)) for _ in range(200)]
        server.kill()
        await asyncio.gather(*pending, return_exceptions=True)
        client.close()

        server.start()
        for r, want in [(r, "COMMITTED") for r in committed] + [(r, "ABORTED") for r in aborted] + [
            (r, "OPEN") for r in left_open
        ]:
            status, doc = server.get_json(f"/admin/v3/transactions/transactionMetadata/{r.most}/{r.least}")
            assert status == 200 and doc["status"] == want, (r, doc)
        before: dict[int, int] = {}
        for r in opened:
            before[r.most] = max(before.get(r.most, -1), r.least)
        for p in pending:
            if not p.cancelled() and p.exception() is None and p.result().error is None:
                before[0] = max(before[0], p.result().least)
        client = await connect("127.0.0.1", server.port)
        for tc_id in range(4):
            fresh = await client.new_txn(tc_id=tc_id)
            assert fresh.error is None and fresh.least > before[tc_id]
        # The recovered open txns are still governed: they can be ended after the restart.
        r = left_open[0]
        assert (await client.end_txn(r.most, r.least, commit=True)).error is None
        client.close()
    finally:
        server.stop()


async def test_timeouts_are_rebuilt_after_a_kill(tmp_path):
    server = ServerProcess(tmp_path / "data").start()
    try:
        client = await connect("127.0.0.1", server.port)
        t = await client.new_txn(tc_id=1, ttl_ms=1500)
        client.close()
        server.kill()
        server.start()
        for _ in range(100):  # bounded poll; no timing assertion
            status, doc = server.get_json(f"/admin/v3/transactions/transactionMetadata/1/{t.least}")
            if doc["status"] == "ABORTED":
                break
            await asyncio.sleep(0.1)
        assert doc["status"] == "ABORTED"
    finally:
        server.stop()


def test_sigterm_stops_cleanly(tmp_path):
    server = ServerProcess(tmp_path / "data").start()
    assert server.stop() == 0


def test_refuses_another_parallelism(tmp_path):
    server = ServerProcess(tmp_path / "data").start()
    server.stop()
    other = ServerProcess(tmp_path / "data", "--coordinators", "8")
    other.start(wait=False)
    assert other.proc is not None and other.proc.wait(30) == 2  # every failure to start exits 2 (cli.py)
    assert "--coordinators 8" in other.log_tail()


def test_bad_configuration_names_the_setting(tmp_path):
    bad = ServerProcess(tmp_path / "data", "--coordinators", "zero")
    bad.start(wait=False)
    assert bad.proc is not None and bad.proc.wait(30) == 2
    assert "coordinators" in bad.log_tail()
