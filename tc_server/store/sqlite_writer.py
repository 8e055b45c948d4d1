"""The embedded store's writer process: the only writer of the SQLite file (tc_server/store/embedded.py).

Why a process of its own (issue 13): as a thread of tc-server it shared the interpreter's lock with the
event loop. The sqlite3 module lets go of that lock around every statement, and the event loop holds it
for a whole batch of frames at a time, so the writer spent most of each group commit waiting to get it
back: measured with the Java pair-bench at 64 in flight, a group of ~32 writes took ~3.8 ms of wall time
for ~1.1 ms of CPU and a 0.2 ms fsync, with ~13 waits on the lock per group, and the writer was the
bottleneck of the whole server. A process has its own interpreter lock.

What it does. It takes every request that has arrived (up to ``max_group_ops`` operations), applies them in
ONE transaction that ends with one ``COMMIT`` (``synchronous=FULL``: the WAL is fsynced), and answers
them all in one frame. Only then does tc-server resolve the callers' futures, so an acknowledged write is
on disk. A failed condition fails only its own operation; an SQLite error fails the whole group (rolled
back) and the process goes on with the next one. It ends when tc-server closes its end of the socket, or
dies: it reads EOF then, so it never outlives tc-server by more than the group it is committing; and
should tc-server end while this process is stopped or stalled, the kernel kills it (die_with_parent).

The exclusive ``flock`` of the database file (embedded.py) is inherited: the lock lives as long as either
process holds its descriptor, so no second tc-server can open the file while this process still writes.

The channel is a Unix socket pair; each frame is a 4-byte big-endian length and a ``marshal`` of plain values
(both ends are this code, run by the same interpreter in processes of one tc-server, never a peer on the
network; marshal writes and reads such values in about 60 % of pickle's time, docs/performance.md, *CPU per
transaction*):

* tc-server -> writer: a list of requests ``(request_id, ops)``; ``ops`` is None to delete the session's
  ephemeral records, else a list of ``(PUT, key, value, expected_version, partition_key, ephemeral,
  sequential, secondary_indexes)`` and ``(DELETE, key, expected_version)``.
* writer -> tc-server, one frame per group: ``(COMMITTED, modified_ms, answers)`` where each answer is
  ``(request_id, outcomes)``: per put ``(key, version or None when its condition failed, created_ms,
  existed)``, per delete ``(key, Outcome value)``, or the deleted keys for ``ops`` None. Or
  ``(FAILED, message, request_ids)``.

Run by :class:`~tc_server.store.embedded.EmbeddedStore`:
``python -c … DB_PATH SOCKET_FD LOCK_FD MAX_GROUP_OPS`` (see :func:`command`). The process imports this
module from disk when it starts, which may be long after tc-server started: the command refuses to run a
module of another WRITER_LAYOUT (the package replaced in place under a running tc-server).
"""

from __future__ import annotations

import contextlib
import ctypes
import marshal
import signal
import socket
import sqlite3
import struct
import sys
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from tc_server.parent_death import die_with_parent, parent_gone
from tc_server.store.api import EXPECT_ABSENT, Outcome, sequence_key
from tc_server.store.keys import now_ms, sequence_suffix, sequence_upper_bound
from tc_server.store.writes import version_matches

PUT: Final = 0
DELETE: Final = 1
COMMITTED: Final = 0
FAILED: Final = 1

_LENGTH: Final = struct.Struct(">I")
# Bytes asked of one recv() on the channel, by both ends. Under glibc's mmap threshold (128 KiB): a 1 MiB
# buffer was an mmap, mremap and munmap per read (a group's answer is a few KiB), profiled with strace.
READ_CHUNK: Final = 64 * 1024

# The writer's statements (see _put): a create that does nothing on a present key (rowcount 0), and
# the update of a present key (created_ms kept). ``entries`` is the record's index entries (encode_entries).
_CREATE: Final = ("INSERT INTO records (key, value, version, created_ms, modified_ms, partition_key, ephemeral,"
                  " entries) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING")
