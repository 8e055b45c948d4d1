"""NEW_TXN's txn_ttl_millis is a protobuf uint64: the values a Java long turns into on the wire (a negative
timeout is 2**64 - n) and the ones at the edges of the limit, on a real tc-server process."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tc_server.client import connect
from tc_server.wire import ServerError
from tests.support.server_process import ServerProcess, started


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
        status = None
        for _ in range(100):  # bounded poll: a 1 ms txn is aborted by the sweep, not kept open
            _, doc = server.get_json(f"/admin/v3/transactions/transactionMetadata/1/{quick.least}")
            status = doc.get("status")
            if status == "ABORTED":
                break
            await asyncio.sleep(0.1)
        assert status == "ABORTED"
        late = await client.end_txn(1, quick.least, commit=True)
        assert late.error is ServerError.TransactionNotFound
        client.close()
    finally:
        server.stop()
