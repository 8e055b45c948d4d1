"""NEW_TXN's txn_ttl_millis is a protobuf uint64: the values a Java long turns into on the wire (a negative
timeout is 2**64 - n) and the ones at the edges of the limit, on a real tc-server process."""

from __future__ import annotations

from pathlib import Path

from tc_server.client import connect
from tc_server.wire import ServerError
from tests.support.server_process import ServerProcess, started
from tests.support.waiting import async_wait_for


async def test_edge_timeouts_from_the_wire(tmp_path: Path) -> None:
    server = started(ServerProcess(tmp_path / "data", "--coordinators", "2"))
    try:
        client = await connect("127.0.0.1", server.port)
        for ttl in (86_400_001, 2**63 - 1, 2**63, 2**64 - 1):  # above --max-txn-timeout-ms; -1 as a uint64
            refused = await client.new_txn(tc_id=1, ttl_ms=ttl)
            assert refused.error is ServerError.NotAllowedError and refused.most == 1, (ttl, refused)
            assert "86400000" in (refused.message or "")
        assert (await client.new_txn(tc_id=1, ttl_ms=86_400_000)).error is None
        quick = await client.new_txn(tc_id=1, ttl_ms=1)
        assert quick.error is None
        # A 1 ms txn is aborted by the sweep, not kept open.
        await async_wait_for(lambda: server.get_json(
            f"/admin/v3/transactions/transactionMetadata/1/{quick.least}")[1].get("status") == "ABORTED",
            "the 1 ms txn aborted by the timeout sweep", step_s=0.2)
        late = await client.end_txn(1, quick.least, commit=True)
        assert late.error is ServerError.TransactionNotFound
        client.close()
    finally:
        server.stop()
