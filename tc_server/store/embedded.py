"""The embedded backend: the durable single-node default (docs/architecture.md §5), one SQLite file.

Usage::

    store = await EmbeddedStore.open("./data")      # creates ./data/tc-server.sqlite3
    store.on_commit = lambda ops: ...               # optional: ops per group commit
    ...
    await store.close()

Durability. The file is in WAL mode with ``synchronous=FULL``: a write's future resolves only after
its ``COMMIT`` returned, which fsyncs the WAL, so a ``kill -9`` (or a power cut) loses nothing that
was acknowledged.

Group commit. One dedicated writer thread owns the write connection. Concurrent writes are queued;
the writer takes everything queued (up to :data:`MAX_GROUP_OPS` operations), applies it in ONE
transaction with one fsync, and resolves every caller's future. An fsync costs milliseconds, so this
is what lets many concurrent conditional puts share one disk flush. As in Oxia, each operation has
its own outcome: a failed condition in one does not fail the others, in the group or in the batch.

Reads never wait for the writer (WAL readers do not block) and a read issued after a write was
acknowledged sees it (every read statement starts a fresh WAL snapshot). A ``get`` is one B-tree
lookup of microseconds, so it runs right on the event loop on its own read-only connection: measured
with ``python -m tc_server.bench.store``, a hop to a reader thread cost ~100 us per get and capped
concurrent gets at ~15k/s against ~55k/s inline. Scans page through keys in a reader thread with a
second read-only connection (keyset pagination, :data:`SCAN_PAGE_ROWS` rows a page), so a scan over
millions of rows neither holds the loop nor memory; a scan is not one snapshot (neither is Oxia's).

Sessions. The process is the session: ephemeral records are deleted by :meth:`EmbeddedStore.close`
and, after a crash, when the file is next opened (the session that owned them is gone). An
exclusive ``flock`` on the database file itself keeps a second process (or store) out: the writer
holds the version counter in memory and must be the only writer. It is no separate file a person
could delete (issue 15), and the kernel drops it with the process, ``kill -9`` included. (SQLite's
own locks are POSIX ``fcntl`` locks, which on Linux never conflict with ``flock``.)

Like the memory store, the data is one "shard": ``partition_key`` is stored but never narrows reads.

Versions come from one counter persisted in the ``meta`` table, so they are never reused, not even
for a key deleted and recreated across restarts (a stale CAS must keep failing).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import itertools
import os
import queue
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import structlog

from tc_server.store.api import (
    EXPECT_ABSENT,
    Delete,
    Notification,
    NotificationType,
    Outcome,
    Put,
    Record,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    WriteResult,
    sequence_key,
    validate_put,
)
from tc_server.store.keys import is_child, now_ms, sequence_suffix, sequence_upper_bound
from tc_server.store.notify import NotificationHub, Subscription
from tc_server.store.writes import StoreWrites, version_matches

log = structlog.get_logger(__name__)

# Rows of a partition-scoped index scan read on the event loop before moving to the reader thread.
INLINE_SCAN_ROWS = 64

DB_FILENAME: Final = "tc-server.sqlite3"
# Oxia's client caps one WriteRequest at 1000 operations (docs/oxia-client.md); the same cap bounds how long
# one transaction holds the writer and how many callers one failed fsync affects.
MAX_GROUP_OPS: Final = 1000
SCAN_PAGE_ROWS: Final = 1000

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS records (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    version INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    modified_ms INTEGER NOT NULL,
    partition_key TEXT,
    ephemeral INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS index_entries (
    index_name TEXT NOT NULL,
    secondary_key TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (index_name, secondary_key, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS index_entries_by_key ON index_entries (key);
CREATE INDEX IF NOT EXISTS records_ephemeral ON records (ephemeral) WHERE ephemeral = 1;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT OR IGNORE INTO meta (name, value) VALUES ('version', 0);
"""

_GET: Final = "SELECT key, value, version, created_ms, modified_ms FROM records WHERE key = ?"
# Scans never bound the upper end in SQL: the caller stops at the first key outside the prefix.
_SCAN_FROM: Final = ("SELECT key, value, version, created_ms, modified_ms FROM records"
                     " WHERE key >= ? ORDER BY key LIMIT ?")
_SCAN_AFTER: Final = ("SELECT key, value, version, created_ms, modified_ms FROM records"
                      " WHERE key > ? ORDER BY key LIMIT ?")