_UPDATE: Final = ("UPDATE records SET value = ?, version = ?, modified_ms = ?, partition_key = ?, ephemeral = ?,"
                  " entries = ? WHERE key = ?")
# OR IGNORE: an entry a damaged file still holds for the key must not refuse the key's writes for good.
_INDEX_INSERT: Final = "INSERT OR IGNORE INTO index_entries (index_name, secondary_key, key) VALUES (?, ?, ?)"
_INDEX_DELETE: Final = "DELETE FROM index_entries WHERE index_name = ? AND secondary_key = ? AND key = ?"
# Every entry of a key: a scan of index_entries (not indexed by key), only where records.entries is damaged.
_INDEX_DELETE_ALL: Final = "DELETE FROM index_entries WHERE key = ?"
# Between the names and secondary keys of records.entries: a character neither may hold (validate_put).
ENTRY_SEPARATOR: Final = "\x00"
# The file layout and channel this module speaks; changed with either. The command that starts a writer
# (command) checks it against the module it imports then.
WRITER_LAYOUT: Final = 3

Request = tuple[int, list[tuple[Any, ...]] | None]

# sqlite3_config()'s options (sqlite3.h) for one_thread_sqlite.
_SQLITE_CONFIG_MULTITHREAD: Final = 2
_SQLITE_CONFIG_MEMSTATUS: Final = 9


def encode_frame(message: Any) -> bytes:
    """One frame of the channel: the length, then the marshalled message (ValueError for a value that is not
    a plain int, str, bytes, bool, None, tuple, list or dict)."""
    body = marshal.dumps(message)
    return _LENGTH.pack(len(body)) + body


class FrameBuffer:
    """Bytes read from the channel, cut into messages."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """Add ``data``; returns the messages now complete, in order."""
        self._data += data
        messages: list[Any] = []
        start = 0
        while len(self._data) - start >= 4:
            (length,) = _LENGTH.unpack_from(self._data, start)
            end = start + 4 + length
            if len(self._data) < end:
                break
            # The peer is this module's other end, started by the same tc-server (see the module text).
            messages.append(marshal.loads(self._data[start + 4:end]))  # noqa: S302
            start = end
        del self._data[:start]
        return messages


def command(package_root: Path, db_path: Path, socket_fd: int, lock_fd: int, max_group_ops: int,
            parent_pid: int) -> list[str]:
    """The command line of a writer process. ``-I -S``: no user site, no ``PYTHONPATH``, no site packages
    (it needs only the standard library and this package, imported from ``package_root``, the very code
    of the tc-server that starts it), and a start in tens of milliseconds."""
    # A module without WRITER_LAYOUT (older) fails the import; one of another value exits with the
    # message: either way the process ends before it writes, and its stderr is tc-server's.
    code = (f"import sys; sys.path.insert(0, {str(package_root)!r}); "
            "from tc_server.store.sqlite_writer import main, WRITER_LAYOUT; "
            f"sys.exit(main(sys.argv[1:]) if WRITER_LAYOUT == {WRITER_LAYOUT} else "
            f"'tc-server: the embedded store writer on disk ({{}}) is not of this tc-server (layout "
            f"{WRITER_LAYOUT}): was the package replaced under the running server? Restart it'.format(WRITER_LAYOUT))")
    return [sys.executable, "-I", "-S", "-c", code, str(db_path), str(socket_fd), str(lock_fd), str(max_group_ops),
            str(parent_pid)]


def main(argv: list[str]) -> int:
    db_path, socket_fd, lock_fd, max_group_ops = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    parent_pid = int(argv[4]) if len(argv) > 4 else None
    # tc-server stops this process by closing the socket, after its last write: a Ctrl-C, SIGTERM or a
    # closing terminal's SIGHUP sent to the whole process group must not cut a group commit short (nor
    # the stop's own writes, which follow the signal).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    # Killed with tc-server however it ends: a writer stopped or stalled on a disk never reads the EOF
    # that ends it otherwise, and would hold the file's lock against the next tc-server.
    die_with_parent()
    if parent_pid is not None and parent_gone(parent_pid):
        # Stopped or stalled, it would hold the file's lock against the next tc-server.
        print(f"tc-server store writer: tc-server (pid {parent_pid}) is gone; exiting", file=sys.stderr)
        return 4
    channel = socket.socket(fileno=socket_fd)
    channel.setblocking(True)
    # lock_fd stays open for the life of this process, unused: it holds the store's flock (see the module
    # text), and closing any descriptor of the file would drop SQLite's POSIX locks of this process.
    del lock_fd
    one_thread_sqlite()
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        try:
            # sqlite3.connect opens a file it cannot write read-only, without a word (a volume mounted
            # read-only for a moment as this writer started): such a writer failed every group for good,
            # and answering, was never replaced. One that cannot write exits before answering anything, and
            # tc-server starts the next one after a growing delay (EmbeddedStore._writer_lost).
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            print(f"tc-server store writer: cannot write {db_path}: {exc} "
                  f"({getattr(exc, 'sqlite_errorname', '?')})", file=sys.stderr)
            return 3
        Writer(conn, max_group_ops).serve(channel)
    finally:
        conn.close()
    return 0


def loaded_sqlite_library() -> ctypes.CDLL | None:
    """The SQLite library the sqlite3 module loaded, to call what the module does not offer; None where it is
    not a shared object this process maps (a Python with SQLite built in, or no /proc)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/maps") as maps:
            path = next((line.split()[-1] for line in maps if "/libsqlite3" in line), None)
        if path is not None:
            library = ctypes.CDLL(path)  # dlopen of a loaded library hands back that one
            major, minor, patch = sqlite3.sqlite_version_info
            if library.sqlite3_libversion_number() == major * 1_000_000 + minor * 1_000 + patch:
                return library
    return None


