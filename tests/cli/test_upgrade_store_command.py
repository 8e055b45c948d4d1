"""``tc-server upgrade-store``: an embedded store whose records a tc-server from before 2026-11-30 kept in key order
(WITHOUT ROWID) rewritten into the current shape, offline (tc_server/store/embedded.py,
rewrite_records_in_arrival_order). Every record comes over unchanged and a real tc-server serves the file after it;
it refuses while a tc-server holds the store; killed half-way (SIGKILL of the real process) the file is as it
was, and a second run finishes it."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tc_server.bench.writer_floor import EARLIER_RECORDS
from tc_server.cli import main
from tc_server.coordinator.layout import TxnHeader, TxnState, header_path, txn_key
from tc_server.store.embedded import DB_FILENAME, EmbeddedStore, records_keyed_by_key
from tc_server.store.sqlite_writer import encode_entries
from tests.support.routed_txns import end_txns, txns_on_coordinators
from tests.support.server_process import TC_SERVER, ServerProcess, started

RECORD_COLUMNS = "key, value, version, created_ms, modified_ms, partition_key, ephemeral, entries"


def make_earlier_file(directory: Path) -> None:
    """An empty store file whose records table has the shape before 2026-11-30 (the first open adds the rest of the
    schema, as it does to such a file)."""
    directory.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(directory / DB_FILENAME) as old:
        old.execute("PRAGMA journal_mode=WAL")
        old.executescript(EARLIER_RECORDS)


def contents(directory: Path) -> tuple[bool, list[tuple[object, ...]], list[tuple[object, ...]], int]:
    """(keyed by key?, every record, every index entry, the version counter) of a stopped store's file."""
    with sqlite3.connect(f"{(directory / DB_FILENAME).resolve().as_uri()}?mode=ro", uri=True) as conn:
        return (records_keyed_by_key(conn),
                conn.execute(f"SELECT {RECORD_COLUMNS} FROM records ORDER BY key").fetchall(),  # noqa: S608
                conn.execute("SELECT * FROM index_entries ORDER BY index_name, secondary_key, key").fetchall(),
                conn.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()[0])


def upgrade(data: Path) -> int:
    return main(["upgrade-store", "--store", "embedded", "--data-dir", str(data)])


def test_a_store_a_tc_server_wrote_in_key_order_comes_over_whole_and_is_served(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    make_earlier_file(data)
    server = started(ServerProcess(data, "--coordinators", "2"))
    try:
        asyncio.run(txns_on_coordinators(server.port, 2, [0, 1], commit=True))
        still_open = asyncio.run(txns_on_coordinators(server.port, 2, [0, 1], commit=None))
    finally:
        assert server.stop() == 0, server.log_tail()
    assert "records kept in key order" in server.log_tail(), "the open says how to upgrade the file"
    keyed, records, entries, version = contents(data)
    assert keyed and len(records) >= 2 and entries

    assert upgrade(data) == 0
    out = capsys.readouterr().out
    assert f"{len(records):,} records rewritten in arrival order" in out, out
    assert contents(data) == (False, records, entries, version)
    assert upgrade(data) == 0 and "of the current shape already, unchanged" in capsys.readouterr().out

    server = started(ServerProcess(data, "--coordinators", "2"))
    try:
        asyncio.run(end_txns(server.port, 2, still_open))  # recovered from the rewritten file
        asyncio.run(txns_on_coordinators(server.port, 2, [0, 1], commit=True))
    finally:
        assert server.stop() == 0, server.log_tail()
    assert "records kept in key order" not in server.log_tail()


def test_it_refuses_while_a_tc_server_holds_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    make_earlier_file(data)
    server = started(ServerProcess(data, "--coordinators", "2"))
    try:
        assert upgrade(data) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "in use by a tc-server process: stop it first" in err, err
        asyncio.run(txns_on_coordinators(server.port, 2, [0], commit=True))  # untouched, serving
    finally:
        assert server.stop() == 0, server.log_tail()
    assert contents(data)[0], "still in key order"


def fill_earlier_file(directory: Path, count: int) -> None:
    """``count`` txn headers as tc-server writes them (half OPEN, half COMMITTED, over 16 coordinators), in the
    file of the earlier shape: a rewrite that takes a while."""
    make_earlier_file(directory)
    rows: list[tuple[object, ...]] = []
    entries: list[tuple[str, str, str]] = []
    for n in range(count):
        most, least = n % 16, 1_795_447_209_000_000 + n
        header = TxnHeader(TxnState.OPEN if n % 2 else TxnState.COMMITTED, 1_795_447_209_000 + n, 60_000,
                           None if n % 2 else 1_795_447_209_500 + n)
        key, index = header_path(most, least), list(header.index_entries().items())
        rows.append((key, header.to_json(), n + 1, n, n, txn_key(most, least), encode_entries(index)))
        entries.extend((name, secondary, key) for name, secondary in index)
    conn = sqlite3.connect(directory / DB_FILENAME)
    try:
        with conn:
            conn.execute("INSERT INTO meta VALUES ('version', ?)", (count,))
            conn.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, 0, ?)", rows)
            conn.executemany("INSERT INTO index_entries VALUES (?, ?, ?)", entries)
    finally:
        conn.close()  # the last connection: the write-ahead log goes into the file and is deleted
    assert not (directory / (DB_FILENAME + "-wal")).exists()