_INDEX_SELECT: Final = ("SELECT e.secondary_key, r.key, r.value, r.version, r.created_ms, r.modified_ms"
                        " FROM index_entries e JOIN records r ON r.key = e.key"
                        " WHERE e.index_name = ? AND e.secondary_key < ? AND ")
_INDEX_FROM: Final = _INDEX_SELECT + "e.secondary_key >= ? ORDER BY e.secondary_key, e.key LIMIT ?"
_INDEX_AFTER: Final = (_INDEX_SELECT
                       + "(e.secondary_key, e.key) > (?, ?) ORDER BY e.secondary_key, e.key LIMIT ?")

# The writer's statements (see _put): a create that does nothing on a present key (rowcount 0), and
# the update of a present key (created_ms kept).
_CREATE: Final = ("INSERT INTO records (key, value, version, created_ms, modified_ms, partition_key, ephemeral)"
                  " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING")
_UPDATE: Final = ("UPDATE records SET value = ?, version = ?, modified_ms = ?, partition_key = ?, ephemeral = ?"
                  " WHERE key = ?")
_INDEX_INSERT: Final = "INSERT INTO index_entries (index_name, secondary_key, key) VALUES (?, ?, ?)"

_T = TypeVar("_T")
_Row = tuple[str, bytes, int, int, int]


def _record(row: _Row) -> Record:
    key, value, version, created_ms, modified_ms = row
    return Record(key, bytes(value), version, created_ms=created_ms, modified_ms=modified_ms)


def _unavailable(what: str, exc: BaseException) -> StoreUnavailableError:
    return StoreUnavailableError(f"embedded store: {what} failed: {type(exc).__name__}: {exc}")


@dataclass(slots=True)
class _WriteRequest:
    """One caller's operations; ``ops is None`` asks the writer to drop the session's ephemerals.

    The writer fills ``notes`` and, for a ``write_batch``, ``results`` (one per op) or, for a single
    put (``wants_record``), ``record`` (the stored record, None if its condition failed): only what
    the caller reads is built (issue 13: per-op objects were a measurable share of the writer's CPU).
    The future resolves with the request itself."""

    ops: Sequence[Put | Delete] | None
    future: asyncio.Future[_WriteRequest]
    wants_record: bool = False
    results: list[WriteResult] = field(default_factory=list)
    record: Record | None = None
    notes: list[Notification] = field(default_factory=list)


_STOP: Final = object()