def one_thread_sqlite() -> bool:
    """Set this process's SQLite library up for what the writer is: one connection, used by one thread. By
    default (Debian's build, the image's) SQLite is serialized, taking a connection's mutex at every call, and
    counts its memory, taking another mutex at every allocation; neither guards anything here. Off, the
    writer process takes 8.8 % fewer instructions per pair (docs/performance.md, *CPU per transaction*).

    SQLite takes settings only while it is not initialized, and importing sqlite3 initializes it, so this
    shuts it down, sets them and initializes it again: call it before the process opens any connection.
    False (SQLite as it was) where the library cannot be reached (loaded_sqlite_library) or a step is
    refused: an optimization, never a reason not to write."""
    library = loaded_sqlite_library()
    if library is None or library.sqlite3_shutdown() != 0:
        return False
    applied: bool = (library.sqlite3_config(_SQLITE_CONFIG_MULTITHREAD) == 0
                     and library.sqlite3_config(_SQLITE_CONFIG_MEMSTATUS, ctypes.c_int(0)) == 0)
    # Whatever the settings did: opening a connection would initialize SQLite too; doing it here keeps any
    # error of it here.
    initialized: bool = library.sqlite3_initialize() == 0
    return initialized and applied


class Writer:
    """Applies groups of requests to one write connection; the version counter lives here."""

    def __init__(self, conn: sqlite3.Connection, max_group_ops: int) -> None:
        self._conn = conn
        self._max_group_ops = max_group_ops
        # Read inside the first group's write transaction, not here: the writer before this one (its
        # channel broke) may still be committing its last group, and reading before that commit would
        # reuse its versions.
        self._version: int | None = None
        # A group failed with SQLITE_READONLY*: this connection cannot write (its file was opened read-only,
        # or went read-only under it); the process exits once it has answered, and a new one opens the file.
        self.read_only = False

    def serve(self, channel: socket.socket) -> None:
        """Answer groups until tc-server closes the channel (or is gone: then quietly, too)."""
        try:
            self._serve(channel)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _serve(self, channel: socket.socket) -> None:
        frames = FrameBuffer()
        waiting: deque[Request] = deque()
        while True:
            if not waiting:
                data = channel.recv(READ_CHUNK)
                if not data:
                    return
                for message in frames.feed(data):
                    waiting.extend(message)
            # Whatever else has arrived joins this group (one fsync for all of it).
            try:
                while data := channel.recv(READ_CHUNK, socket.MSG_DONTWAIT):
                    for message in frames.feed(data):
                        waiting.extend(message)
            except BlockingIOError:
                pass
            if not waiting:
                # Only part of a frame has arrived: an empty group would cost a commit and an fsync (a review).
                continue
            group: list[Request] = []
            size = 0
            while waiting and (not group or size < self._max_group_ops):
                request = waiting.popleft()
                group.append(request)
                size += 1 if request[1] is None else len(request[1])
            channel.sendall(encode_frame(self.commit_group(group)))
            if self.read_only:
                return

    def commit_group(self, group: list[Request]) -> tuple[Any, ...]:
        """Apply ``group`` in one transaction; the answer frame for it."""
        version = self._version
        now = now_ms()
        cursor = self._conn.cursor()
        try:
            cursor.execute("BEGIN IMMEDIATE")
            if version is None:
                version = int(cursor.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()[0])
            answers: list[tuple[int, list[Any]]] = []
            for request_id, ops in group:
                if ops is None:
                    answers.append((request_id, drop_ephemerals(cursor)))
                    continue
                outcomes: list[tuple[Any, ...]] = []
                for op in ops:
                    if op[0] == PUT:
                        key, created, existed = _put(cursor, op, version + 1, now)
                        if created is None:
                            outcomes.append((key, None, 0, existed))
                        else:
                            version += 1
                            outcomes.append((key, version, created, existed))
                    else:
                        outcomes.append((op[1], _delete(cursor, op[1], op[2]).value))
                answers.append((request_id, outcomes))
            cursor.execute("UPDATE meta SET value = ? WHERE name = 'version'", (version,))
            cursor.execute("COMMIT")
        except Exception as exc:  # noqa: BLE001 -- every caller of the group must hear about it
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            # The versions this group used are skipped, not reused: a COMMIT that failed in its fsync
            # may still have reached the disk. (None if the state could not be read: read it again.)
            self._version = version
            self.read_only = str(getattr(exc, "sqlite_errorname", "")).startswith("SQLITE_READONLY")
            what = "write" if isinstance(exc, sqlite3.Error) else "write (a bug in the writer)"
            return (FAILED, f"embedded store: {what} failed: {type(exc).__name__}: {exc}",
                    [request_id for request_id, _ in group])
        self._version = version
        return (COMMITTED, now, answers)


