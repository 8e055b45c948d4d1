"""End to end: a real tc-server process, real wire-protocol clients, `tc-server export`, the audit.

Committed, aborted, timed-out (committed after its deadline: the server aborts it) and one txn left
OPEN past its deadline with the timeout sweep off; the audit must see exactly that.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tc_server.audit import cli
from tc_server.client import connect
from tc_server.wire import ServerError
from tests.support.server_process import TC_SERVER, ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

SHORT_TTL_MS = 1_000


async def _drive(port: int) -> dict[str, Any]:
    client = await connect("127.0.0.1", port)
    try:
        for tc in (0, 1):
            assert (await client.tc_client_connect(tc)).error is None
        short = [await client.new_txn(tc, SHORT_TTL_MS) for tc in (0, 1)]
        assert all(r.error is None for r in short)
        timed_out, left_open = short
        committed: list[tuple[int, int]] = []
        aborted: list[tuple[int, int]] = []
        for i in range(6):
            r = await client.new_txn(i % 2, 60_000)
            assert r.error is None
            end = await client.end_txn(r.most, r.least, commit=i < 4)
            assert end.error is None, end
            (committed if i < 4 else aborted).append((r.most, r.least))
        await asyncio.sleep(SHORT_TTL_MS / 1000 + 0.5)
        # Past its deadline and asked to commit: the coordinator aborts it and says so (docs/semantics.md §2).
        late = await client.end_txn(timed_out.most, timed_out.least, commit=True)
        assert late.error is ServerError.TransactionNotFound and "timed out" in (late.message or ""), late
        return {
            "committed": committed,
            "aborted": [*aborted, (timed_out.most, timed_out.least)],
            "open": (left_open.most, left_open.least),
        }
    finally:
        client.close()


def test_server_export_audit(tmp_path: Path, spark: Any) -> None:
    server = ServerProcess(tmp_path / "data", "--no-timeout-sweep", "--coordinators", "4")
    server.start()
    try:
        txns = asyncio.run(_drive(server.port))
        # The open txn's deadline is behind us; with the sweep off nothing aborted it. Exported as operators
        # do, beside the running server.
        time.sleep(0.1)
        export = subprocess.run(
            [TC_SERVER, "export", "--store", "embedded", "--data-dir", str(tmp_path / "data"),
             "--out", str(tmp_path / "snap"), "--no-progress"],
            capture_output=True, text=True, timeout=120,
        )
        assert export.returncode == 0, export.stderr
    finally:
        assert server.stop() == 0, server.log_tail()
    snapshot = json.loads((tmp_path / "snap" / "snapshot.json").read_text())
    assert snapshot["row_counts"]["headers"] == 8
    assert snapshot["rejects"] == {"headers": 0, "ops": 0, "tc_seq": 0}

    # Grace 0: the open txn is 0.5+ s past its deadline when the export starts.
    code = cli.main(["--input", str(tmp_path / "snap"), "--output", str(tmp_path / "out"), "--grace-s", "0"])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert code == 1
    assert summary["counts_by_state"] == {"OPEN": 1, "COMMITTED": 4, "ABORTED": 3}
    assert summary["violations"] == {
        "open_past_deadline": 1,
        "gc_backlog": 0,
        "gc_backlog_ops": 0,
        "orphan_ops": 0,
        "late_ops": 0,
        "id_reuse_risk": 0,
        "illegal_headers": 0,
        "undelivered_decisions": 0,
        "decision_mismatch": 0,
    }
    import pyarrow.parquet as pq

    (row,) = pq.read_table(tmp_path / "out" / "open_past_deadline").to_pylist()
    assert (row["txn_most"], row["txn_least"]) == txns["open"]
    assert summary["latency_ms"]["COMMITTED"]["txns"] == 4
    assert summary["latency_ms"]["ABORTED"]["txns"] == 3
    assert summary["total_txns"] == 8
