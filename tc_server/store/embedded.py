"""The embedded backend: the durable single-node default (docs/architecture.md §5), one SQLite file.

Usage::

    store = await EmbeddedStore.open("./data")      # creates ./data/tc-server.sqlite3
    store.on_commit = lambda ops: ...               # optional: ops per group commit
    ...
    await store.close()

Durability. The file is in WAL mode with ``synchronous=FULL``: a write's future resolves only after
its ``COMMIT`` returned, which fsyncs the WAL, so a ``kill -9`` (or a power cut) loses nothing that
was acknowledged.

Group commit. One writer process owns the write connection (tc_server/store/sqlite_writer.py says why
a process and not a thread). Writes made during one turn of the event loop go to it in one frame; it
takes everything that has arrived (up to :data:`MAX_GROUP_OPS` operations), applies it in ONE
transaction with one fsync, and answers; then the callers' futures resolve. An fsync costs up to
milliseconds, so this is what lets many concurrent conditional puts share one disk flush. As in Oxia,
each operation has its own outcome: a failed condition in one does not fail the others, in the group
or in the batch. If the writer process dies, the writes in flight fail with
:class:`StoreUnavailableError` (their outcome is unknown) and the next write starts a new one.

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
could delete (issue 15), and the kernel drops it with the process, ``kill -9`` included; the writer
process holds it too, so a tc-server killed while its writer finishes a group is not replaced until
that writer is gone (open waits up to :data:`LOCK_WAIT_S` for it). (SQLite's own locks are POSIX
``fcntl`` locks, which on Linux never conflict with ``flock``.)

Like the memory store, the data is one "shard": ``partition_key`` is stored but never narrows reads.

Versions come from one counter persisted in the ``meta`` table, so they are never reused, not even
for a key deleted and recreated across restarts (a stale CAS must keep failing).
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import itertools
import operator
import os
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple, TypeVar

import structlog

from tc_server.backoff import Backoff
from tc_server.logs import LogLimiter
from tc_server.store.api import (
    BadVersionError,
    Delete,
    InvalidOperationError,
    Notification,
    NotificationType,
    Outcome,
    Put,
    Record,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    WriteResult,
    validate_put,
)
from tc_server.store.keys import index_has_by_scan, is_child
from tc_server.store.notify import NotificationHub, Subscription
from tc_server.store.sqlite_writer import (
    COMMITTED,
    DELETE,
    PUT,
    READ_CHUNK,
    FrameBuffer,
    command,
    drop_ephemerals,
    encode_entries,
    encode_frame,
)
from tc_server.store.writes import StoreWrites, condition_failed

log = structlog.get_logger(__name__)

# Rows of a partition-scoped index scan read on the event loop before moving to the reader thread.
INLINE_SCAN_ROWS = 64
# An idle store's writer is asked an empty write (write_problem) at most this often: the supervisor asks
# each worker's /readyz twice a second, and a commit (an fsync, a WAL page) each time is disk wear for nothing.
IDLE_PROBE_S = 30.0
# While the writer's last group commit failed, that probe writes a record of this size and deletes it in the
# same commit, as a transaction's writes reach the disk: the empty commit went through on a full disk (its
# one page fitted in the WAL file) while every transaction's write failed, and /readyz said ready.
WRITE_PROBE_KEY = "/tc-server/write-probe"
WRITE_PROBE_BYTES = 64 * 1024

DB_FILENAME: Final = "tc-server.sqlite3"
# The layout of the file this code writes, kept in SQLite's own slot for it (PRAGMA user_version): a file of a
# later layout (a rollback after an upgrade that changed the file) is refused, naming both, instead of being
# misread and written into. 0: a file from before the layout was recorded, which this code reads (and
# upgrades: _upgrade_index_entries). Raised only with a change that an earlier tc-server cannot read.
FILE_LAYOUT: Final = 1
# Oxia's client caps one WriteRequest at 1000 operations (docs/oxia-client.md); the same cap bounds how long
# one transaction holds the writer and how many callers one failed fsync affects.
MAX_GROUP_OPS: Final = 1000
# A write queued while the oldest unanswered one has waited longer than this is refused at once
# (StoreUnavailableError, which clients retry) instead of queued behind it: callers give up after their
# request timeout, but a write once sent is committed all the same, so under more load than the disk
# commits, or with the writer stalled, the queue grew without bound and every request, each behind
# writes nobody waited for any more, ran out of time (no transaction succeeded until the load stopped).
# The app sets half of --request-timeout-s.
MAX_QUEUE_DELAY_S: Final = 5.0
SCAN_PAGE_ROWS: Final = 1000
# The lock descriptor of a store opened read-only: it has none.
NO_LOCK: Final = -1
# How long open() waits for the file's lock: the writer process of a tc-server that was just killed
# finishes its group and exits on its own (it reads EOF), holding the lock until then.
LOCK_WAIT_S: Final = 2.0
# How long close() waits for the writer process to end after its channel closed (it finishes its group).
WRITER_EXIT_S: Final = 10.0
# The directory that holds the tc_server package: the writer process imports the very same code.
_PACKAGE_ROOT: Final = Path(__file__).resolve().parents[2]

# records is a rowid table with its key in a unique index (issue 13). A table keyed by the key itself
# (WITHOUT ROWID, files made before 2026-11-30) keeps whole rows in key order, and each coordinator's new
# headers are appended in the middle of it, at the end of its own key range: a full page there is split by
# redistributing its cells over its neighbours, so every group commit rewrote ~30 pages of records for ~10
# pairs. Rows now go in arrival order (one insertion point at the end of the table) and only the small key
# entries land in 16 places: 36.6 -> 24.4 pages per group (docs/performance.md, *Records in a rowid
# table*; python -m tc_server.bench.writer_floor [--earlier-shape]). The statements are the same for both
# shapes, so a file of the earlier shape is served as it is (never rewritten at open: the copy of a large
# store would hold the start for minutes: `tc-server upgrade-store` does it, stopped, see
# rewrite_records_in_arrival_order), and a tc-server from before reads and writes a file of this shape.
_RECORDS_COLUMNS: Final = """(
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    value BLOB NOT NULL,
    version INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    modified_ms INTEGER NOT NULL,
    partition_key TEXT,
    ephemeral INTEGER NOT NULL DEFAULT 0,
    entries TEXT  -- the record's index entries (sqlite_writer.encode_entries), NULL for none
)"""
_RECORDS_EPHEMERAL_INDEX: Final = (
    "CREATE INDEX IF NOT EXISTS records_ephemeral ON records (ephemeral) WHERE ephemeral = 1")
# Made of this module's constants only (S608 is about input in SQL).
_SCHEMA: Final = f"""
CREATE TABLE IF NOT EXISTS records {_RECORDS_COLUMNS};
CREATE TABLE IF NOT EXISTS index_entries (
    index_name TEXT NOT NULL,
    secondary_key TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (index_name, secondary_key, key)
) WITHOUT ROWID;
{_RECORDS_EPHEMERAL_INDEX};
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT OR IGNORE INTO meta (name, value) VALUES ('version', 0);
"""  # noqa: S608

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

_T = TypeVar("_T")
_Row = tuple[str, bytes, int, int, int]


def _record(row: _Row) -> Record:
    key, value, version, created_ms, modified_ms = row
    return Record(key, bytes(value), version, created_ms=created_ms, modified_ms=modified_ms)


class StoreInUseError(StoreUnavailableError):
    """Another process (a running tc-server) holds the database file's lock: one user at a time."""


