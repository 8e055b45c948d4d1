"""The operator's data directory over months: odd paths, a copy moved elsewhere, a backup restored. Real
processes on the embedded store."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterable
from pathlib import Path

import pytest

from tc_server.store.embedded import DB_FILENAME
from tests.support.routed_txns import txns_on_coordinators
from tests.support.server_process import ServerProcess, started

pytestmark = pytest.mark.slow


async def _open_and_end(server: ServerProcess, tc_ids: Iterable[int], commit: bool = True,
                        coordinators: int = 4) -> list[tuple[int, int]]:
    return await txns_on_coordinators(server.port, coordinators, tc_ids, commit=commit)


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_data_dir_with_spaces_and_unicode_serves_and_survives_a_restart(tmp_path: Path, workers: int) -> None:
    data = tmp_path / "my data ü é 😀 'q' $x" / "tc server"
    server = started(ServerProcess(data, "--coordinators", "4", "--workers", str(workers)))
    try:
        ids = await _open_and_end(server, range(4))
        server.stop()
        server.start()
        for most, least in ids:
            status, doc = server.get_json(f"/admin/v3/transactions/transactionMetadata/{most}/{least}",
                                          worker=None if workers == 1 else most % workers)
            assert status == 200 and doc["status"] == "COMMITTED", doc
    finally:
        server.stop()


async def test_a_copy_of_a_stopped_data_dir_goes_on_where_it_was(tmp_path: Path) -> None:
    server = started(ServerProcess(tmp_path / "old", "--coordinators", "4"))
    try:
        ids = await _open_and_end(server, range(4))
    finally:
        server.stop()
    shutil.copytree(tmp_path / "old", tmp_path / "new")
    moved = started(ServerProcess(tmp_path / "new", "--coordinators", "4"))
    try:
        for most, least in ids:
            status, doc = moved.get_json(f"/admin/v3/transactions/transactionMetadata/{most}/{least}")
            assert status == 200 and doc["status"] == "COMMITTED", doc
        later = await _open_and_end(moved, range(4))
        assert all(least > dict(ids)[most] for most, least in later)
    finally:
        moved.stop()


async def test_a_restored_backup_never_hands_out_an_id_again(tmp_path: Path) -> None:
    # A backup restored goes back in time: its id sequences are behind the ids handed out since, and brokers
    # drop the messages of a txn whose id they saw aborted. No block starts below the clock's floor
    # (coordinator/ids.py), so no id handed out after the backup is handed out again.
    data = tmp_path / "data"
    server = started(ServerProcess(data, "--coordinators", "2", "--id-block-size", "10"))
    try:
        await _open_and_end(server, range(2), coordinators=2)
        server.stop()
        shutil.copytree(data, tmp_path / "backup")
        server.start()
        after_backup = await _open_and_end(server, [0, 1] * 30, commit=False, coordinators=2)  # past several blocks
        server.stop()
        shutil.rmtree(data)
        shutil.copytree(tmp_path / "backup", data)
        server.start()
        again = await _open_and_end(server, [0, 1] * 30, commit=False, coordinators=2)
        seen = set(after_backup)
        assert not seen & set(again), sorted(seen & set(again))[:5]
        for tc_id in (0, 1):
            assert min(least for most, least in again if most == tc_id) > max(
                least for most, least in after_backup if most == tc_id)
    finally:
        server.stop()


async def test_an_online_backup_of_a_running_store_serves_what_was_decided_before_it(tmp_path: Path) -> None:
    # README, Operations, Backups: SQLite's online backup of the running store's file, into an empty
    # directory, is a store a tc-server serves.
    server = started(ServerProcess(tmp_path / "data", "--coordinators", "4"))
    try:
        ids = await _open_and_end(server, range(4))
        (tmp_path / "backup").mkdir()
        with sqlite3.connect(tmp_path / "data" / DB_FILENAME) as running, \
                sqlite3.connect(tmp_path / "backup" / DB_FILENAME) as copy:
            running.backup(copy)
        running.close()
        copy.close()
        later = await _open_and_end(server, range(4))
    finally:
        server.stop()
    restored = started(ServerProcess(tmp_path / "backup", "--coordinators", "4"))
    try:
        for most, least in ids:
            status, doc = restored.get_json(f"/admin/v3/transactions/transactionMetadata/{most}/{least}")
            assert status == 200 and doc["status"] == "COMMITTED", doc
        for most, least in later:  # decided after the backup: not in it
            assert restored.get_json(f"/admin/v3/transactions/transactionMetadata/{most}/{least}")[0] == 404
    finally:
        restored.stop()
