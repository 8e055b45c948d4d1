"""The admin listings' pages on Oxia, where an index scan goes shard after shard (each shard in key
order), so the records do not come in txn id order overall: every page is still the smallest ids after
``?after=``, and following the pages lists every txn once. The Oxia server is the STAND-IN with 3 shards
(conftest.py says why); tc-server runs in process on it, its admin port read over a real socket."""

from __future__ import annotations

from tc_server.app import start_app
from tc_server.config import Settings
from tc_server.coordinator.layout import Participant
from tests.oxia_standin.server import StandinOxia
from tests.server.test_admin_pages import all_pages, txn_order


async def test_pages_cover_every_txn_once_in_id_order_across_shards(standin: StandinOxia, tmp_path) -> None:
    settings = Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", store="oxia", coordinators=4,
                        oxia_address=standin.address, data_dir=str(tmp_path / "data"), log_format="json").validate()
    app = await start_app(settings)
    try:
        await app.coordinator.wait_recovered()
        opened, decided = set(), set()
        for i in range(240):
            partition = app.coordinator.partition(i % 4)
            least = await partition.new_txn(3_600_000, None)
            if i % 2:
                await partition.add_participants(least, None, [Participant(f"persistent://public/default/t{i}")])
                await partition.end_txn(least, commit=False, principal=None)  # no upstream: stays undelivered
                decided.add(f"({partition.tc_id},{least})")
            else:
                opened.add(f"({partition.tc_id},{least})")
        for path, expected in (("/admin/v3/transactions/slowTransactions/0?limit=25", opened),
                               ("/admin/v3/transactions/undelivered?limit=25", decided)):
            bodies, sizes = await all_pages(app, path)
            listed = [txn if isinstance(body, dict) else txn["txnId"] for body in bodies for txn in body]
            assert len(listed) == len(set(listed)) and set(listed) == expected, path
            assert listed == sorted(listed, key=txn_order), path
            assert max(sizes) == 25, path
    finally:
        await app.stop()