# SQLite's extended codes of a full disk: SQLITE_FULL ("database or disk is full"), and the "disk I/O error"
# of sizing the WAL's shared-memory index when the store opens on a full disk (SQLITE_IOERR_SHMSIZE), which
# would send an operator after a failing disk.
_DISK_FULL = frozenset({"SQLITE_FULL", "SQLITE_IOERR_SHMSIZE"})


def _unavailable(what: str, exc: BaseException) -> StoreUnavailableError:
    reason = f"{type(exc).__name__}: {exc}"
    code = getattr(exc, "sqlite_errorname", None)
    if code in _DISK_FULL:
        reason += f" ({code}: no space left on the data directory's disk)"
    elif code is not None:
        reason += f" ({code})"
    return StoreUnavailableError(f"embedded store: {what} failed: {reason}")


@dataclass(slots=True)
class _WriteRequest:
    """One caller's operations; ``ops is None`` asks the writer to drop the session's ephemerals.

    The writer's answer fills ``notes`` and, for a ``write_batch``, ``results`` (one per op) or, for a
    single put (``wants_record``), ``record`` (the stored record, None if its condition failed): only
    what the caller reads is built (issue 13). Its future (kept next to it in ``_pending``, not in it)
    resolves with the request itself, or for a single put with the record (BadVersionError if its
    condition failed): a callback less between the writer's answer and the NEW_TXN or END_TXN waiting
    for it (issue 13). A request holding its own future would be a reference cycle (request -> future
    -> result -> request), which only the cyclic GC frees, seven objects per write (gc.DEBUG_SAVEALL
    under the Java pair-bench)."""

    ops: Sequence[Put | Delete] | None
    wants_record: bool = False
    submitted_s: float = 0.0  # the event loop's clock when it was queued (how far behind the writer is)
    results: list[WriteResult] = field(default_factory=list)
    record: Record | None = None
    notes: list[Notification] = field(default_factory=list)