class EmbeddedStore(StoreWrites):
    """A :class:`~tc_server.store.api.MetadataStore` on one SQLite file; open it with :meth:`open`.

    ``on_commit``, if set, is called on the event loop with the number of operations of each group
    commit (for the ``tc_server_store_batch_size`` metric). Every method raises
    :class:`StoreClosedError` after :meth:`close` (``close`` itself may be called again) and
    :class:`StoreUnavailableError` when SQLite fails (disk full, I/O error, corrupt file); the
    process keeps running.
    """

    on_commit: Callable[[int], None] | None

    def __init__(self, path: Path, lock_fd: int, write_conn: sqlite3.Connection,
                 get_conn: sqlite3.Connection, scan_conn: sqlite3.Connection, version: int,
                 indexed: set[str], max_group_ops: int,
                 scan_page_rows: int) -> None:
        # Use open(); this only wires already opened resources together.
        self.path = path
        self.on_commit = None
        self._lock_fd = lock_fd
        self._write_conn = write_conn
        self._get_conn = get_conn
        self._scan_conn = scan_conn
        self._version = version  # owned by the writer thread from now on
        # The names of the indexes that may hold entries: read from the file at open, and the writer
        # adds a name before it commits an entry of it. Never emptied while open, so a name missing
        # here has no entry at all (this store is the only writer of its file), and scan_index
        # answers without SQLite: END_TXN's idx:ops-by-txn scan, which today's brokers leave empty,
        # was a query on the event loop per transaction (issue 13). The writer only adds; a set's
        # add and `in` are atomic under the GIL.
        self._indexed = indexed
        self._max_group_ops = max_group_ops
        self._scan_page_rows = scan_page_rows
        self._loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue[_WriteRequest | object] = queue.SimpleQueue()
        self._hub = NotificationHub()
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tc-store-read")
        # Daemon: a store the program forgot to close must not keep the interpreter alive; an
        # interrupted transaction is rolled back by SQLite like any crash.
        self._writer = threading.Thread(target=self._writer_main, name="tc-store-write", daemon=True)
        self._closed = False
        self._writer.start()

    @classmethod
    async def open(cls, data_dir: str | os.PathLike[str], *, max_group_ops: int = MAX_GROUP_OPS,
                   scan_page_rows: int = SCAN_PAGE_ROWS) -> EmbeddedStore:
        """Open (creating if needed) ``<data_dir>/tc-server.sqlite3``.

        Deletes the ephemeral records a previous process left behind. Raises
        :class:`StoreUnavailableError` if another store holds the directory, or the file cannot be
        opened or is not a usable database."""
        if max_group_ops < 1 or scan_page_rows < 1:
            raise ValueError("max_group_ops and scan_page_rows must be positive")
        directory = Path(data_dir)
        lock_fd, write_conn, get_conn, scan_conn, version, indexed = await asyncio.to_thread(
            _open_files, directory)
        return cls(directory / DB_FILENAME, lock_fd, write_conn, get_conn, scan_conn, version, indexed,
                   max_group_ops, scan_page_rows)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"embedded store {self.path} is closed")

    # -- writes ---------------------------------------------------------------------------------

    async def _put_record(self, op: Put) -> Record | None:
        done = await self._submit([op], wants_record=True)
        return done.record

    async def write_batch(self, ops: Sequence[Put | Delete]) -> list[WriteResult]:
        """Applies the operations in order, in one transaction (possibly shared with other callers'
        operations); returns once the commit is durable."""
        for op in ops:
            if isinstance(op, Put):
                validate_put(op)
        if not ops:
            self._check_open()
            return []
        return (await self._submit(list(ops))).results

    def _submit(self, ops: list[Put | Delete] | None, *,
                wants_record: bool = False) -> asyncio.Future[_WriteRequest]:
        """Queue the operations for the writer; the caller awaits the returned future (a plain function,
        not a coroutine: one coroutine layer less per write, profiled, issue 13)."""
        self._check_open()
        future: asyncio.Future[_WriteRequest] = self._loop.create_future()
        self._queue.put(_WriteRequest(ops, future, wants_record))
        # Cancelling the caller cancels this future but cannot un-send the write: the outcome is then
        # unknown, as the Protocol says; the writer skips a future that is already done. (No shield():
        # its extra future and callbacks were ~2% of the CPU per transaction, profiled.)
        return future

    # -- the writer thread ----------------------------------------------------------------------

    def _writer_main(self) -> None:
        conn = self._write_conn
        try:
            stopping = False
            while not stopping:
                first = self._queue.get()
                if first is _STOP:
                    break
                assert isinstance(first, _WriteRequest)
                group = [first]
                size = _size(first)
                while size < self._max_group_ops:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stopping = True
                        break
                    assert isinstance(item, _WriteRequest)
                    group.append(item)
                    size += _size(item)
                self._commit_group(conn, group, size)
        finally:
            conn.close()

    def _commit_group(self, conn: sqlite3.Connection, group: list[_WriteRequest], size: int) -> None:
        version = self._version
        # One cursor for the group: conn.execute() builds a cursor per statement (~0.7 us each, a
        # few statements per put). Each execute resets the cursor's previous statement, so none is
        # left active at COMMIT. One timestamp for the group: its puts commit together.
        now = now_ms()
        try:
            cursor = conn.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            for request in group:
                version = _apply_request(cursor, request, version, now, self._indexed)
            cursor.execute("UPDATE meta SET value = ? WHERE name = 'version'", (version,))
            cursor.execute("COMMIT")
        except Exception as exc:  # noqa: BLE001 -- every caller of the group must hear about it
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                error: Exception = _unavailable("write", exc)
                log.exception("store_commit_failed", path=str(self.path), ops=size)
            else:
                error = exc
                log.exception("store_commit_bug", path=str(self.path), ops=size)
            self._to_loop(self._fail_group, group, error)
            return
        self._version = version
        self._to_loop(self._complete_group, group, size)

    def _to_loop(self, fn: Callable[..., None], *args: Any) -> None:
        # The loop may already be closed if the program exits without closing the store.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(fn, *args)

    # -- back on the event loop -----------------------------------------------------------------

    def _complete_group(self, group: list[_WriteRequest], size: int) -> None:
        # Publish before resolving: a caller that reacts to its write already finds it in the
        # notification streams, and streams see commits in commit order. One batch per group (it is
        # one commit): each subscriber is handed and woken once per commit, not once per caller.
        self._hub.publish(itertools.chain.from_iterable(request.notes for request in group))
        for request in group:
            if not request.future.done():
                request.future.set_result(request)
        if self.on_commit is not None:
            self.on_commit(size)

    @staticmethod
    def _fail_group(group: list[_WriteRequest], error: Exception) -> None:
        for request in group:
            if not request.future.done():
                request.future.set_exception(error)

    # -- reads ----------------------------------------------------------------------------------

    async def _read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        self._check_open()
        try:
            return await self._loop.run_in_executor(self._reader, fn, self._scan_conn)
        except sqlite3.Error as exc:
            raise _unavailable("scan", exc) from exc

    async def get(self, key: str, *, partition_key: str | None = None) -> Record | None:
        self._check_open()
        try:
            row = self._get_conn.execute(_GET, (key,)).fetchone()
        except sqlite3.Error as exc:
            raise _unavailable("get", exc) from exc
        return _record(row) if row else None

    def scan_prefix(self, prefix: str, *, partition_key: str | None = None) -> AsyncIterator[Record]:
        self._check_open()
        return self._scan_prefix(prefix)

    async def _scan_prefix(self, prefix: str) -> AsyncIterator[Record]:
        limit = self._scan_page_rows
        after: str | None = None
        while True:
            page = await self._read(
                functools.partial(_children_page, prefix=prefix, after=after, limit=limit))
            for record in page:
                yield record
            if len(page) < limit:
                return
            after = page[-1].key

    def scan_index(
        self,
        index_name: str,
        start_inclusive: str,
        end_exclusive: str,
        *,
        partition_key: str | None = None,
    ) -> AsyncIterator[Record]:
        self._check_open()
        return self._scan_index(index_name, start_inclusive, end_exclusive, inline=partition_key is not None)

    async def _scan_index(self, name: str, start: str, end: str, inline: bool) -> AsyncIterator[Record]:
        if name not in self._indexed:  # checked when iterated: a scan made earlier sees later writes
            return
        limit = self._scan_page_rows
        after: tuple[str, str] | None = None
        if inline:
            # A scan scoped to one partition key is small (one txn's op records: END_TXN runs one
            # per request). Its first page is read on the loop, as gets are, because the thread
            # hop cost more than the query (profiled); a longer scan continues in the reader thread.
            try:
                page = _index_page(self._get_conn, name=name, start=start, end=end, after=None,
                                   limit=INLINE_SCAN_ROWS)
            except sqlite3.Error as exc:
                raise _unavailable("scan", exc) from exc
            for _, record in page:
                yield record
            if len(page) < INLINE_SCAN_ROWS:
                return
            after = page[-1][0]
        while True:
            page = await self._read(
                functools.partial(_index_page, name=name, start=start, end=end, after=after, limit=limit))
            for _, record in page:
                yield record
            if len(page) < limit:
                return
            after = page[-1][0]

    def notifications(self) -> Subscription:
        self._check_open()
        return self._hub.subscribe()

    # -- closing --------------------------------------------------------------------------------

    async def close(self) -> None:
        """End the session: delete its ephemeral records (subscribers see the deletes), finish the
        queued writes, end the notification streams and release the files."""
        if self._closed:
            return
        try:
            await self._submit(None)
        except StoreError as exc:
            # Not fatal: the next open deletes them anyway.
            log.warning("store_ephemeral_cleanup_failed", path=str(self.path), error=str(exc))
        self._closed = True
        self._queue.put(_STOP)
        await asyncio.to_thread(self._writer.join)
        await self._loop.run_in_executor(self._reader, self._scan_conn.close)
        self._reader.shutdown(wait=True)
        self._get_conn.close()
        os.close(self._lock_fd)
        self._hub.close()