def test_killed_half_way_the_file_is_as_it_was_and_a_second_run_finishes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    fill_earlier_file(data, 300_000)
    before, size_before = contents(data), (data / DB_FILENAME).stat().st_size
    wal = data / (DB_FILENAME + "-wal")
    upgrading = subprocess.Popen([TC_SERVER, "upgrade-store", "--store", "embedded", "--data-dir", str(data)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # The copy goes through the write-ahead log: once it holds a few MB the copy is under way (the whole
    # one is ~100 MB), not committed.
    deadline = time.monotonic() + 60
    while not (wal.exists() and wal.stat().st_size > 4 << 20):
        assert upgrading.poll() is None, f"finished before it was seen copying: {upgrading.communicate()}"
        assert time.monotonic() < deadline, "the copy never showed in the write-ahead log"
        time.sleep(0.005)
    os.kill(upgrading.pid, signal.SIGKILL)
    assert upgrading.wait() == -signal.SIGKILL
    assert contents(data) == before, "a copy cut half-way changes nothing"

    assert upgrade(data) == 0
    assert contents(data) == (False, *before[1:])
    # Compacted after the copy: the old table's pages had left the file ~1.75x its size.
    size_after = (data / DB_FILENAME).stat().st_size
    assert size_after < 1.2 * size_before, (size_before, size_after)
    assert not (data / (DB_FILENAME + "-wal")).exists() or (data / (DB_FILENAME + "-wal")).stat().st_size == 0


def test_every_worker_store_of_a_data_directory_is_upgraded(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "workers").write_text("2\n")
    for k in range(2):
        make_earlier_file(data / f"worker-{k}-of-2")

        async def write(directory: Path = data / f"worker-{k}-of-2") -> None:
            store = await EmbeddedStore.open(directory)
            try:
                await store.put("/r/a", b"A", secondary_indexes={"i": "1"})
            finally:
                await store.close()

        asyncio.run(write())
    assert upgrade(data) == 0
    out = capsys.readouterr().out
    assert out.count("1 records rewritten in arrival order") == 2, out
    for k in range(2):
        assert contents(data / f"worker-{k}-of-2")[0] is False


@pytest.mark.parametrize("problem", ["no store", "another store kind"])
def test_where_it_cannot_work_it_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     problem: str) -> None:
    if problem == "no store":
        assert upgrade(tmp_path / "dta") == 2
        expected = "holds no embedded store"
        assert not (tmp_path / "dta").exists(), "nothing is created"
    else:
        assert main(["upgrade-store", "--store", "memory", "--data-dir", str(tmp_path)]) == 2
        expected = "needs no upgrade"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err, err



class VacuumFails(sqlite3.Connection):
    """A connection whose VACUUM fails as on a disk without room for its copy (SQLITE_FULL): a real full disk
    (a small tmpfs) failed it so, by hand; a mount is not for the suite."""

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "VACUUM":
            raise sqlite3.OperationalError("database or disk is full")
        return super().execute(sql, *args)


def test_a_compaction_that_fails_leaves_the_upgrade_done_and_a_second_run_compacts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # It said "cannot upgrade: ... database or disk is full", exit 2, of a file already upgraded, and left the
    # other workers' stores without a word.
    data = tmp_path / "data"
    data.mkdir()
    (data / "workers").write_text("2\n")
    stores = [data / f"worker-{k}-of-2" for k in range(2)]
    for store in stores:
        fill_earlier_file(store, 20_000)
    before = [contents(store) for store in stores]
    sizes = [(store / DB_FILENAME).stat().st_size for store in stores]

    with monkeypatch.context() as patched:
        patched.setattr(sqlite3, "connect", functools.partial(sqlite3.connect, factory=VacuumFails))
        assert upgrade(data) == 0
    out, err = capsys.readouterr()
    assert out.count("20,000 records rewritten in arrival order") == 2, out
    assert err.count("is upgraded but not compacted (VACUUM: OperationalError: database or disk is full)") == 2, err
    assert "cannot upgrade" not in err, err
    assert [contents(store) for store in stores] == [(False, *b[1:]) for b in before]

    assert upgrade(data) == 0
    out, err = capsys.readouterr()
    assert out.count("of the current shape already; compacted in") == 2 and not err, (out, err)
    for store, size in zip(stores, sizes, strict=True):
        assert (store / DB_FILENAME).stat().st_size < 1.2 * size
    assert [contents(store) for store in stores] == [(False, *b[1:]) for b in before]
    assert upgrade(data) == 0 and capsys.readouterr().out.count("of the current shape already, unchanged") == 2