# -- SQL, inside the open transaction --------------------------------------------------------------


def encode_entries(entries: Iterable[tuple[str, str]]) -> str | None:
    """``records.entries``: a record's index entries, each entry's name then its secondary key, all joined
    by ENTRY_SEPARATOR; None for none. The row names its own entries so that an update or a
    delete removes them by their primary key: an index of index_entries by record key had cost a B-tree
    leaf per coordinator in every group commit (issue 13, docs/performance.md)."""
    return ENTRY_SEPARATOR.join(part for entry in entries for part in entry) or None


def _delete_entries(cursor: sqlite3.Cursor, key: str, encoded: Any) -> None:
    """Delete the index entries ``encoded`` (records.entries) of ``key``. Should the column not list what
    index_entries holds for the key (a damaged file: not text, not pairs, an entry that is not there),
    every entry of the key goes, found by a scan: a wrong list must neither fail every write of the key
    nor leave entries behind."""
    if encoded is None:
        return
    parts = encoded.split(ENTRY_SEPARATOR) if type(encoded) is str else None
    if parts is not None and len(parts) % 2 == 0:
        if len(parts) == 2:
            cursor.execute(_INDEX_DELETE, (parts[0], parts[1], key))
        else:
            cursor.executemany(_INDEX_DELETE, [(parts[i], parts[i + 1], key) for i in range(0, len(parts), 2)])
        if cursor.rowcount == len(parts) // 2:
            return
    cursor.execute(_INDEX_DELETE_ALL, (key,))