class EmbeddedStore(StoreWrites):
    """A :class:`~tc_server.store.api.MetadataStore` on one SQLite file; open it with :meth:`open`.

    ``on_commit``, if set, is called on the event loop with the number of operations of each group
    commit (for the ``tc_server_store_batch_size`` metric), and ``on_writer_lost`` each time the writer
    process is found gone while the store is open (``tc_server_store_writer_lost_total``). Every method raises
    :class:`StoreClosedError` after :meth:`close` (``close`` itself may be called again) and
    :class:`StoreUnavailableError` when SQLite fails (disk full, I/O error, corrupt file); the
    process keeps running.
    """

    on_commit: Callable[[int], None] | None
    on_writer_lost: Callable[[], None] | None

    def __init__(self, path: Path, lock_fd: int, get_conn: sqlite3.Connection, scan_conn: sqlite3.Connection,
                 indexed: set[str], max_group_ops: int, scan_page_rows: int, max_queue_delay_s: float) -> None:
        # Use open(); this only wires already opened resources together.
        self.path = path
        self.on_commit = None
        self.on_writer_lost = None
        self._lock_fd = lock_fd
        self._get_conn = get_conn
        self._scan_conn = scan_conn
        # The names of the indexes that may hold entries: read from the file at open, and each put's
        # names added as it is handed to the writer (_submit), before it can be committed, so that no
        # reader sees an entry here denied. Never emptied while open: a name missing here has no entry
        # at all (this store's writer is the only one of its file), and scan_index answers without
        # SQLite: END_TXN's idx:ops-by-txn scan, which today's brokers leave empty, was a query on the
        # event loop per transaction (issue 13). A put that fails leaves its names: more is safe.
        self._indexed = indexed
        self._max_group_ops = max_group_ops
        self._max_queue_delay_s = max_queue_delay_s
        self._scan_page_rows = scan_page_rows
        self._loop = asyncio.get_running_loop()
        self._hub = NotificationHub()
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tc-store-read")
        self._closed = False
        # The writer process and its channel (None until the first write, and after it died).
        self._writer: subprocess.Popen[bytes] | None = None
        self._channel: socket.socket | None = None
        self._frames = FrameBuffer()
        self._unsent: bytes | bytearray = b""  # what the channel did not take yet (it is sent when writable again)
        self._outbox: list[tuple[int, list[tuple[Any, ...]] | None]] = []  # this turn's requests
        # Sent or to be sent, by request id, in order: each request and the future its caller awaits.
        self._pending: dict[int, tuple[_WriteRequest, asyncio.Future[Any]]] = {}
        self._request_ids = itertools.count()
        self._closing: asyncio.Future[None] | None = None  # close(), once, whoever calls it
        # A writer that dies before answering anything (it cannot start: no interpreter, a broken file)
        # is started again only after a growing delay; writes meanwhile fail at once. One that has
        # answered is replaced at the next write.
        self._writer_answered = False
        self._answered_at = self._loop.time()  # the writer's last answer (or the open): write_problem's probe
        self._restarts = Backoff()
        self._no_writer_until = 0.0
        # The writer's last answer was a failed group (its message), until a group commits: an idle store on
        # a full disk said ready once its failed requests were 30 s old (health.py), while the idle probe
        # it sent kept failing (write_problem).
        self._last_group_failed: str | None = None
        # A full disk fails every group: one log line a second, not one per group.
        self._log_limiter = LogLimiter(interval_s=1.0)
        # open(read_only=True): another process may be writing the file, so _indexed says nothing.
        self._read_only = False

    @classmethod
    async def open(cls, data_dir: str | os.PathLike[str], *, max_group_ops: int = MAX_GROUP_OPS,
                   scan_page_rows: int = SCAN_PAGE_ROWS, max_queue_delay_s: float = MAX_QUEUE_DELAY_S,
                   read_only: bool = False) -> EmbeddedStore:
        """Open (creating if needed) ``<data_dir>/tc-server.sqlite3``.

        Deletes the ephemeral records a previous process left behind. Raises
        :class:`StoreUnavailableError` if another store holds the directory, or the file cannot be
        opened or is not a usable database.

        ``read_only``: open an existing file for reads only, beside the tc-server that may be running on
        it (the audit export): no lock, no writer process, nothing written (its session's ephemeral
        records stay, a file of an earlier layout is read as it is: reads do not use what the upgrade adds);
        every write raises InvalidOperationError. A missing file is StoreUnavailableError, not a new store."""
        if max_group_ops < 1 or scan_page_rows < 1 or max_queue_delay_s <= 0:
            raise ValueError("max_group_ops, scan_page_rows and max_queue_delay_s must be positive")
        directory = Path(data_dir)
        if read_only:
            get_conn, scan_conn = await asyncio.to_thread(_open_read_only, directory / DB_FILENAME)
            store = cls(directory / DB_FILENAME, NO_LOCK, get_conn, scan_conn, set(), max_group_ops, scan_page_rows,
                        max_queue_delay_s)
            store._read_only = True
            return store
        lock_fd, get_conn, scan_conn, indexed = await asyncio.to_thread(_open_files, directory)
        store = cls(directory / DB_FILENAME, lock_fd, get_conn, scan_conn, indexed, max_group_ops, scan_page_rows,
                    max_queue_delay_s)
        try:
            store._start_writer()
        except OSError as exc:
            await store._release()
            raise _unavailable("starting the writer process", exc) from exc
        return store

    def write_problem(self) -> str | None:
        """The writer process is as far behind as writes are refused at (a stalled disk, a stopped or hung
        process): /readyz says so as soon as that, not only once requests time out. An idle store has
        nothing unanswered to tell by, so a call that finds none, IDLE_PROBE_S after the writer last
        answered, hands it an empty write (a commit of nothing: its fsync tries the disk too), which a later
        call finds answered or not; without it an idle instance with a stopped writer said ready, and its
        first clients' writes timed out. While the last group commit failed, /readyz says that until one with
        writes succeeds, and the probe writes a record (WRITE_PROBE_BYTES) so that it can succeed."""
        if self._closed or self._read_only:
            return None
        now = self._loop.time()
        behind_s = self._behind_s(now)
        if behind_s > self._max_queue_delay_s:
            return (f"embedded store: its writer process has not answered a write for {behind_s:.1f} s "
                    f"({len(self._pending)} unanswered: a stalled disk, or a stopped or hung process)")
        if not self._pending and now - self._answered_at >= IDLE_PROBE_S:
            ops: list[Put | Delete] = [] if self._last_group_failed is None else [
                Put(WRITE_PROBE_KEY, bytes(WRITE_PROBE_BYTES)), Delete(WRITE_PROBE_KEY)]
            try:
                probe = self._submit(ops)
            except StoreUnavailableError as exc:  # its writer is gone and not restarted yet
                return str(exc)
            probe.add_done_callback(lambda future: future.cancelled() or future.exception())
        if self._last_group_failed is not None:
            return f"{self._last_group_failed} (the writer's last group commit; ready again once one succeeds)"
        return None

    def _behind_s(self, now: float) -> float:
        """How long the oldest unanswered write has waited for the writer process (0 with none): past
        max_queue_delay_s new writes are refused (_submit) and /readyz says so (write_problem)."""
        if not self._pending:
            return 0.0
        oldest, _ = next(iter(self._pending.values()))  # in queueing order
        return now - oldest.submitted_s

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"embedded store {self.path} is closed")

    # -- writes ---------------------------------------------------------------------------------

    async def _put_record(self, op: Put) -> Record | None:
        try:
            record: Record = await self._submit([op], wants_record=True)
        except BadVersionError:
            return None
        return record

    def _start_put(self, op: Put) -> asyncio.Future[Record]:
        """See :meth:`StoreWrites._start_put`. The writer's answer resolves the returned future itself
        (_committed): no task, no coroutine and no callback per write (each NEW_TXN writes its header this
        way; the task of the default cost ~4 % of the event loop's CPU per transaction, issue 13)."""
        return self._submit([op], wants_record=True)

    async def write_batch(self, ops: Sequence[Put | Delete]) -> list[WriteResult]:
        """Applies the operations in order, in one transaction (possibly shared with other callers'
        operations); returns once the commit is durable."""
        for op in ops:
            if isinstance(op, Put):
                validate_put(op)
        if not ops:
            self._check_open()
            return []
        done: _WriteRequest = await self._submit(list(ops))
        return done.results

    def _submit(self, ops: list[Put | Delete] | None, *, wants_record: bool = False) -> asyncio.Future[Any]:
        """Queue the operations for the writer; the caller awaits the returned future (a plain function,
        not a coroutine: one coroutine layer less per write, profiled, issue 13): the request once answered,
        or with ``wants_record`` (one put) the record it stored (BadVersionError: its condition failed)."""
        if self._closed:  # _check_open(), inlined: two calls less per pair (issue 13)
            self._check_open()
        if self._channel is None:
            if self._read_only:
                raise InvalidOperationError(f"embedded store: {self.path} was opened read-only")
            wait_s = self._no_writer_until - self._loop.time()
            if wait_s > 0:
                raise StoreUnavailableError(
                    f"embedded store: the writer process of {self.path} exited without answering; the next one "
                    f"starts in {wait_s:.2f} s (the log line store_writer_lost says why)")
            try:
                self._start_writer()
            except OSError as exc:
                raise _unavailable("starting the writer process", exc) from exc
        now = self._loop.time()
        pending = self._pending
        # _behind_s(), inlined (a call less per write, issue 13): the oldest unanswered write's wait.
        if ops is not None and pending and (
                behind_s := now - next(iter(pending.values()))[0].submitted_s) > self._max_queue_delay_s:
            raise StoreUnavailableError(
                f"embedded store: its writer process is {behind_s:.1f} s behind "
                f"({len(self._pending)} writes unanswered, a stalled disk or more load than it commits); "
                f"new writes are refused until it is within {self._max_queue_delay_s:g} s again")
        # Before anything is registered; a single write without a comprehension's frame (issue 13).
        encoded = None if ops is None else (
            [_encode(ops[0], self._indexed)] if len(ops) == 1 else [_encode(op, self._indexed) for op in ops])
        future: asyncio.Future[Any] = self._loop.create_future()
        request_id = next(self._request_ids)
        pending[request_id] = (_WriteRequest(ops, wants_record, submitted_s=now), future)
        if not self._outbox:
            self._loop.call_soon(self._send_outbox)
        self._outbox.append((request_id, encoded))
        # Cancelling the caller cancels this future but cannot un-send the write: the outcome is then
        # unknown, as the Protocol says; the answer skips a future that is already done. (No shield():
        # its extra future and callbacks were ~2% of the CPU per transaction, profiled.)
        return future

    # -- the channel to the writer process --------------------------------------------------------

    def _start_writer(self) -> None:
        # Called on the event loop's thread, never from a worker thread: the writer asks to be killed when
        # its parent ends (tc_server/parent_death.py), and Linux means the thread that forked it.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._writer = subprocess.Popen(
                command(_PACKAGE_ROOT, self.path, theirs.fileno(), self._lock_fd, self._max_group_ops, os.getpid()),
                stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(), self._lock_fd))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._channel = ours
        self._frames = FrameBuffer()
        self._unsent = b""
        self._writer_answered = False
        self._loop.add_reader(ours.fileno(), self._on_readable)

    def _send_outbox(self) -> None:
        outbox, self._outbox = self._outbox, []
        if outbox and self._channel is not None:
            try:
                frame = encode_frame(outbox)
            except Exception:  # noqa: BLE001 - a request marshal cannot take: its caller hears of it, the others go
                frame = self._frame_of_the_sendable(outbox)
            if frame:
                self._send(frame)

    def _frame_of_the_sendable(self, outbox: list[tuple[int, Any]]) -> bytes:
        """The frame of the requests of ``outbox`` that encode on their own; each that does not fails its caller
        (nothing of it was sent). Raised out of the turn's callback, one such request (a value of a type marshal
        cannot take) left every request of the turn unsent and unanswered, and the writer "behind" for good: no
        write was taken again until a restart (a review)."""
        sendable = []
        for request in outbox:
            try:
                encode_frame(request)
            except Exception as exc:  # noqa: BLE001 - as above
                _, future = self._pending.pop(request[0])
                if not future.done():
                    future.set_exception(InvalidOperationError(
                        f"embedded store: a write that cannot be sent to the writer process ({exc!r}); not applied"))
                continue
            sendable.append(request)
        return encode_frame(sendable) if sendable else b""

    def _send(self, data: bytes) -> None:
        if self._unsent:  # the channel is full: keep the order, the writable callback sends it
            if type(self._unsent) is bytes:
                # Appended to in place from here: bytes copied all that waited at each append, quadratic in
                # a stalled writer's backlog (a review: loop turns 0.2 -> 1.1 ms with 60,000 writes waiting).
                self._unsent = bytearray(self._unsent)
            self._unsent += data
            return
        self._unsent = data
        self._send_unsent()

    def _send_unsent(self) -> None:
        """Send what the channel takes of ``_unsent``; the rest waits for the channel to be writable."""
        channel = self._channel
        if channel is None:
            return
        try:
            sent = channel.send(self._unsent)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._writer_lost(f"sending to it failed: {exc}")
            return
        unsent = self._unsent
        if isinstance(unsent, bytearray):
            del unsent[:sent]
        else:
            self._unsent = unsent[sent:]
        if self._unsent:
            self._loop.add_writer(channel.fileno(), self._send_unsent)
        else:
            self._loop.remove_writer(channel.fileno())

    def _on_readable(self) -> None:
        channel = self._channel
        if channel is None:
            return
        try:
            data = channel.recv(READ_CHUNK)
        except BlockingIOError:
            return
        except OSError as exc:
            self._writer_lost(f"reading from it failed: {exc}")
            return
        if not data:
            self._writer_lost("it closed the channel")
            return
        self._answered(data)

    def _answered(self, data: bytes) -> None:
        self._writer_answered = True
        self._answered_at = self._loop.time()
        for answer in self._frames.feed(data):
            if answer[0] == COMMITTED:
                self._committed(*answer[1:])
            else:
                self._failed(*answer[1:])

    def _committed(self, now: int, answers: list[tuple[int, list[Any]]]) -> None:
        pending = self._pending
        done = []
        size = 0
        wanted = self._hub.wanted_prefixes
        for request_id, outcomes in answers:
            request, future = pending.pop(request_id)
            try:
                size += _fill(request, outcomes, now, wanted)
            except Exception as exc:  # noqa: BLE001 - a bug: this caller hears of it, the group's others go on
                log.exception("store_answer_unreadable", path=str(self.path))
                if not future.done():
                    future.set_exception(StoreUnavailableError(
                        f"embedded store: the answer to this write could not be read ({exc!r}); its outcome is "
                        "unknown"))
                continue
            done.append((request, future))
        # Publish before resolving: a caller that reacts to its write already finds it in the
        # notification streams, and streams see commits in commit order. One batch per group (it is
        # one commit): each subscriber is handed and woken once per commit, not once per caller.
        self._hub.publish(itertools.chain.from_iterable(request.notes for request, _ in done))
        for request, future in done:
            if future.done():  # its caller gave up on it (cancelled)
                continue
            if not request.wants_record:
                future.set_result(request)
            elif (record := request.record) is not None:
                future.set_result(record)
            elif request.ops:  # the single put's condition failed
                future.set_exception(condition_failed(request.ops[0].key, request.ops[0].expected_version))
            else:  # no caller asks for a record without its put; should one, it hears of it rather than hang
                future.set_exception(StoreUnavailableError("embedded store: a record asked of a write without a put"))
        if size:  # not write_problem()'s empty probes
            self._last_group_failed = None
            if self.on_commit is not None:
                self.on_commit(size)

    def _failed(self, message: str, request_ids: list[int]) -> None:
        self._last_group_failed = message
        if (left_out := self._log_limiter.allow("store_commit_failed")) is not None:
            log.error("store_commit_failed", path=str(self.path), requests=len(request_ids), error=message,
                      left_out_since_last_line=left_out)
        error = StoreUnavailableError(message)
        for request_id in request_ids:
            _, future = self._pending.pop(request_id)
            if not future.done():
                future.set_exception(error)

    def _writer_lost(self, why: str) -> None:
        """The writer process is gone (or its channel broke): every write in flight fails with an unknown
        outcome; the next write starts a new writer, which reads the version counter from the file."""
        channel, writer = self._channel, self._writer
        if channel is None:
            return
        # What the writer answered before it went is still in the socket buffer (a failed send may be
        # how its death was noticed): those writes were committed, hand them out first.
        while True:
            try:
                data = channel.recv(READ_CHUNK)
            except OSError:
                break
            if not data:
                break
            self._answered(data)
        self._close_channel()
        failed = self._last_group_failed
        if failed is not None:
            # A writer exits after a group its connection cannot write (a file gone read-only): the cause is
            # the disk, not the process, and starting a writer per write would not fix it (it did: a new
            # Python process per write, each logged as lost).
            why = f"{why}, after its last group commit failed: {failed}"
        if self._writer_answered and failed is None:
            self._restarts.reset()
        else:
            self._no_writer_until = self._loop.time() + self._restarts.next_delay()
        code = writer.poll() if writer is not None else None
        unanswered = self._fail_pending(
            f"the writer process of {self.path} is gone ({why}; exit code {code}); the outcome of this write "
            "is unknown")
        if not self._closed:
            if (left_out := self._log_limiter.allow("store_writer_lost")) is not None:
                log.error("store_writer_lost", path=str(self.path), why=why, exit_code=code,
                          writes_in_flight=unanswered, left_out_since_last_line=left_out)
            if self.on_writer_lost is not None:
                self.on_writer_lost()
        if unanswered:
            # Some of them may have been committed, and their notifications will never come.
            self._hub.fail(StoreUnavailableError(
                f"embedded store: the writer process of {self.path} died with writes in flight; re-read the "
                "state and subscribe again"))
        if writer is not None and code is None:
            # Reap it off the loop: it exits once it sees the channel closed.
            threading.Thread(target=writer.wait, name="tc-store-reap", daemon=True).start()

    def _close_channel(self) -> None:
        """Stop using the channel; closing it is EOF for the writer, which then exits."""
        channel = self._channel
        if channel is not None:
            self._loop.remove_reader(channel.fileno())
            self._loop.remove_writer(channel.fileno())
            channel.close()
        self._channel = self._writer = None
        self._outbox = []

    def _fail_pending(self, why: str) -> int:
        """Fail every write not answered yet with StoreUnavailableError; returns how many there were."""
        pending, self._pending = self._pending, {}
        error = StoreUnavailableError(f"embedded store: {why}")
        for _, future in pending.values():
            if not future.done():
                future.set_exception(error)
        return len(pending)

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

    def index_surely_empty(self, index_name: str) -> bool:
        """Whether no record of the file has an entry in ``index_name``, known without SQLite (_indexed);
        never on a file opened read-only, which another process may be writing."""
        return index_name not in self._indexed and not self._read_only

    async def _scan_index(self, name: str, start: str, end: str, inline: bool) -> AsyncIterator[Record]:
        # Checked when iterated: a scan made earlier sees later writes.
        if self.index_surely_empty(name):
            return
        limit = self._scan_page_rows
        after: tuple[str, str] | None = None
        if inline:
            # A scan scoped to one partition key is small (one txn's op records: END_TXN runs one
            # per request). Its first page is read on the loop, as gets are, because the thread
            # hop cost more than the query (profiled); a longer scan continues in the reader thread.
            self._check_open()  # closed since the scan was made: StoreClosedError, as the others say
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

    async def index_has(self, index_name: str, secondary_key: str, *, partition_key: str | None = None) -> bool:
        self._check_open()
        if self.index_surely_empty(index_name):  # END_TXN's question on today's brokers: no coroutine more
            return False
        return await index_has_by_scan(self, index_name, secondary_key, partition_key=partition_key)

    def notifications(self, key_prefix: str = "") -> Subscription:
        self._check_open()
        return self._hub.subscribe(key_prefix)

    # -- closing --------------------------------------------------------------------------------

    async def close(self) -> None:
        """End the session: delete its ephemeral records (subscribers see the deletes), finish the
        queued writes, stop the writer process, end the notification streams and release the files.
        Concurrent and repeated calls share one close."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        if self._closed:  # released already (an open that failed)
            return
        if self._read_only:  # no session of its own, nothing to delete
            await self._release()
            return
        try:
            cleanup: asyncio.Future[Any] | None = self._submit(None)
        except StoreError as exc:
            cleanup = None
            log.warning("store_ephemeral_cleanup_failed", path=str(self.path), error=str(exc))
        # From here every write is refused. Those queued before the cleanup are answered before it (the
        # writer keeps their order), so none is left once it is done, and none can outlive the session.
        self._closed = True
        writer_wait_s = WRITER_EXIT_S
        waited_s = 0.0
        if cleanup is not None:
            try:
                await asyncio.wait_for(cleanup, WRITER_EXIT_S)
            except (StoreError, TimeoutError) as exc:
                # Not fatal: the next open deletes them anyway.
                log.warning("store_ephemeral_cleanup_failed", path=str(self.path), error=str(exc) or repr(exc))
                if isinstance(exc, TimeoutError):
                    # It did not answer for WRITER_EXIT_S already: do not wait as long again.
                    writer_wait_s, waited_s = 0.0, WRITER_EXIT_S
        await self._release(writer_wait_s, waited_s)

    async def _release(self, writer_wait_s: float = WRITER_EXIT_S, waited_s: float = 0.0) -> None:
        """Stop the writer (EOF on its channel ends it; killed if it has not ended ``writer_wait_s``
        later) and close everything this store holds. ``waited_s``: how long the writer was waited for
        already (said if it is killed)."""
        self._closed = True
        writer = self._writer
        self._close_channel()
        self._fail_pending("the store was closed before the writer answered; the outcome of this write is unknown")
        if writer is not None:
            try:
                await asyncio.to_thread(writer.wait, writer_wait_s)
            except subprocess.TimeoutExpired:
                log.error("store_writer_stuck", path=str(self.path), waited_s=waited_s + writer_wait_s,  # noqa: TRY400
                          action="killed; check the disk (a write that does not return)")
                writer.kill()
                await asyncio.to_thread(writer.wait)
        await self._loop.run_in_executor(self._reader, self._scan_conn.close)
        self._reader.shutdown(wait=True)
        self._get_conn.close()
        if not self._read_only:  # NO_LOCK
            os.close(self._lock_fd)
        self._hub.close()


def _encode(op: Put | Delete, indexed: set[str]) -> tuple[Any, ...]:
    """An operation as the writer process reads it (sqlite_writer.py: plain tuples, which marshal takes); a put's
    index names join ``indexed`` (EmbeddedStore._indexed)."""
    if isinstance(op, Put):
        if op.secondary_indexes:
            indexed.update(op.secondary_indexes)
        value = op.value if type(op.value) is bytes else bytes(op.value)
        return (PUT, op.key, value, op.expected_version, op.partition_key, op.ephemeral, op.sequential,
                dict(op.secondary_indexes) if op.secondary_indexes else None)
    return (DELETE, op.key, op.expected_version)


def _fill(request: _WriteRequest, outcomes: list[Any], now: int, wanted: tuple[str, ...]) -> int:
    """Turn the writer's outcomes for ``request`` into its results (or record) and the notes of the keys
    that start with one of ``wanted`` (what subscribers asked for); returns the number of operations, for
    ``on_commit``."""
    notes = request.notes
    if request.ops is None:
        notes.extend(Notification(NotificationType.DELETED, key) for key in outcomes if key.startswith(wanted))
        return 1
    results = None if request.wants_record else request.results
    for op, outcome in zip(request.ops, outcomes, strict=True):
        if isinstance(op, Put):
            key, version, created, existed = outcome
            if version is None:
                if results is not None:
                    results.append(WriteResult(Outcome.BAD_VERSION, key))
                continue
            if key.startswith(wanted):
                notes.append(Notification(NotificationType.MODIFIED if existed else NotificationType.CREATED,
                                          key, version))
            if results is None:
                request.record = Record(key, bytes(op.value), version, created_ms=created, modified_ms=now)
            else:
                results.append(WriteResult(Outcome.OK, key, version))
        else:
            key, value = outcome
            result = Outcome(value)
            if results is not None:
                results.append(WriteResult(result, key))
            if result is Outcome.OK and key.startswith(wanted):
                notes.append(Notification(NotificationType.DELETED, key))
    return len(request.ops)


# -- SQL, run on the event loop or in the reader thread --------------------------------------------


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


def _open_files(directory: Path) -> tuple[int, sqlite3.Connection, sqlite3.Connection, set[str]]:
    """Lock the database file, prepare the schema, drop stale ephemerals and open the read connections;
    returns the lock, the two read connections and the names of the indexes with entries. (The writer
    process opens the write connection.)"""
    path = directory / DB_FILENAME
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # This descriptor stays open until every connection is closed: closing any descriptor of the
        # file would drop SQLite's POSIX locks of this process (see "How To Corrupt" in SQLite's docs).
        lock_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise _unavailable(f"opening {path}", exc) from exc
    if not _lock(lock_fd):
        os.close(lock_fd)
        raise StoreInUseError(f"embedded store: {path} is in use by another tc-server process (or store)")
    opened: list[sqlite3.Connection] = []
    try:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves. Closed before the writer starts.
        setup = sqlite3.connect(path, isolation_level=None)
        opened.append(setup)
        _require_known_layout(setup, path)  # before anything writes to the file
        # Another program's database (a mistyped --data-dir) is refused, not given this store's tables (a review's).
        _require_store_tables(setup, path, empty_ok=True)
        _require_wal(setup, path)
        setup.execute("PRAGMA synchronous=FULL")
        setup.execute("PRAGMA busy_timeout=5000")
        setup.executescript(_SCHEMA)
        setup.execute("BEGIN IMMEDIATE")
        _upgrade_index_entries(setup)
        setup.execute(f"PRAGMA user_version = {FILE_LAYOUT}")
        # The session that owned these records is gone (Oxia expires them with the session).
        drop_ephemerals(setup.cursor())
        setup.execute("COMMIT")
        indexed = index_names(setup)
        if records_keyed_by_key(setup):
            log.warning("embedded store: records kept in key order, as files made before 2026-11-30 keep them; each "
                        "group commit writes about 1.5x the pages of the current shape. `tc-server upgrade-store "
                        "--data-dir <dir>` rewrites them while tc-server is stopped (README, Upgrades)",
                        path=str(path))
        # Two read connections: a statement open on one would pin its snapshot for the other's reads.
        get_conn = _read_connection(path)
        opened.append(get_conn)
        scan_conn = _read_connection(path)
        setup.close()
    except Exception as exc:
        # Whatever the file holds that this code cannot take (an SQLite error, a value of another type
        # than it wrote), the open fails naming the file, and lets go of it: the lock held on would make
        # the next open say the file is in use.
        for conn in opened:
            conn.close()
        os.close(lock_fd)
        if isinstance(exc, StoreUnavailableError):
            raise
        raise _unavailable(f"opening {path}", exc) from exc
    return lock_fd, get_conn, scan_conn, indexed


def _open_read_only(path: Path) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """open(read_only=True): the two read connections of an existing store file, opened read-only (SQLite
    writes nothing to the file through them; WAL mode lets them read while its tc-server writes)."""
    if not path.is_file():
        raise StoreUnavailableError(f"embedded store: there is no {path} to read")
    # A stopped store has no write-ahead log (its last close checkpointed it and deleted it): read-only in WAL
    # mode, SQLite would create the -wal and -shm files beside it, which needs a writable directory (a volume
    # mounted read-only, an auditor's account) and leaves them behind. The file is then read as immutable:
    # no files, no locks. (A tc-server started on it meanwhile can make such an export fail: run it again.)
    stopped = not path.with_name(path.name + "-wal").exists()
    uri = f"{path.resolve().as_uri()}?mode=ro{'&immutable=1' if stopped else ''}"
    opened: list[sqlite3.Connection] = []
    try:
        for _ in range(2):
            opened.append(_read_connection(uri))
        _require_known_layout(opened[0], path)
        _require_store_tables(opened[0], path)
    except Exception as exc:
        for conn in opened:
            conn.close()
        if isinstance(exc, StoreUnavailableError):
            raise
        raise _unavailable(f"opening {path} to read", exc) from exc
    return opened[0], opened[1]


def _lock(fd: int) -> bool:
    """Take the file's exclusive flock, waiting up to LOCK_WAIT_S for it (see the module text)."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
        time.sleep(0.02)


