"""The audit export on Oxia finds every coordinator's participant records. They are found through
``idx:participants-by-coordinator``, whose keys are ``<most>/<least>``; Oxia orders keys with more
``/`` after those with fewer, so the range over every coordinator must hold keys with one ``/``. The
Oxia server is the STAND-IN with 3 shards (conftest.py says why); tc-server runs in process on it."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from tc_server.app import start_app
from tc_server.audit.export import export_snapshot
from tc_server.audit.schema import PARTICIPANTS
from tc_server.config import Settings
from tc_server.coordinator.layout import Participant
from tests.oxia_standin.server import StandinOxia


async def test_export_lists_every_coordinators_participants(standin: StandinOxia, tmp_path: Path) -> None:
    settings = Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", store="oxia", coordinators=4,
                        oxia_address=standin.address, data_dir=str(tmp_path / "data"), log_format="json").validate()
    app = await start_app(settings)
    try:
        await app.coordinator.wait_recovered()
        expected = set()
        for i in range(24):
            partition = app.coordinator.partition(i % 4)
            least = await partition.new_txn(3_600_000, None)
            topic = f"persistent://public/default/t{i}"
            await partition.add_participants(least, None, [Participant(topic), Participant(topic, "sub")])
            expected |= {(partition.tc_id, least, topic, None), (partition.tc_id, least, topic, "sub")}
        counts = await export_snapshot(app.coordinator.store, tmp_path / "snap", source="oxia")
    finally:
        await app.stop()
    assert counts["rejects"] == 0
    rows = pq.read_table(tmp_path / "snap" / PARTICIPANTS).to_pylist()
    exported = [(r["txn_most"], r["txn_least"], r["topic"], r["subscription"]) for r in rows]
    assert len(exported) == len(set(exported)) and set(exported) == expected