def _size(request: _WriteRequest) -> int:
    return 1 if request.ops is None else len(request.ops)


# -- SQL, run in the writer or reader thread -------------------------------------------------------


def _apply_request(cursor: sqlite3.Cursor, request: _WriteRequest, version: int, now: int,
                   indexed: set[str]) -> int:
    """Apply one caller's operations inside the open transaction; returns the next version counter."""
    notes = request.notes
    if request.ops is None:
        keys = [row[0] for row in cursor.execute(
            "SELECT key FROM records WHERE ephemeral = 1 ORDER BY key").fetchall()]
        for key in keys:
            _remove(cursor, key)
            notes.append(Notification(NotificationType.DELETED, key))
        return version
    results = None if request.wants_record else request.results
    for op in request.ops:
        if isinstance(op, Put):
            key, created, existed = _put(cursor, op, version + 1, now, indexed)
            if created is None:
                if results is not None:
                    results.append(WriteResult(Outcome.BAD_VERSION, key))
                continue
            version += 1
            notes.append(Notification(NotificationType.MODIFIED if existed else NotificationType.CREATED,
                                      key, version))
            if results is None:
                request.record = Record(key, bytes(op.value), version, created_ms=created, modified_ms=now)
            else:
                results.append(WriteResult(Outcome.OK, key, version))
        else:
            outcome = _delete(cursor, op)
            if results is not None:
                results.append(WriteResult(outcome, op.key))
            if outcome is Outcome.OK:
                notes.append(Notification(NotificationType.DELETED, op.key))
    return version