def _upgrade_index_entries(conn: sqlite3.Connection) -> None:
    """Inside the open transaction: a file of the layout before records.entries (an index of
    index_entries by record key instead) gets the column, filled from index_entries, and loses the index.
    A tc-server of that layout started on a file of this one recreates its index and keeps index_entries
    by it, leaving the column as it was: the index being there is what says the column must be filled
    again, from scratch."""
    if not any(row[1] == "entries" for row in conn.execute("PRAGMA table_info(records)")):
        conn.execute("ALTER TABLE records ADD COLUMN entries TEXT")
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'index_entries_by_key'"
                    ).fetchone() is None:
        return
    started = time.monotonic()
    conn.execute("UPDATE records SET entries = NULL WHERE entries IS NOT NULL")
    # Read through the by-key index, one record's entries after another (a second cursor writes).
    entries = conn.execute("SELECT key, index_name, secondary_key FROM index_entries INDEXED BY index_entries_by_key"
                           " ORDER BY key")
    updates = ((encode_entries((name, secondary) for _, name, secondary in rows), key)
               for key, rows in itertools.groupby(entries, key=operator.itemgetter(0)))
    conn.cursor().executemany("UPDATE records SET entries = ? WHERE key = ?", updates)
    conn.execute("DROP INDEX index_entries_by_key")
    log.info("embedded store: index entries now listed in their records (the file was of an earlier layout)",
             seconds=round(time.monotonic() - started, 3))