def drop_ephemerals(cursor: sqlite3.Cursor) -> list[str]:
    """Delete every ephemeral record (with its index entries); their keys, in order."""
    rows = cursor.execute("SELECT key, entries FROM records WHERE ephemeral = 1 ORDER BY key").fetchall()
    for key, encoded in rows:
        _remove(cursor, key, encoded)
    return [key for key, _ in rows]


def _put(cursor: sqlite3.Cursor, op: tuple[Any, ...], version: int, now: int) -> tuple[str, int | None, bool]:
    """Store the put ``op`` at ``version``: (the key, its created_ms or None when the condition failed and
    nothing was written, whether the key existed before).

    Fewer statements per put (issue 13): a create is one INSERT that does nothing on a present key
    (rowcount 0), with no index entries of an earlier record to delete. A write over a present key reads
    the row first: its version decides, its created_ms is kept (an UPDATE ... RETURNING created_ms
    instead cost twice a plain UPDATE on SQLite 3.40, measured), and its entries are replaced unless the
    same."""
    _, key, value, expected_version, partition_key, ephemeral, sequential, entries = op
    if sequential:
        key = sequence_key(key, _highest_sequence(cursor.connection, key) + 1)
    row = None
    # A sequential key is absent by construction; a create-if-absent needs no read: the INSERT tells.
    if not (expected_version == EXPECT_ABSENT or sequential):
        row = cursor.execute("SELECT version, created_ms, entries FROM records WHERE key = ?", (key,)).fetchone()
        if not version_matches(row[0] if row else None, expected_version):
            return key, None, row is not None
    created: int
    if not entries:
        encoded = None
    elif len(entries) == 1:
        # encode_entries() of one entry (every header's), without its generator: two puts per pair (issue 13).
        ((name, secondary),) = entries.items()
        encoded = f"{name}{ENTRY_SEPARATOR}{secondary}"
    else:
        encoded = encode_entries(entries.items())
    if row is None:
        cursor.execute(_CREATE, (key, value, version, now, now, partition_key, int(ephemeral), encoded))
        if cursor.rowcount == 0:  # only a create-if-absent can meet a present key here
            return key, None, True
        created, existed = now, False
    else:
        cursor.execute(_UPDATE, (value, version, now, partition_key, int(ephemeral), encoded, key))
        created, existed = row[1], True
        if encoded == row[2]:
            return key, created, existed
        _delete_entries(cursor, key, row[2])
    if entries:
        if len(entries) == 1:
            cursor.execute(_INDEX_INSERT, (name, secondary, key))
        else:
            cursor.executemany(_INDEX_INSERT, [(name, secondary, key) for name, secondary in entries.items()])
    return key, created, existed


def _delete(cursor: sqlite3.Cursor, key: str, expected_version: int | None) -> Outcome:
    row = cursor.execute("SELECT version, entries FROM records WHERE key = ?", (key,)).fetchone()
    if not version_matches(row[0] if row else None, expected_version):
        return Outcome.BAD_VERSION
    if row is None:
        return Outcome.NOT_FOUND
    _remove(cursor, key, row[1])
    return Outcome.OK


def _remove(cursor: sqlite3.Cursor, key: str, encoded_entries: str | None) -> None:
    cursor.execute("DELETE FROM records WHERE key = ?", (key,))
    _delete_entries(cursor, key, encoded_entries)


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
