"""Embedded-store behaviour beyond the conformance suite: durability, crash recovery, group commit."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tc_server.backoff import Backoff
from tc_server.bench.writer_floor import EARLIER_RECORDS
from tc_server.store import embedded, open_store, sqlite_writer
from tc_server.store.api import (
    EXPECT_ABSENT,
    BadVersionError,
    Delete,
    InvalidOperationError,
    Put,
    StoreClosedError,
    StoreUnavailableError,
)
from tc_server.store.embedded import DB_FILENAME, EmbeddedStore
from tests.support.waiting import async_wait_for

REPO = Path(__file__).resolve().parents[2]


async def test_data_survives_close_and_reopen(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    a = await store.put("/r/a", b"A", partition_key="p", secondary_indexes={"n": "1"})
    seq = await store.put_sequential("/r/s", b"S", partition_key="p")
    await store.close()

    store = await EmbeddedStore.open(tmp_path)
    try:
        assert await store.get("/r/a") == a
        assert await store.get(seq.key) == seq
        assert [r.key async for r in store.scan_index("n", "0", "2", partition_key="p")] == ["/r/a"]
        nxt = await store.put_sequential("/r/s", b"", partition_key="p")
        assert nxt.key.endswith("-00000000000000000002")
    finally:
        await store.close()


async def test_versions_are_never_reused_across_restarts(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    await store.put("/r/a", b"")
    last = await store.put("/r/b", b"")
    await store.delete("/r/b")  # the highest version is no longer in any record
    await store.close()

    store = await EmbeddedStore.open(tmp_path)
    try:
        assert (await store.put("/r/c", b"")).version > last.version
    finally:
        await store.close()


async def test_ephemeral_records_are_gone_after_reopen(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    await store.put("/r/e", b"", ephemeral=True)
    await store.close()
    store = await EmbeddedStore.open(tmp_path)
    try:
        assert await store.get("/r/e") is None
    finally:
        await store.close()


async def test_data_dir_is_exclusive(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    try:
        with pytest.raises(StoreUnavailableError, match="in use"):
            await EmbeddedStore.open(tmp_path)
    finally:
        await store.close()
    # Closing released the lock.
    await (await EmbeddedStore.open(tmp_path)).close()


def file_state(path: Path) -> tuple[int, list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """What a read-only open must leave as it was: the layout, every record and the version counter."""
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as conn:
        return (conn.execute("PRAGMA user_version").fetchone()[0],
                conn.execute("SELECT key, value, version, ephemeral FROM records ORDER BY key").fetchall(),
                conn.execute("SELECT * FROM meta").fetchall())


async def test_a_read_only_open_reads_beside_the_store_that_writes_and_changes_nothing(tmp_path: Path) -> None:
    # The audit export (tc-server export) beside a running tc-server: the writer's lock is not needed, the
    # session's ephemeral records stay, every write is refused, and an index first written after the reader
    # opened is found (the writer's store knows its index names from its own puts; a reader cannot).
    writer = await EmbeddedStore.open(tmp_path)
    try:
        await writer.put("/r/e", b"E", ephemeral=True)
        before = file_state(tmp_path / DB_FILENAME)
        reader = await EmbeddedStore.open(tmp_path, read_only=True)
        try:
            await writer.put("/r/a", b"A", secondary_indexes={"later": "1"})
            assert [r.key async for r in reader.scan_prefix("/r/")] == ["/r/a", "/r/e"]
            assert [r.key async for r in reader.scan_index("later", "0", "2")] == ["/r/a"]
            assert await reader.index_has("later", "1")
            with pytest.raises(InvalidOperationError, match="read-only"):
                await reader.put("/r/b", b"")
            with pytest.raises(InvalidOperationError, match="read-only"):
                await reader.delete("/r/a")
            assert reader.write_problem() is None
        finally:
            await reader.close()
        after = file_state(tmp_path / DB_FILENAME)
        assert after[0] == before[0]
        assert [row for row in after[1] if row[0] != "/r/a"] == before[1]
        assert (await writer.put("/r/c", b"")).version > (await writer.get("/r/a")).version  # type: ignore[union-attr]
    finally:
        await writer.close()


async def test_a_read_only_open_of_no_store_creates_none(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailableError, match="there is no"):
        await EmbeddedStore.open(tmp_path / "typo", read_only=True)
    assert not (tmp_path / "typo").exists()
    with sqlite3.connect(tmp_path / DB_FILENAME) as other:
        other.execute("CREATE TABLE notes (x)")
    with pytest.raises(StoreUnavailableError, match=r"is no tc-server store \(its tables: \['notes'\]\)"):
        await EmbeddedStore.open(tmp_path, read_only=True)


async def test_a_read_only_open_reads_a_closed_store_and_a_later_layout_is_refused(tmp_path: Path) -> None:
    await written_and_closed(tmp_path, Put("/r/a", b"A", secondary_indexes={"i": "1"}))
    reader = await EmbeddedStore.open(tmp_path, read_only=True)
    try:
        assert [r.key async for r in reader.scan_index("i", "0", "2")] == ["/r/a"]
    finally:
        await reader.close()
    with sqlite3.connect(tmp_path / DB_FILENAME) as conn:
        conn.execute(f"PRAGMA user_version = {embedded.FILE_LAYOUT + 1}")
    with pytest.raises(StoreUnavailableError, match="later tc-server"):
        await EmbeddedStore.open(tmp_path, read_only=True)


def read_as_another_user(directory: Path) -> str:
    """/r/a of the store in ``directory``, opened read-only by another user (uid 65534, in a forked child: the
    venv's interpreter may sit where that user cannot reach it), or the error it met."""
    if os.geteuid() != 0:
        return asyncio.run(read_only_value(directory))  # this user cannot write the directory either (0555)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            os.setgid(65534)
            os.setuid(65534)
            result = asyncio.run(read_only_value(directory))
        except BaseException as exc:  # noqa: BLE001 - the parent reports it
            result = repr(exc)
        os.write(write_end, result.encode()[:4000])
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        result = answer.read().decode()
    os.waitpid(pid, 0)
    return result


async def read_only_value(directory: Path) -> str:
    store = await EmbeddedStore.open(directory, read_only=True)
    try:
        record = await store.get("/r/a")
        return "none" if record is None else record.value.decode()
    finally:
        await store.close()


async def test_a_read_only_open_of_a_stopped_store_needs_no_writable_directory_and_leaves_nothing(
        tmp_path: Path) -> None:
    # A cleanly stopped store has no -wal / -shm; opened read-only in WAL mode, SQLite created them: the export
    # failed where it could not write the directory (SQLITE_READONLY_DIRECTORY for an auditor's account,
    # SQLITE_CANTOPEN on a volume mounted read-only) and left them behind where it could.
    data = tmp_path / "data"
    await written_and_closed(data, Put("/r/a", b"A"))
    assert sorted(p.name for p in data.iterdir()) == [DB_FILENAME]
    reader = await EmbeddedStore.open(data, read_only=True)
    try:
        assert (await reader.get("/r/a")).value == b"A"  # type: ignore[union-attr]
    finally:
        await reader.close()
    assert sorted(p.name for p in data.iterdir()) == [DB_FILENAME]
    # Another user, who may read the file but not write the directory (tmp_path's parents are 0700: a copy).
    shared = Path(tempfile.mkdtemp(prefix="tc-read-only-"))
    try:
        shutil.copy(data / DB_FILENAME, shared / DB_FILENAME)
        (shared / DB_FILENAME).chmod(0o444)
        shared.chmod(0o555)
        assert read_as_another_user(shared) == "A"
    finally:
        shared.chmod(0o755)
        shutil.rmtree(shared)


async def test_concurrent_writes_are_group_committed(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    sizes: list[int] = []
    store.on_commit = sizes.append
    try:
        records = await asyncio.gather(
            *(store.put(f"/r/{i:03d}", b"", expected_version=-1) for i in range(200)))
    finally:
        await store.close()
    assert len({r.version for r in records}) == 200
    assert sum(sizes) >= 200  # + the ephemeral cleanup at close
    assert max(sizes) > 1


async def test_scans_page_through_results(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path, scan_page_rows=3)
    try:
        children = []
        for i in range(10):
            key = f"/r/{i:02d}"
            children.append(key)
            await store.put(key, b"", secondary_indexes={"n": f"{i % 4}"})
            for j in range(5):  # grandchildren that the prefix scan must skip
                await store.put(f"{key}/{j}", b"")
        assert [r.key async for r in store.scan_prefix("/r/", partition_key="p")] == children
        by_index = [r.key async for r in store.scan_index("n", "0", "9", partition_key="p")]
        assert by_index == sorted(children, key=lambda k: (f"{int(k[3:]) % 4}", k))
        assert [r.key async for r in store.scan_index("n", "1", "3", partition_key="p")] == [
            k for k in by_index if int(k[3:]) % 4 in (1, 2)]
    finally:
        await store.close()


async def test_index_scan_finds_an_index_written_after_open(tmp_path: Path) -> None:
    # The store answers a scan of an index without entries without SQLite; the first entry written
    # (in a batch too) must make the index visible to scans, scoped or not, made before or after it.
    store = await EmbeddedStore.open(tmp_path)
    try:
        early = store.scan_index("idx:new", "a", "z", partition_key="p")
        assert [r.key async for r in store.scan_index("idx:new", "a", "z", partition_key="p")] == []
        await store.put("/r/a", b"A", partition_key="p", secondary_indexes={"idx:new": "m"})
        assert [r.key async for r in early] == ["/r/a"]  # made before the write, iterated after it
        assert [r.key async for r in store.scan_index("idx:new", "a", "z", partition_key="p")] == ["/r/a"]
        assert [r.key async for r in store.scan_index("idx:new", "a", "z")] == ["/r/a"]
        await store.write_batch([Put("/r/b", b"", secondary_indexes={"idx:one": "1", "idx:two": "2"})])
        assert [r.key async for r in store.scan_index("idx:one", "0", "9")] == ["/r/b"]
        assert [r.key async for r in store.scan_index("idx:two", "0", "9")] == ["/r/b"]
        # A name stays known after its last entry went: the scan then asks SQLite, which finds none.
        await store.delete("/r/a")
        assert [r.key async for r in store.scan_index("idx:new", "a", "z", partition_key="p")] == []
    finally:
        await store.close()


async def test_index_scan_finds_entries_of_the_file_after_reopen(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    await store.put("/r/a", b"", secondary_indexes={"idx:a": "1"})
    await store.put("/r/b", b"", secondary_indexes={"idx:b": "2", "idx:c": "3"})
    await store.put("/r/e", b"", secondary_indexes={"idx:eph": "4"}, ephemeral=True)
    await store.close()

    store = await EmbeddedStore.open(tmp_path)
    try:
        for name, key in (("idx:a", "/r/a"), ("idx:b", "/r/b"), ("idx:c", "/r/b")):
            assert [r.key async for r in store.scan_index(name, "0", "9", partition_key="p")] == [key]
            assert [r.key async for r in store.scan_index(name, "0", "9")] == [key]
        # The ephemeral record and its entry went with the session that wrote them.
        assert [r.key async for r in store.scan_index("idx:eph", "0", "9")] == []
    finally:
        await store.close()


async def test_index_scan_without_entries_does_not_touch_sqlite(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    await store.put("/r/a", b"", partition_key="p", secondary_indexes={"idx:a": "1"})
    # Pull the read connections away: a scan that reached SQLite would fail.
    get_conn, scan_conn = store._get_conn, store._scan_conn
    store._get_conn = store._scan_conn = sqlite3.connect(":memory:")
    store._get_conn.close()
    try:
        assert [r async for r in store.scan_index("idx:ops-by-txn", "a", "z", partition_key="p")] == []
        assert [r async for r in store.scan_index("idx:ops-by-txn", "a", "z")] == []
        with pytest.raises(StoreUnavailableError):
            [r async for r in store.scan_index("idx:a", "0", "9", partition_key="p")]
    finally:
        store._get_conn, store._scan_conn = get_conn, scan_conn
        await store.close()


async def test_an_index_no_record_uses_is_surely_empty_until_one_does_also_after_reopen(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    try:
        assert store.index_surely_empty("idx:ops-by-txn")  # END_TXN then skips the query (issue 13)
        await store.put("/r/op", b"", partition_key="p", secondary_indexes={"idx:ops-by-txn": "/txn/op/1_5"})
        assert not store.index_surely_empty("idx:ops-by-txn")
        assert store.index_surely_empty("idx:other")
    finally:
        await store.close()
    store = await EmbeddedStore.open(tmp_path)
    reader = await EmbeddedStore.open(tmp_path, read_only=True)
    try:
        assert not store.index_surely_empty("idx:ops-by-txn")  # the file's names are read at open
        # A read-only open knows nothing: the store that writes the file may add an index at any time.
        assert not reader.index_surely_empty("idx:other")
    finally:
        await reader.close()
        await store.close()


async def test_cas_keeps_created_ms_and_replaces_index_entries(tmp_path: Path) -> None:
    # The writer's CAS is a read of the row then an in-place UPDATE, and a create an INSERT that
    # does nothing on a present key: check what each keeps and replaces, across a reopen too.
    store = await EmbeddedStore.open(tmp_path)
    try:
        first = await store.put("/r/a", b"1", expected_version=-1, secondary_indexes={"i": "1"})
        second = await store.put("/r/a", b"2", expected_version=first.version, secondary_indexes={"i": "2"})
        assert (second.created_ms, second.value) == (first.created_ms, b"2")
        assert await store.get("/r/a") == second
        assert [r.key async for r in store.scan_index("i", "1", "2")] == []  # the old entry went
        with pytest.raises(BadVersionError):
            await store.put("/r/a", b"x", expected_version=first.version)
        third = await store.put("/r/a", b"3", expected_version=second.version)
        assert (third.created_ms, await store.get("/r/a")) == (first.created_ms, third)
        assert [r.key async for r in store.scan_index("i", "0", "9")] == []
        await store.delete("/r/a")
        with pytest.raises(BadVersionError):
            await store.put("/r/a", b"x", expected_version=third.version)
        assert await store.get("/r/a") is None
        kept = await store.put("/r/b", b"", expected_version=-1)
    finally:
        await store.close()

    store = await EmbeddedStore.open(tmp_path)
    try:
        again = await store.put("/r/b", b"B", expected_version=kept.version)
        assert again.created_ms == kept.created_ms and again.version > kept.version
    finally:
        await store.close()


# The schema of tc-server's files before records.entries: each index entry was found by its record through
# an index of index_entries by key (tc_server/store/embedded.py, _upgrade_index_entries).
EARLIER_SCHEMA = """
CREATE TABLE records (key TEXT PRIMARY KEY, value BLOB NOT NULL, version INTEGER NOT NULL,
    created_ms INTEGER NOT NULL, modified_ms INTEGER NOT NULL, partition_key TEXT,
    ephemeral INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE TABLE index_entries (index_name TEXT NOT NULL, secondary_key TEXT NOT NULL, key TEXT NOT NULL,
    PRIMARY KEY (index_name, secondary_key, key)) WITHOUT ROWID;
CREATE INDEX index_entries_by_key ON index_entries (key);
CREATE INDEX records_ephemeral ON records (ephemeral) WHERE ephemeral = 1;
CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO meta (name, value) VALUES ('version', 3);
INSERT INTO records VALUES ('/r/a', x'41', 1, 10, 10, 'p', 0), ('/r/b', x'42', 2, 10, 10, 'p', 0),
    ('/r/c', x'43', 3, 10, 10, 'p', 0);
INSERT INTO index_entries VALUES ('i', '1', '/r/a'), ('j', '1', '/r/a'), ('i', '2', '/r/b');
"""


async def index_keys(store: EmbeddedStore, name: str) -> list[str]:
    return [r.key async for r in store.scan_index(name, "0", "9")]


async def test_a_file_of_the_earlier_layout_keeps_its_index_entries_and_replaces_them_on_update(
        tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / DB_FILENAME) as old:
        old.execute("PRAGMA journal_mode=WAL")
        old.executescript(EARLIER_SCHEMA)
    store = await EmbeddedStore.open(tmp_path)
    try:
        assert (await index_keys(store, "i"), await index_keys(store, "j")) == (["/r/a", "/r/b"], ["/r/a"])
        a = await store.get("/r/a")
        assert a is not None
        await store.put("/r/a", b"A2", expected_version=a.version, secondary_indexes={"i": "3"})
        await store.delete("/r/b")
        assert (await index_keys(store, "i"), await index_keys(store, "j")) == (["/r/a"], [])
        assert [r.key async for r in store.scan_index("i", "3", "4")] == ["/r/a"]
    finally:
        await store.close()
    with sqlite3.connect(tmp_path / DB_FILENAME) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'index_entries_by_key'").fetchall() == []
        assert conn.execute("SELECT * FROM index_entries ORDER BY key").fetchall() == [("i", "3", "/r/a")]


def records_sql(tmp_path: Path) -> str:
    with sqlite3.connect(tmp_path / DB_FILENAME) as conn:
        return str(conn.execute("SELECT sql FROM sqlite_master WHERE name = 'records'").fetchone()[0])


async def test_a_new_file_keeps_records_in_a_rowid_table_with_their_keys_unique(tmp_path: Path) -> None:
    # Rows in arrival order, keys in a unique index: fewer pages per group commit (the comment above
    # embedded._SCHEMA). A second create of a key is still refused by the key's uniqueness.
    store = await EmbeddedStore.open(tmp_path)
    try:
        await store.put("/r/a", b"A", expected_version=EXPECT_ABSENT)
        with pytest.raises(BadVersionError):
            await store.put("/r/a", b"again", expected_version=EXPECT_ABSENT)
    finally:
        await store.close()
    sql = records_sql(tmp_path)
    assert "WITHOUT ROWID" not in sql and "id INTEGER PRIMARY KEY" in sql and "key TEXT NOT NULL UNIQUE" in sql


async def test_a_file_whose_records_are_keyed_by_their_keys_is_served_as_it_is(tmp_path: Path) -> None:
    """Files made before 2026-11-30 keep their WITHOUT ROWID records table: every kind of write and read
    works on it, across a reopen, and the open does not rewrite it."""
    with sqlite3.connect(tmp_path / DB_FILENAME) as old:
        old.execute("PRAGMA journal_mode=WAL")
        old.executescript(EARLIER_RECORDS)
    for run in range(2):
        store = await EmbeddedStore.open(tmp_path)
        try:
            key = f"/r/{run}"
            a = await store.put(key, b"A", expected_version=EXPECT_ABSENT, secondary_indexes={"i": f"{run}"})
            with pytest.raises(BadVersionError):
                await store.put(key, b"again", expected_version=EXPECT_ABSENT)
            b = await store.put(key, b"B", expected_version=a.version, secondary_indexes={"i": f"5{run}"})
            assert b.created_ms == a.created_ms
            assert await store.delete(key, expected_version=b.version)
            await store.put(key, b"C", expected_version=EXPECT_ABSENT, secondary_indexes={"i": f"5{run}"})
            await store.put("/e/held", b"", ephemeral=True)  # the previous run's was dropped at the open
            await store.put_sequential("/s/n", b"", partition_key="p")
            assert [r.key async for r in store.scan_prefix("/e/")] == ["/e/held"]
            assert [r.key async for r in store.scan_prefix("/s/")] == [f"/s/n-{n:020d}" for n in range(1, run + 2)]
            assert [(r.key, r.value) async for r in store.scan_prefix("/r/")] == [
                (f"/r/{n}", b"C") for n in range(run + 1)]
            assert await index_keys(store, "i") == [f"/r/{n}" for n in range(run + 1)]
        finally:
            await store.close()
    assert "WITHOUT ROWID" in records_sql(tmp_path)


async def written_and_closed(tmp_path: Path, *puts: Put) -> None:
    """A store in ``tmp_path`` that wrote ``puts``, closed again (for a test to damage its file)."""
    store = await EmbeddedStore.open(tmp_path)
    try:
        for put in puts:
            await store.put(put.key, put.value, secondary_indexes=put.secondary_indexes, ephemeral=put.ephemeral)
    finally:
        await store.close()


async def test_a_file_an_earlier_tc_server_wrote_again_is_brought_over_again(tmp_path: Path) -> None:
    # An earlier tc-server started on a file of this layout: it recreates its by-key index and moves a
    # record's index entries without touching records.entries, which then lists the entries it had.
    await written_and_closed(tmp_path, Put("/r/a", b"", secondary_indexes={"i": "1"}))
    with sqlite3.connect(tmp_path / DB_FILENAME) as old:
        old.execute("CREATE INDEX index_entries_by_key ON index_entries (key)")
        old.execute("UPDATE index_entries SET secondary_key = '2' WHERE key = '/r/a'")
    store = await EmbeddedStore.open(tmp_path)
    try:
        a = await store.get("/r/a")
        assert a is not None
        await store.put("/r/a", b"", expected_version=a.version, secondary_indexes={"i": "3"})
        assert [(r.key, r.value) async for r in store.scan_index("i", "0", "3")] == []  # entry "2" went too
        assert await index_keys(store, "i") == ["/r/a"]
    finally:
        await store.close()


@pytest.mark.parametrize("damage", ["i", "i\x007", "x\x001", b"i\x001"])
async def test_a_record_whose_entries_list_is_damaged_is_written_and_its_entries_repaired(
        tmp_path: Path, damage: str | bytes) -> None:
    # records.entries says which index rows an update or a delete removes. A damaged list (not pairs, an
    # entry that is not there, not text) failed every write of the key with an IndexError, and with it
    # every other write of its group; one that named another entry left the real one behind for good, and
    # then a create of the key with that entry failed on the index's primary key, for good.
    await written_and_closed(tmp_path, Put("/r/a", b"", secondary_indexes={"i": "1"}),
                             Put("/r/eph", b"", secondary_indexes={"i": "5"}, ephemeral=True))
    with sqlite3.connect(tmp_path / DB_FILENAME) as conn:
        conn.execute("UPDATE records SET entries = ?", (damage,))
    store = await EmbeddedStore.open(tmp_path)  # dropping the ephemeral record reads its list too
    try:
        assert await index_keys(store, "i") == ["/r/a"]
        a = await store.get("/r/a")
        assert a is not None
        updated, other = await asyncio.gather(
            store.put("/r/a", b"", expected_version=a.version, secondary_indexes={"i": "2"}),
            store.put("/r/b", b"", secondary_indexes={"i": "3"}))
        assert [r.key async for r in store.scan_index("i", "1", "2")] == []
        assert await index_keys(store, "i") == ["/r/a", "/r/b"]
        await store.delete("/r/a")
        await store.put("/r/a", b"", secondary_indexes={"i": "1"})
        assert [r.key async for r in store.scan_index("i", "1", "2")] == ["/r/a"]
    finally:
        await store.close()


async def test_an_entry_a_damaged_file_left_does_not_refuse_its_key(tmp_path: Path) -> None:
    await written_and_closed(tmp_path, Put("/r/a", b""))
    with sqlite3.connect(tmp_path / DB_FILENAME) as conn:  # an index row its record does not list
        conn.execute("INSERT INTO index_entries VALUES ('i', '1', '/r/a')")
    store = await EmbeddedStore.open(tmp_path)
    try:
        a = await store.get("/r/a")
        assert a is not None
        await store.put("/r/a", b"", expected_version=a.version, secondary_indexes={"i": "1"})
        assert await index_keys(store, "i") == ["/r/a"]
    finally:
        await store.close()


async def test_a_file_this_code_cannot_read_fails_the_open_naming_it_and_lets_go_of_it(tmp_path: Path) -> None:
    # A value of another type than tc-server writes (a BLOB secondary key in a file of the earlier layout)
    # raised a bare TypeError, and the failed open kept the file's lock: the next open said "in use".
    with sqlite3.connect(tmp_path / DB_FILENAME) as old:
        old.execute("PRAGMA journal_mode=WAL")
        old.executescript(EARLIER_SCHEMA)
        old.execute("UPDATE index_entries SET secondary_key = CAST(secondary_key AS BLOB)")
    for _ in range(2):
        with pytest.raises(StoreUnavailableError, match=f"opening {tmp_path / DB_FILENAME}.*TypeError"):
            await EmbeddedStore.open(tmp_path)


async def test_an_index_entry_get_sees_is_never_denied_by_index_has(tmp_path: Path) -> None:
    # The first entry of an index name was known to the store only once the writer's answer was read;
    # committed before that, the record was there for get() and not for index_has() or scan_index().
    store = await EmbeddedStore.open(tmp_path)
    try:
        await store.put("/warm", b"")
        written = store.start_put("/k", b"v", secondary_indexes={"idx:new": "1"})
        while store._outbox or store._unsent:
            await asyncio.sleep(0)  # sent to the writer
        with sqlite3.connect(tmp_path / DB_FILENAME) as other:
            _block_until(lambda: bool(other.execute("SELECT 1 FROM records WHERE key = '/k'").fetchall()),
                         "the put committed")
        assert not written.done()  # its answer is unread: the loop has not run
        assert await store.get("/k") is not None
        assert await store.index_has("idx:new", "1")
        assert [r.key async for r in store.scan_index("idx:new", "1", "2")] == ["/k"]
        await written
    finally:
        await store.close()


def test_a_writer_of_other_code_on_disk_refuses_to_start(tmp_path: Path) -> None:
    # The writer process imports its module from disk when it starts, maybe long after tc-server did: a
    # package replaced in place under a running tc-server would have run another layout's writer on the file.
    for module, says in (("def main(argv):\n    return 0\n", "cannot import name 'WRITER_LAYOUT'"),
                         ("WRITER_LAYOUT = 1\ndef main(argv):\n    return 0\n", "is not of this tc-server")):
        package = tmp_path / str(len(says))
        (package / "tc_server" / "store").mkdir(parents=True)
        (package / "tc_server" / "__init__.py").write_text("")
        (package / "tc_server" / "store" / "__init__.py").write_text("")
        (package / "tc_server" / "store" / "sqlite_writer.py").write_text(module)
        ended = subprocess.run(sqlite_writer.command(package, tmp_path / DB_FILENAME, 0, 0, 1, os.getpid()),
                               capture_output=True, text=True, timeout=60)
        assert ended.returncode == 1 and says in ended.stderr, ended


async def test_corrupt_file_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / DB_FILENAME).write_bytes(b"this is not an SQLite database" * 100)
    with pytest.raises(StoreUnavailableError, match="opening"):
        await EmbeddedStore.open(tmp_path)
    (tmp_path / DB_FILENAME).unlink()
    await (await EmbeddedStore.open(tmp_path)).close()  # the failed open released the lock


async def test_failed_commit_is_unavailable_and_the_store_keeps_running(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    try:
        await store.put("/r/a", b"", secondary_indexes={"n": "a"})
        # A dying file as SQLite would report it: another connection drops the index table under the
        # writer process, so every group that writes an index entry fails.
        with sqlite3.connect(tmp_path / DB_FILENAME) as other:
            other.execute("DROP TABLE index_entries")
        with pytest.raises(StoreUnavailableError, match="index_entries"):
            await store.put("/r/b", b"", secondary_indexes={"n": "b"})
        assert await store.get("/r/b") is None  # the failed group was rolled back
        # The writer process lives on: a group without index entries commits.
        assert (await store.put("/r/c", b"")).version > (await store.get("/r/a")).version  # type: ignore[union-attr]
    finally:
        await store.close()


async def test_killed_writer_process_fails_its_writes_and_the_next_write_starts_another(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    lost: list[None] = []
    store.on_writer_lost = lambda: lost.append(None)
    try:
        a = await store.put("/r/a", b"")
        writer = store._writer
        assert writer is not None
        # A write in flight when the writer dies: stopped, it cannot answer before the kill.
        os.kill(writer.pid, signal.SIGSTOP)
        in_flight = asyncio.ensure_future(store.put("/r/b", b""))
        await asyncio.sleep(0)  # sent (or at least queued) to the stopped writer
        os.kill(writer.pid, signal.SIGKILL)
        # Its outcome is unknown, and the store says so.
        with pytest.raises(StoreUnavailableError, match="writer process .* is gone"):
            await in_flight
        # The next write starts a new writer process, which reads the version counter from the file.
        c = await store.put("/r/c", b"")
        assert store._writer is not None and store._writer.pid != writer.pid
        assert c.version > a.version
        assert await store.get("/r/a") == a
        assert len(lost) == 1  # tc_server_store_writer_lost_total
    finally:
        await store.close()


def _block_until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` WITHOUT yielding to the event loop (tc-server is "busy": it reads nothing
    from its writer meanwhile); bounded so that a broken test fails instead of hanging."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


async def test_answers_in_the_channel_are_served_when_the_writer_dies_after_sending_them(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    try:
        await store.put("/warm", b"")
        stream = store.notifications("/txn/")
        channel, writer = store._channel, store._writer
        assert channel is not None and writer is not None
        os.kill(writer.pid, signal.SIGSTOP)  # it answers nothing until the loop stops reading (below)
        first = asyncio.ensure_future(store.put("/txn/1", b"v", secondary_indexes={"idx": "a"}))
        while not store._pending or store._outbox or store._unsent:
            await asyncio.sleep(0)  # sent to the writer
        os.kill(writer.pid, signal.SIGCONT)

        def answered() -> bool:
            try:
                return bool(channel.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
            except BlockingIOError:
                return False

        _block_until(answered, "the writer's answer in the channel")
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        # In the same turn another write is sent: it meets the dead writer (EPIPE) before the loop reads.
        second = store._submit([Put("/other", b"v")])
        assert (await first).key == "/txn/1"  # committed and answered: acknowledged, not "unknown"
        with pytest.raises(StoreUnavailableError, match="writer process .* is gone"):
            await second
        await store.put("/txn/2", b"v", secondary_indexes={"idx": "b"})
        assert [r.key async for r in store.scan_index("idx", "", "~")] == ["/txn/1", "/txn/2"]
        # /txn/1's notification came; then the stream broke, since /other may have been committed unseen.
        assert (await asyncio.wait_for(anext(stream), 10)).key == "/txn/1"
        with pytest.raises(StoreUnavailableError, match="re-read the state"):
            await asyncio.wait_for(anext(stream), 10)
    finally:
        await store.close()


async def test_index_names_committed_by_a_writer_killed_before_answering_are_scanned(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    try:
        await store.put("/warm", b"")
        # An answer larger than the socket buffer: the writer blocks sending it, after its COMMIT.
        ops = [Put("/big/" + str(i).zfill(2000), b"v") for i in range(300)]
        ops.append(Put("/txn/1", b"v", secondary_indexes={"idx": "a"}))
        batch = asyncio.ensure_future(store.write_batch(ops))
        while not store._pending or store._outbox or store._unsent:
            await asyncio.sleep(0)  # sent to the writer; its answer cannot all fit in the channel
        writer = store._writer
        assert writer is not None
        with sqlite3.connect(tmp_path / DB_FILENAME) as other:
            _block_until(lambda: bool(other.execute("SELECT 1 FROM index_entries WHERE key = '/txn/1'").fetchall()),
                         "the batch committed")
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        with pytest.raises(StoreUnavailableError):
            await batch  # committed, but its answer never came: the outcome is unknown to the caller
        # Before any new writer answered, a scan asks SQLite about a name it has not heard of: the
        # record is there for get(), so it is there for the scan too.
        assert await store.get("/txn/1") is not None
        assert [r.key async for r in store.scan_index("idx", "", "~")] == ["/txn/1"]
        # A new writer serves the next write.
        await store.put("/txn/2", b"v", secondary_indexes={"idx": "b"})
        assert [r.key async for r in store.scan_index("idx", "", "~")] == ["/txn/1", "/txn/2"]
    finally:
        await store.close()


async def test_a_writer_reads_the_version_counter_under_the_write_lock(tmp_path: Path) -> None:
    # A writer is started on the next write once the channel to the one before broke; should that one
    # still be committing its last group, the new one must continue after that group's versions.
    store = await EmbeddedStore.open(tmp_path)
    await store.put("/a", b"1")
    await store.close()
    path = tmp_path / DB_FILENAME
    previous = sqlite3.connect(path, isolation_level=None)
    previous.execute("BEGIN IMMEDIATE")
    previous.execute("UPDATE meta SET value = 100 WHERE name = 'version'")  # its last group, uncommitted
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout=5000")
    writer = sqlite_writer.Writer(conn, embedded.MAX_GROUP_OPS)
    previous.execute("COMMIT")
    previous.close()
    put = (sqlite_writer.PUT, "/b", b"2", None, None, False, False, None)
    status, _, answers = writer.commit_group([(0, [put])])
    conn.close()
    assert status == sqlite_writer.COMMITTED
    assert answers == [(0, [("/b", 101, answers[0][1][0][2], False)])]


async def test_close_is_shared_and_refuses_writes_that_would_outlive_the_session(tmp_path: Path) -> None:
    store = await EmbeddedStore.open(tmp_path)
    await store.put("/eph/1", b"", ephemeral=True)
    closes = [asyncio.ensure_future(store.close()) for _ in range(2)]
    while not store._closed:
        await asyncio.sleep(0)  # the close has queued its cleanup of the session's ephemeral records
    with pytest.raises(StoreClosedError):
        await store.put("/eph/2", b"", ephemeral=True)
    await asyncio.gather(*closes)
    reopened = await EmbeddedStore.open(tmp_path)
    try:
        assert await reopened.get("/eph/1") is None and await reopened.get("/eph/2") is None
    finally:
        await reopened.close()


async def test_close_ends_a_stopped_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "WRITER_EXIT_S", 0.5)
    store = await EmbeddedStore.open(tmp_path)
    await store.put("/r/a", b"")
    writer = store._writer
    assert writer is not None
    os.kill(writer.pid, signal.SIGSTOP)  # a writer stuck on a hung disk answers nothing
    await store.close()  # bounded: it gives up on the cleanup, then kills the writer
    assert writer.poll() is not None


async def test_a_writer_that_cannot_start_is_retried_after_a_delay_not_per_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "command", lambda *args: [sys.executable, "-c", "import sys; sys.exit(3)"])
    store = await EmbeddedStore.open(tmp_path)
    # A first delay of 1-2 s, not the 25-50 ms of INITIAL_DELAY_S: the refusal below must come inside it, and a
    # stall of the test's process as long as the delay (a loaded CI machine) let a new writer start first.
    store._restarts = Backoff(initial_s=2.0)
    try:
        with pytest.raises(StoreUnavailableError, match="writer process .* is gone"):
            await store.put("/r/a", b"")
        # Right after: refused at once, and no process started for it.
        with pytest.raises(StoreUnavailableError, match="exited without answering; the next one starts in"):
            await store.put("/r/b", b"")
        assert store._writer is None
        monkeypatch.setattr(embedded, "command", sqlite_writer.command)
        store._no_writer_until = 0.0  # the delay is over
        while True:  # a new writer starts and serves
            try:
                record = await store.put("/r/c", b"")
                break
            except StoreUnavailableError:
                await asyncio.sleep(0.01)
        assert await store.get("/r/c") == record
    finally:
        await store.close()


async def test_open_store_factory(tmp_path: Path) -> None:
    embedded = await open_store("embedded", data_dir=str(tmp_path))
    assert isinstance(embedded, EmbeddedStore)
    await embedded.close()
    memory = await open_store("memory", data_dir=str(tmp_path))
    await memory.close()
    with pytest.raises(ValueError, match="unknown store kind"):
        await open_store("zookeeper", data_dir=str(tmp_path))


@pytest.mark.slow
def test_kill_9_loses_nothing_acknowledged(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("kill_writer.py")), str(tmp_path)],
                             stdout=subprocess.PIPE, env=env, cwd=REPO)
    assert child.stdout is not None
    acknowledged: list[str] = []
    try:
        assert child.stdout.readline() == b"ephemeral\n"
        while len(acknowledged) < 2000:
            line = child.stdout.readline()
            assert line.endswith(b"\n"), "the writer stopped before it was killed"
            acknowledged.append(line.decode().strip())
    finally:
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate()
    assert child.returncode == -signal.SIGKILL
    # Lines written before the kill were acknowledged too; a torn last line was not.
    acknowledged += [line.decode() for line in rest.split(b"\n")[:-1]]

    async def check() -> None:
        store = await EmbeddedStore.open(tmp_path)
        try:
            missing = [key for key in acknowledged if await store.get(key) is None]
            assert missing == []
            assert await store.get("/k/ephemeral") is None  # its session died with the process
        finally:
            await store.close()

    asyncio.run(check())


async def test_writes_leave_no_reference_cycles(tmp_path: Path) -> None:
    # Each write used to be a cycle (request -> its future -> the request as result) that only the
    # cyclic GC freed: seven objects per write, ~3.5 % of a core at 64 in flight (issue 13).
    # Refcounting alone must free what a write builds, its results and records included.
    store = await EmbeddedStore.open(tmp_path)
    try:
        await store.put("/r/warm", b"")
        gc.collect()
        gc.disable()
        try:
            for i in range(100):
                record = await store.start_put(f"/r/{i}", b"v", expected_version=EXPECT_ABSENT,
                                               secondary_indexes={"idx:n": str(i)})
                await store.put(f"/r/{i}", b"w", expected_version=record.version)
                await store.write_batch([Put(f"/r/{i}/batch", b""), Delete(f"/r/{i}/batch")])
            unreachable = gc.collect()
        finally:
            gc.enable()
        assert unreachable < 10, f"{unreachable} objects in reference cycles after 300 writes"
    finally:
        await store.close()


async def test_an_answer_that_cannot_be_read_fails_its_own_caller_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug while describing one caller's outcomes (none is known today: validate_put refuses the input
    # that once caused one) must not strand the other callers of the same group commit.
    fill = embedded._fill

    def fill_failing_for_b(request: Any, outcomes: Any, now: int, wanted: Any) -> int:
        if request.ops and request.ops[0].key == "/b":
            raise RuntimeError("a bug")
        return fill(request, outcomes, now, wanted)

    monkeypatch.setattr(embedded, "_fill", fill_failing_for_b)
    store = await EmbeddedStore.open(tmp_path)
    try:
        outcomes = await asyncio.wait_for(asyncio.gather(
            store.put("/a", b"1"), store.put("/b", b"2"), store.put("/c", b"3"), return_exceptions=True), 30)
        assert [type(outcome).__name__ for outcome in outcomes] == ["Record", "StoreUnavailableError", "Record"]
        assert "could not be read" in str(outcomes[1])
        assert await store.get("/b") is not None  # committed; its caller was told the outcome is unknown
    finally:
        await store.close()


async def test_writes_are_refused_at_once_while_the_writer_is_too_far_behind(tmp_path: Path) -> None:
    # A stalled disk or more load than it commits: a write queued behind one unanswered for longer than
    # max_queue_delay_s is refused at once (clients retry it) rather than queued, so the queue, and
    # what a caller waits behind, stays bounded. Before, every write was queued and later committed,
    # long after its caller had given up.
    store = await EmbeddedStore.open(tmp_path, max_queue_delay_s=0.3)
    try:
        await store.put("/r/warm", b"")
        writer = store._writer
        assert writer is not None
        os.kill(writer.pid, signal.SIGSTOP)
        queued = [asyncio.ensure_future(store.put(f"/r/{i}", b"")) for i in range(3)]
        # Waited for, not slept: the lag counts from when the puts' tasks first ran (a slow machine ran them late).
        loop = asyncio.get_running_loop()
        await async_wait_for(lambda: len(store._pending) == 3 and store._behind_s(loop.time()) > 0.35,
                             "the three writes unanswered for over 0.3 s", step_s=0.02)
        with pytest.raises(StoreUnavailableError, match=r"writer process is \d+\.\d s behind \(3 writes unanswered"):
            await store.put("/r/refused", b"")
        refused = store.start_put("/r/refused-too", b"")  # NEW_TXN's way: through its future
        with pytest.raises(StoreUnavailableError, match="s behind"):
            await refused
        assert len(store._pending) == 3  # nothing was queued for them
        os.kill(writer.pid, signal.SIGCONT)
        assert [r.key for r in await asyncio.gather(*queued)] == ["/r/0", "/r/1", "/r/2"]  # the backlog commits
        assert (await store.put("/r/after", b"")).key == "/r/after"
        assert await store.get("/r/refused") is None and await store.get("/r/refused-too") is None
    finally:
        await store.close()


async def test_an_idle_store_whose_writer_stopped_is_a_write_problem_by_the_next_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, an idle store had no unanswered write to tell by: a stopped writer read as ready until the
    # first clients' writes timed out. A check that finds nothing pending, IDLE_PROBE_S after the writer's
    # last answer, hands the writer an empty write; sooner it sends none (the supervisor asks twice a second).
    store = await EmbeddedStore.open(tmp_path, max_queue_delay_s=0.2)
    committed: list[int] = []
    store.on_commit = committed.append
    try:
        await store.put("/warm", b"")
        writer = store._writer
        assert writer is not None
        assert store.write_problem() is None and not store._pending  # answered just now: no probe
        monkeypatch.setattr(embedded, "IDLE_PROBE_S", 0.0)
        os.kill(writer.pid, signal.SIGSTOP)
        try:
            assert store.write_problem() is None  # nothing known yet: the empty write goes out
            await asyncio.sleep(0.4)
            problem = store.write_problem()
            assert problem is not None and "has not answered a write for" in problem, problem
        finally:
            os.kill(writer.pid, signal.SIGCONT)
        await async_wait_for(lambda: not store._pending, "the empty write answered once the writer runs again",
                             step_s=0.01)
        assert store.write_problem() is None
        assert committed == [1]  # the empty writes are not counted as commits of the batch-size metric
    finally:
        await store.close()


async def test_a_writer_far_behind_is_a_write_problem_until_it_answers(tmp_path: Path) -> None:
    # /readyz asked the store a read, which a stalled writer does not hold up: it said ready until requests
    # timed out. The store tells once its oldest unanswered write is as old as writes are refused at.
    store = await EmbeddedStore.open(tmp_path, max_queue_delay_s=0.2)
    try:
        await store.put("/warm", b"")
        writer = store._writer
        assert writer is not None and store.write_problem() is None
        os.kill(writer.pid, signal.SIGSTOP)
        try:
            held = asyncio.ensure_future(store.put("/r/a", b""))
            loop = asyncio.get_running_loop()
            await async_wait_for(lambda: store._behind_s(loop.time()) > 0.25, "the write unanswered for over 0.2 s",
                                 step_s=0.02)
            problem = store.write_problem()
            assert problem is not None and "has not answered a write for" in problem, problem
        finally:
            os.kill(writer.pid, signal.SIGCONT)
        await held
        assert store.write_problem() is None
    finally:
        await store.close()


async def test_scans_made_before_the_close_and_read_after_it_say_the_store_is_closed(tmp_path: Path) -> None:
    # The partition-scoped scan (END_TXN's op lookup) read its first page on the closed read connection and
    # said StoreUnavailableError("scan failed: ProgrammingError: Cannot operate on a closed database").
    store = await EmbeddedStore.open(tmp_path)
    await store.put("/txn/op/1_1-1", b"v", partition_key="1_1", secondary_indexes={"idx": "/txn/op/1_1"})
    across_shards = store.scan_index("idx", "/txn/op/1_1", "/txn/op/1_1\x02")
    one_shard = store.scan_index("idx", "/txn/op/1_1", "/txn/op/1_1\x02", partition_key="1_1")
    await store.close()
    for scan in (across_shards, one_shard):
        with pytest.raises(StoreClosedError):
            await anext(scan)


@pytest.mark.parametrize(("code", "said"), [
    ("SQLITE_IOERR_SHMSIZE", "SQLITE_IOERR_SHMSIZE: no space left on the data directory's disk"),
    ("SQLITE_FULL", "SQLITE_FULL: no space left on the data directory's disk"),
    ("SQLITE_IOERR_FSYNC", "(SQLITE_IOERR_FSYNC)")])
def test_sqlite_failures_name_their_code_and_a_full_disk_says_so(code: str, said: str) -> None:
    # Opened on a full disk (a stopped tc-server started again after the volume filled), SQLite cannot size
    # the WAL's index and says "disk I/O error" (SQLITE_IOERR_SHMSIZE, seen on a full 1 MiB tmpfs): the one
    # line `tc-server run` printed sent the operator after a failing disk.
    failure = sqlite3.OperationalError("disk I/O error")
    failure.sqlite_errorname = code
    message = str(embedded._unavailable("opening /data/tc-server.sqlite3", failure))
    assert message.startswith("embedded store: opening /data/tc-server.sqlite3 failed: OperationalError: disk I/O "
                              "error") and said in message, message


async def test_a_file_of_a_later_layout_is_refused_naming_it_and_left_unchanged(tmp_path: Path) -> None:
    # A rollback after an upgrade that changed the file: the earlier tc-server opened it, wrote into it and
    # misread it (the parallelism record once changed form: read as None, it refused to start for the wrong
    # reason, and headers of the later form were skipped). The file now says its layout (user_version).
    store = await EmbeddedStore.open(tmp_path)
    await store.put("/k", b"v")
    await store.close()
    path = tmp_path / DB_FILENAME
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == embedded.FILE_LAYOUT
        conn.execute(f"PRAGMA user_version = {embedded.FILE_LAYOUT + 1}")  # as a later tc-server marks it
    before = path.read_bytes()
    with pytest.raises(StoreUnavailableError, match=rf"{DB_FILENAME} is of file layout {embedded.FILE_LAYOUT + 1}, "
                                                     rf"written by a later tc-server; this one reads layouts up to "
                                                     rf"{embedded.FILE_LAYOUT}"):
        await EmbeddedStore.open(tmp_path)
    assert path.read_bytes() == before
    with sqlite3.connect(path) as conn:  # an earlier file (0: before the layout was recorded) is taken
        conn.execute("PRAGMA user_version = 0")
    store = await EmbeddedStore.open(tmp_path)
    assert (await store.get("/k")) is not None
    await store.close()


async def test_a_write_that_cannot_be_sent_fails_its_own_caller_only(tmp_path: Path) -> None:
    # A delete whose key the writer channel cannot encode (the store's callers are this code: a bug) raised out of
    # the turn's send, leaving that turn's other writes unsent and unanswered, and the writer "behind" for good:
    # every write was refused until a restart (a review).
    store = await EmbeddedStore.open(tmp_path)
    try:
        unsendable = Delete(threading.Lock())  # type: ignore[arg-type]
        outcomes = await asyncio.wait_for(asyncio.gather(
            store.put("/a", b"1"), store.write_batch([unsendable]), store.put("/c", b"3"), return_exceptions=True), 30)
        assert [type(outcome).__name__ for outcome in outcomes] == ["Record", "InvalidOperationError", "Record"]
        assert "cannot be sent to the writer process" in str(outcomes[1]) and "not applied" in str(outcomes[1])
        assert (await store.put("/d", b"4")).key == "/d"
        assert store.write_problem() is None
    finally:
        await store.close()


async def test_a_frame_that_arrives_in_parts_is_committed_once(tmp_path: Path) -> None:
    # The writer committed (and fsynced) an empty group for each part of a frame that did not complete one
    # request: more commits than groups when the writer reads faster than tc-server sends (a review).
    store = await EmbeddedStore.open(tmp_path)
    await store.close()
    conn = sqlite3.connect(tmp_path / DB_FILENAME, isolation_level=None, check_same_thread=False)
    commits: list[str] = []
    conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    ours, theirs = socket.socketpair()
    serving = threading.Thread(target=sqlite_writer.Writer(conn, 1000).serve, args=(theirs,))
    serving.start()
    try:
        frame = sqlite_writer.encode_frame(
            [(0, [(sqlite_writer.PUT, "/k", b"v" * 1000, None, None, False, False, None)])])
        ours.settimeout(30)  # a bound for a failing test, not a timing check
        ours.sendall(frame[:10])
        time.sleep(0.2)  # the writer has read the part (and, before, committed an empty group for it)
        ours.sendall(frame[10:])
        answers = sqlite_writer.FrameBuffer().feed(ours.recv(65536))
        assert [answer[0] for answer in answers] == [sqlite_writer.COMMITTED]
        assert [request_id for request_id, _ in answers[0][2]] == [0]
        assert commits == ["COMMIT"]
    finally:
        ours.close()
        serving.join()
        theirs.close()
        conn.close()


def test_a_writer_whose_tc_server_is_gone_before_it_asked_to_die_with_it_exits(tmp_path: Path) -> None:
    # prctl(PR_SET_PDEATHSIG) comes tens of ms after the writer's start: a tc-server ended meanwhile signals
    # nothing, and a writer stopped or stalled then held the file's lock against the next one (a review).
    ours, theirs = socket.socketpair()
    lock_fd = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    try:
        not_its_parent = 1  # init: what a writer whose tc-server died is reparented to
        ended = subprocess.run(
            sqlite_writer.command(embedded._PACKAGE_ROOT, tmp_path / DB_FILENAME, theirs.fileno(), lock_fd, 8,
                                  not_its_parent),
            pass_fds=(theirs.fileno(), lock_fd), capture_output=True, text=True, timeout=60)
        assert ended.returncode == 4 and "tc-server (pid 1) is gone; exiting" in ended.stderr, ended
        assert not (tmp_path / DB_FILENAME).exists(), "nothing opened"
    finally:
        ours.close()
        theirs.close()
        os.close(lock_fd)


async def test_writes_queued_while_the_channel_is_full_are_sent_whole_and_in_order(tmp_path: Path) -> None:
    # What the channel does not take waits in one buffer appended to in place (a bytes buffer was copied whole
    # at each append: quadratic in a stalled writer's backlog, a review's).
    store = await EmbeddedStore.open(tmp_path, max_queue_delay_s=600)
    try:
        await store.put("/warm", b"")
        writer = store._writer
        assert writer is not None
        os.kill(writer.pid, signal.SIGSTOP)  # a stalled disk: the channel fills up
        puts: list[asyncio.Future[Any]] = []
        while not isinstance(store._unsent, bytearray) or len(puts) % 100:
            assert len(puts) < 100_000, "the channel never filled up"
            puts.append(asyncio.ensure_future(store.put(f"/q/{len(puts):06d}", b"v" * 1000)))
            await asyncio.sleep(0)
        os.kill(writer.pid, signal.SIGCONT)
        records = await asyncio.wait_for(asyncio.gather(*puts), 120)  # a bound for a failing test
        assert [record.key for record in records] == [f"/q/{n:06d}" for n in range(len(puts))]
        versions = [record.version for record in records]
        assert versions == sorted(set(versions))  # committed in the order they were written, each once
        assert not store._unsent
    finally:
        await store.close()


# Run in a process of its own, as the writer is: SQLite takes these settings only between a shutdown and the
# next start, which no other connection of the process may see.
_ONE_THREAD_PROBE = """
import ctypes, sqlite3, sys
sys.path.insert(0, sys.argv[1])
from tc_server.store.sqlite_writer import loaded_sqlite_library, one_thread_sqlite
applied = one_thread_sqlite() if sys.argv[2] == "set" else None
library = loaded_sqlite_library()
library.sqlite3_memory_used.restype = ctypes.c_int64
conn = sqlite3.connect(sys.argv[3], isolation_level=None)
conn.execute("PRAGMA journal_mode=WAL")
conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v BLOB)")
conn.executemany("INSERT INTO t VALUES (?, ?)", [(str(i), b"x" * 100) for i in range(1000)])
print(applied, library.sqlite3_memory_used(), conn.execute("SELECT count(*) FROM t").fetchone()[0])
"""


@pytest.mark.parametrize("setting", ["set", "as-built"])
def test_the_writer_process_runs_sqlite_without_mutexes_or_memory_counts(tmp_path: Path, setting: str) -> None:
    # The writer's one connection is used by one thread, so SQLite's serialized mode and its memory counts (a
    # mutex per call and per allocation) guard nothing there: one_thread_sqlite turns both off. The memory
    # count is what can be seen from Python: none is kept once it is off, while SQLite as built keeps one.
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", _ONE_THREAD_PROBE, str(embedded._PACKAGE_ROOT), setting,
                          str(tmp_path / "probe.db")], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    applied, memory_used, rows = ran.stdout.split()
    assert rows == "1000", "SQLite serves as before"
    if setting == "set":
        assert (applied, memory_used) == ("True", "0"), ran.stdout
    else:
        assert int(memory_used) > 0, ran.stdout