def records_keyed_by_key(conn: sqlite3.Connection) -> bool:
    """Whether the file's ``records`` is of the shape before 2026-11-30: rows kept whole in key order
    (WITHOUT ROWID), which a group commit rewrites more pages of (the comment above _SCHEMA)."""
    return not any(row[1] == "id" for row in conn.execute("PRAGMA table_info(records)"))


class Upgraded(NamedTuple):
    """What ``rewrite_records_in_arrival_order`` did to a file of the earlier shape."""

    records: int | None  # copied into the rowid table (committed); None: the file had that shape already
    not_compacted: str | None  # why the compaction failed (the file is upgraded all the same)


def rewrite_records_in_arrival_order(directory: Path) -> Upgraded | None:
    """``tc-server upgrade-store``: the records of the store in ``directory``, kept in key order by a file made
    before 2026-11-30, copied into the rowid table files are made with now (rows in the order they were last
    written, which is their version's). Run with the store stopped: it takes the file's lock (StoreInUseError
    while a tc-server holds it). One SQLite transaction: stopped or killed half-way, the file is as it was.
    Then the file is compacted (VACUUM): the old table's pages had left it ~1.75x its size (a million records:
    331 MB, 587 MB after the copy, 340 MB compacted, in 3.9 + 2.0 s); killed during that, or the compaction
    failing (no room for its copy), the file is upgraded and not compacted (its free pages are reused by the
    next writes), and a second run compacts it. None when the file is of the current shape and at most a
    quarter of it is free pages: nothing to do."""
    path = directory / DB_FILENAME
    if not path.is_file():
        raise StoreUnavailableError(f"embedded store: there is no {path} to upgrade")
    try:
        lock_fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise _unavailable(f"opening {path}", exc) from exc
    try:
        if not _lock(lock_fd):
            raise StoreInUseError(f"embedded store: {path} is in use by a tc-server process: stop it first")
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            copied = _copy_into_rowid_table(conn, path)
            if copied is None and not _mostly_free(conn, path):
                return None
            # Upgraded from here on: a compaction that fails is said as such, not as an upgrade that failed
            # (an operator told so might restore a backup and lose what was written since).
            return Upgraded(copied, _compact(conn))
        finally:
            conn.close()
    finally:
        os.close(lock_fd)