def _put(cursor: sqlite3.Cursor, op: Put, version: int, now: int,
         indexed: set[str]) -> tuple[str, int | None, bool]:
    """Store ``op`` at ``version`` inside the open transaction: (the key, its created_ms or None
    when the condition failed and nothing was written, whether the key existed before). Adds the
    names of the index entries it writes to ``indexed``.

    Fewer statements per put in the writer thread (issue 13): a create is one INSERT that does
    nothing on a present key (rowcount 0), with no index entries of an earlier record to delete.
    A write over a present key reads the row first: its version decides, and its created_ms is kept
    (an UPDATE ... RETURNING created_ms instead cost twice a plain UPDATE on SQLite 3.40, measured)."""
    key = sequence_key(op.key, _highest_sequence(cursor.connection, op.key) + 1) if op.sequential else op.key
    value = bytes(op.value)
    row = None
    # A sequential key is absent by construction; a create-if-absent needs no read: the INSERT tells.
    if not (op.expected_version == EXPECT_ABSENT or op.sequential):
        row = cursor.execute("SELECT version, created_ms FROM records WHERE key = ?", (key,)).fetchone()
        if not version_matches(row[0] if row else None, op.expected_version):
            return key, None, row is not None
    created: int
    if row is None:
        cursor.execute(_CREATE, (key, value, version, now, now, op.partition_key, int(op.ephemeral)))
        if cursor.rowcount == 0:  # only a create-if-absent can meet a present key here
            return key, None, True
        created, existed = now, False
    else:
        cursor.execute(_UPDATE, (value, version, now, op.partition_key, int(op.ephemeral), key))
        created, existed = row[1], True
        cursor.execute("DELETE FROM index_entries WHERE key = ?", (key,))
    entries = op.secondary_indexes
    if len(entries) == 1:
        ((name, secondary),) = entries.items()
        indexed.add(name)
        cursor.execute(_INDEX_INSERT, (name, secondary, key))
    elif entries:
        indexed.update(entries)
        cursor.executemany(_INDEX_INSERT, [(name, secondary, key) for name, secondary in entries.items()])
    return key, created, existed


def _delete(cursor: sqlite3.Cursor, op: Delete) -> Outcome:
    row = cursor.execute("SELECT version FROM records WHERE key = ?", (op.key,)).fetchone()
    if not version_matches(row[0] if row else None, op.expected_version):
        return Outcome.BAD_VERSION
    if row is None:
        return Outcome.NOT_FOUND
    _remove(cursor, op.key)
    return Outcome.OK


def _remove(cursor: sqlite3.Cursor, key: str) -> None:
    cursor.execute("DELETE FROM records WHERE key = ?", (key,))
    cursor.execute("DELETE FROM index_entries WHERE key = ?", (key,))


def _highest_sequence(conn: sqlite3.Connection, prefix: str) -> int:
    # Walk down from just above prefix-99..9 to the first key of the exact sequence shape
    # (Oxia: the last key below prefix-<max>).
    cursor = conn.execute("SELECT key FROM records WHERE key >= ? AND key < ? ORDER BY key DESC",
                          (prefix + "-", sequence_upper_bound(prefix)))
    try:
        for (key,) in cursor:
            number = sequence_suffix(key, prefix)
            if number is not None:
                return number
        return 0
    finally:
        cursor.close()


