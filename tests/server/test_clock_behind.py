"""A real tc-server restarted (after kill -9) with its system clock an hour behind the records it finds: the
clock of the host that wrote them was an hour fast and has been corrected (NTP, a VM restored from a snapshot),
or the data directory moved to a machine whose clock is behind. The records are written by a tc-server whose
clock libfaketime puts an hour ahead (tests/support/faketime.py); the restarted one runs on the real clock. That
way round because libfaketime breaks a faked process's graceful stop (see there): the faked one is only killed.
The in-process tests of the same logic are tests/coordinator/test_clock_steps.py.

What must hold: no txn id is handed out twice (ids start from the clock, which is now behind the ids handed out
before), a decision stays as it was, a txn opened before the restart is neither aborted early nor kept open for
the clock's hour, and no header is stamped ended before it was created."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tc_server.client import connect
from tc_server.coordinator import layout
from tc_server.coordinator.layout import TxnHeader, TxnState
from tc_server.store.embedded import EmbeddedStore
from tc_server.wire import ServerError
from tests.support.faketime import faked_clock_env
from tests.support.server_process import ServerProcess, started

HOUR_MS = 3_600_000
# The first process's clock.
AHEAD = "+1h"
# Bound on the abort of a txn of SHORT_TTL_MS after the restart (the timeout sweep runs every ~200 ms).
ABORT_BOUND_S = 60.0
SHORT_TTL_MS = 2_000
LONG_TTL_MS = 600_000


async def status(server: ServerProcess, least: int) -> str | None:
    code, body = await asyncio.to_thread(server.get_json, f"/admin/v3/transactions/transactionMetadata/0/{least}")
    return body.get("status") if code == 200 else None


async def headers(data: Path, leasts: list[int]) -> dict[int, TxnHeader]:
    store = await EmbeddedStore.open(data)
    try:
        found = {}
        for least in leasts:
            record = await store.get(layout.header_path(0, least), partition_key=layout.txn_key(0, least))
            assert record is not None, least
            found[least] = TxnHeader.from_json(record.value)
        return found
    finally:
        await store.close()


async def test_a_tc_server_restarted_an_hour_behind_its_records(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = started(ServerProcess(data, "--coordinators", "1", env=faked_clock_env(AHEAD)))
    try:
        client = await connect("127.0.0.1", first.port)
        assert (await client.tc_client_connect(0)).error is None
        committed = (await client.new_txn(0, LONG_TTL_MS)).least
        assert (await client.end_txn(0, committed, commit=True)).error is None
        long_open = (await client.new_txn(0, LONG_TTL_MS)).least
        short_open = (await client.new_txn(0, SHORT_TTL_MS)).least
        client.close()
    finally:
        first.kill()

    behind = started(ServerProcess(data, "--coordinators", "1"))
    try:
        client = await connect("127.0.0.1", behind.port)
        assert (await client.tc_client_connect(0)).error is None
        fresh = await client.new_txn(0, LONG_TTL_MS)
        assert fresh.error is None and fresh.least > max(committed, long_open, short_open), (
            "an id handed out before the restart could be handed out again", fresh, committed, long_open, short_open)
        # The decision stands: the retried COMMIT is answered success, an ABORT refused.
        assert (await client.end_txn(0, committed, commit=True)).error is None
        assert (await client.end_txn(0, committed, commit=False)).error is ServerError.InvalidTxnStatus
        # Ten minutes of TTL, a few seconds spent: still OPEN, and committed.
        assert await status(behind, long_open) == "OPEN"
        assert (await client.end_txn(0, long_open, commit=True)).error is None
        # Two seconds of TTL, already over: aborted now, not once the clock has caught up an hour.
        deadline = time.monotonic() + ABORT_BOUND_S
        while (found := await status(behind, short_open)) == "OPEN":
            assert time.monotonic() < deadline, (
                f"a txn of {SHORT_TTL_MS} ms still OPEN {ABORT_BOUND_S:.0f} s after the restart: its deadline was "
                "read against a clock an hour behind")
            await asyncio.sleep(0.1)
        assert found == "ABORTED"
        assert (await client.end_txn(0, fresh.least, commit=True)).error is None
        client.close()
    finally:
        assert behind.stop() == 0, behind.log_tail()

    ended = await headers(data, [committed, long_open, short_open, fresh.least])
    assert [ended[least].state for least in (committed, long_open, short_open, fresh.least)] == [
        TxnState.COMMITTED, TxnState.COMMITTED, TxnState.ABORTED, TxnState.COMMITTED]
    for least, header in ended.items():
        assert header.finalized_ms is not None and header.finalized_ms >= header.created_ms, (least, header)
    # The first process did run an hour ahead (else this test proves nothing).
    assert ended[committed].created_ms > int(time.time() * 1000) + HOUR_MS - 300_000, ended[committed]
    assert ended[fresh.least].created_ms < ended[committed].created_ms