def _copy_into_rowid_table(conn: sqlite3.Connection, path: Path) -> int | None:
    """The records of ``conn``'s file (of the earlier shape) copied into a rowid table, in one committed
    transaction; their number, None when the file is of the current shape already."""
    try:
        _require_known_layout(conn, path)
        _require_store_tables(conn, path)
        _require_wal(conn, path)
        conn.execute("PRAGMA synchronous=FULL")
        if not records_keyed_by_key(conn):
            return None
        conn.execute("BEGIN IMMEDIATE")
        _upgrade_index_entries(conn)  # a file from before records.entries: the copy takes the column
        # The old table renamed first, so the new one is made under its own name, its key's index too.
        conn.execute("ALTER TABLE records RENAME TO records_keyed_by_key")
        conn.execute(f"CREATE TABLE records {_RECORDS_COLUMNS}")
        columns = "key, value, version, created_ms, modified_ms, partition_key, ephemeral, entries"
        copied = conn.execute(f"INSERT INTO records ({columns}) SELECT {columns} FROM records_keyed_by_key"  # noqa: S608
                              " ORDER BY version").rowcount
        conn.execute("DROP TABLE records_keyed_by_key")  # and its records_ephemeral index
        conn.execute(_RECORDS_EPHEMERAL_INDEX)
        conn.execute(f"PRAGMA user_version = {FILE_LAYOUT}")
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise _unavailable(f"upgrading {path}", exc) from exc
    return int(copied)