def _children_page(conn: sqlite3.Connection, *, prefix: str, after: str | None, limit: int) -> list[Record]:
    """Up to ``limit`` children of ``prefix`` after ``after``. Grandchildren are skipped a whole
    subtree at a time (seek past ``<child>/``), so listing ``/txn/`` does not read every op record."""
    sql, lower = (_SCAN_FROM, prefix) if after is None else (_SCAN_AFTER, after)
    page: list[Record] = []
    while True:
        cursor = conn.execute(sql, (lower, limit))
        try:
            seen = 0
            skip_to: str | None = None
            for row in cursor:
                seen += 1
                key = row[0]
                if not key.startswith(prefix):
                    return page
                if is_child(key, prefix):
                    page.append(_record(row))
                    if len(page) == limit:
                        return page
                    continue
                # key = prefix + child + "/" + ...; "0" is the character right after "/".
                skip_to = key[:key.index("/", len(prefix))] + "0"
                break
        finally:
            cursor.close()
        if skip_to is not None:
            sql, lower = _SCAN_FROM, skip_to
        elif seen < limit:
            return page
        else:
            sql, lower = _SCAN_AFTER, page[-1].key


def _index_page(conn: sqlite3.Connection, *, name: str, start: str, end: str,
                after: tuple[str, str] | None, limit: int) -> list[tuple[tuple[str, str], Record]]:
    if after is None:
        rows = conn.execute(_INDEX_FROM, (name, end, start, limit)).fetchall()
    else:
        rows = conn.execute(_INDEX_AFTER, (name, end, after[0], after[1], limit)).fetchall()
    return [((row[0], row[1]), _record(row[1:])) for row in rows]


def _open_files(
        directory: Path) -> tuple[int, sqlite3.Connection, sqlite3.Connection, sqlite3.Connection, int, set[str]]:
    """Lock the database file, open the connections, prepare the schema and drop stale ephemerals;
    returns the lock, the connections, the version counter and the names of the indexes with entries."""
    path = directory / DB_FILENAME
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # This descriptor stays open until every connection is closed: closing any descriptor of the
        # file would drop SQLite's POSIX locks of this process (see "How To Corrupt" in SQLite's docs).
        lock_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _unavailable(f"opening {path}", exc) from exc
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(lock_fd)
        raise StoreUnavailableError(
            f"embedded store: {path} is in use by another tc-server process (or store)") from exc
    opened: list[sqlite3.Connection] = []
    try:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves (one transaction per group).
        write_conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        opened.append(write_conn)
        _require_wal(write_conn, path)
        write_conn.execute("PRAGMA synchronous=FULL")
        write_conn.execute("PRAGMA busy_timeout=5000")
        write_conn.executescript(_SCHEMA)
        # The session that owned these records is gone (Oxia expires them with the session).
        write_conn.execute("BEGIN IMMEDIATE")
        write_conn.execute(
            "DELETE FROM index_entries WHERE key IN (SELECT key FROM records WHERE ephemeral = 1)")
        write_conn.execute("DELETE FROM records WHERE ephemeral = 1")
        write_conn.execute("COMMIT")
        version = int(write_conn.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()[0])
        indexed = _index_names(write_conn)
        # Two read connections: a statement open on one would pin its snapshot for the other's reads.
        get_conn = _read_connection(path)
        opened.append(get_conn)
        scan_conn = _read_connection(path)
    except (sqlite3.Error, StoreUnavailableError) as exc:
        for conn in opened:
            conn.close()
        os.close(lock_fd)
        if isinstance(exc, StoreUnavailableError):
            raise
        raise _unavailable(f"opening {path}", exc) from exc
    return lock_fd, write_conn, get_conn, scan_conn, version, indexed


def _index_names(conn: sqlite3.Connection) -> set[str]:
    """The distinct index names of ``index_entries``: one primary-key seek per name (the name leads
    the key), not a read of every entry."""
    names: set[str] = set()
    row = conn.execute("SELECT min(index_name) FROM index_entries").fetchone()
    while row is not None and row[0] is not None:
        names.add(row[0])
        row = conn.execute("SELECT min(index_name) FROM index_entries WHERE index_name > ?", (row[0],)).fetchone()
    return names


def _read_connection(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA query_only=1")
    # WAL readers only wait while a crashed writer's WAL index is rebuilt; get() runs on the event
    # loop, so keep any such wait short and let the caller see StoreUnavailableError instead.
    conn.execute("PRAGMA busy_timeout=100")
    return conn


def _require_wal(conn: sqlite3.Connection, path: Path) -> None:
    # WAL needs shared memory (no network file systems); without it durability and concurrent
    # reads would silently differ from what this module promises.
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreUnavailableError(f"embedded store: {path} cannot use WAL mode (got {mode})")
