"""The audit flags decisions whose participant brokers were never told (docs/participants.md): a store
where one committed txn kept its participant records (no upstream to deliver to), one open txn has
records too (not decided: not flagged), and one ended txn had none, exported and audited by the real
PySpark job (local[*])."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tc_server.audit import cli
from tc_server.audit.export import export_snapshot
from tc_server.coordinator.layout import Participant
from tc_server.store import open_store
from tests.audit.conftest import spark
from tests.participants.test_outbox import OTHER, TOPIC, coordinator

__all__ = ["spark"]

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]


async def test_audit_flags_undelivered_decisions(tmp_path: Path, spark: Any) -> None:
    store = await open_store("embedded", data_dir=str(tmp_path / "data"))
    try:
        tc = coordinator(store)  # no sender: the decision cannot be delivered
        await tc.start()
        await tc.wait_recovered()
        p = tc.partition(1)
        undelivered = await p.new_txn(60_000, None)
        await p.add_participants(undelivered, None, [Participant(TOPIC), Participant(OTHER, "sub")])
        await p.end_txn(undelivered, commit=True, principal=None)
        still_open = await p.new_txn(60_000, None)
        await p.add_participants(still_open, None, [Participant(TOPIC)])
        nothing_to_tell = await p.new_txn(60_000, None)
        await p.end_txn(nothing_to_tell, commit=False, principal=None)
        await tc.stop()
        counts = await export_snapshot(store, tmp_path / "snap", source="embedded")
    finally:
        await store.close()
    assert counts["rejects"] == 0
    snapshot = json.loads((tmp_path / "snap" / "snapshot.json").read_text())
    assert snapshot["optional_tables"]["participants"] == {"rows": 3, "rejects": 0}

    # The coordinator's clock is a test clock in the past, so the decision is older than any grace.
    code = cli.main(["--input", str(tmp_path / "snap"), "--output", str(tmp_path / "out")])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert code == 1
    assert summary["violations"]["undelivered_decisions"] == 1
    (row,) = pq.read_table(tmp_path / "out" / "undelivered_decisions").to_pylist()
    assert (row["txn_most"], row["txn_least"], row["state"], row["participants"]) == (1, undelivered, "COMMITTED", 2)