def _mostly_free(conn: sqlite3.Connection, path: Path) -> bool:
    """Whether over a quarter of the pages of ``conn``'s file ``path`` are free (an upgrade whose compaction
    failed)."""
    try:
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        return bool(free * 4 > conn.execute("PRAGMA page_count").fetchone()[0])
    except sqlite3.Error as exc:
        raise _unavailable(f"reading the page counts of {path}", exc) from exc


def _compact(conn: sqlite3.Connection) -> str | None:
    """VACUUM the file of ``conn``, then move its write-ahead log into it (the copy and the compaction went
    through the log) and empty the log, also after a VACUUM that failed; None, or what failed."""
    failed = []
    for step in ("VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)"):
        try:
            conn.execute(step)
        except sqlite3.Error as exc:
            failed.append(f"{step}: {type(exc).__name__}: {exc}")
    return "; ".join(failed) or None


def index_names(conn: sqlite3.Connection) -> set[str]:
    """At open: the distinct index names of ``index_entries``: one primary-key seek per name (the name leads
    the key), not a read of every entry."""
    names: set[str] = set()
    row = conn.execute("SELECT min(index_name) FROM index_entries").fetchone()
    while row is not None and row[0] is not None:
        names.add(row[0])
        row = conn.execute("SELECT min(index_name) FROM index_entries WHERE index_name > ?", (row[0],)).fetchone()
    return names


def _read_connection(path: Path | str) -> sqlite3.Connection:
    """A connection for reads: of the file ``path``, or of the ``file:`` URI ``path`` (open(read_only=True))."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, uri=isinstance(path, str))
    conn.execute("PRAGMA query_only=1")
    # WAL readers only wait while a crashed writer's WAL index is rebuilt; get() runs on the event
    # loop, so keep any such wait short and let the caller see StoreUnavailableError instead.
    conn.execute("PRAGMA busy_timeout=100")
    return conn


def _require_known_layout(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a file of a later layout than FILE_LAYOUT (StoreUnavailableError, naming both)."""
    layout = conn.execute("PRAGMA user_version").fetchone()[0]
    if layout > FILE_LAYOUT:
        raise StoreUnavailableError(
            f"embedded store: {path} is of file layout {layout}, written by a later tc-server; this one reads "
            f"layouts up to {FILE_LAYOUT}: run the tc-server version that wrote it (or a later one)")


def _require_store_tables(conn: sqlite3.Connection, path: Path, empty_ok: bool = False) -> None:
    """Refuse (StoreUnavailableError) an SQLite file without this store's tables: open(read_only=True) cannot
    create them, and another database's file is no empty store (``empty_ok``: a file without any table is
    one, where a read-write open creates them)."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not {"records", "index_entries", "meta"} <= tables and (tables or not empty_ok):
        raise StoreUnavailableError(f"embedded store: {path} is no tc-server store (its tables: {sorted(tables)})")


def _require_wal(conn: sqlite3.Connection, path: Path) -> None:
    # WAL needs shared memory (no network file systems); without it durability and concurrent
    # reads would silently differ from what this module promises.
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreUnavailableError(f"embedded store: {path} cannot use WAL mode (got {mode})")
