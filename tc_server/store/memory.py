"""The in-memory backend, for unit tests.

Usage::

    store = MemoryStore()                      # one session on a fresh, private data set
    other = MemoryStore(store.backend)         # a second session on the same data

Several sessions sharing one :class:`MemoryBackend` behave like several clients of one Oxia
cluster: each has its own ephemeral records (removed when it closes) and its own notification
subscribers, and every session sees every change. That lets coordinator tests play two instances
that both believe they lead.

The data set is one "shard": ``partition_key`` never narrows a read, exactly like a single-shard
Oxia (records of other partition keys on the same shard come back from a scoped scan too). Code that
relies on a scoped scan returning only its own partition key is wrong on Oxia, and tests on this
store will show it.

Nothing here awaits, except a scan once every ``SCAN_PAGE`` records (scans are paged, like a real
backend's): each operation is atomic with respect to the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Final

from sortedcontainers import SortedList  # type: ignore[import-untyped]

from tc_server.store.api import (
    Delete,
    Notification,
    NotificationType,
    Outcome,
    Put,
    Record,
    StoreClosedError,
    WriteResult,
    sequence_key,
    validate_put,
)
from tc_server.store.keys import index_has_by_scan, is_child, now_ms, sequence_suffix, sequence_upper_bound
from tc_server.store.notify import NotificationHub, Subscription
from tc_server.store.writes import StoreWrites, version_matches

# A scan lets the event loop run once per this many records, as a real backend does between pages:
# otherwise a scan of a large store (GC over ~100,000 retained headers) held the loop for seconds.
SCAN_PAGE = 256


# What the store keeps per key: (value, version, created_ms, modified_ms, id of the owning session
# if ephemeral else None, then each index entry as two items: name, secondary key). One flat tuple of
# bytes, ints and strings, not a dataclass holding a Record and a dict: Python's cyclic garbage
# collector stops tracking such a tuple at its first collection, while every dataclass instance and
# non-empty dict stays tracked (and a tuple nested in it could keep it tracked: a tuple is untracked
# only once every tuple inside it is). With a 30 s GC retention the store held ~135,000 headers under
# load, ~270,000 tracked objects that every full (generation 2) collection walked: 250-450 ms each,
# every 2-3 s, about a fifth of the server's CPU once the window was full (docs/performance.md, "Memory store under
# sustained load"). A read builds the Record it returns.
_Stored = tuple[bytes, int, int, int, int | None, *tuple[str, ...]]
_SESSION: Final = 4
_FIRST_INDEX: Final = 5


def _version(entry: _Stored | None) -> int | None:
    return None if entry is None else entry[1]


class MemoryBackend:
    """The data every :class:`MemoryStore` session on it shares."""

    def __init__(self) -> None:
        self._entries: dict[str, _Stored] = {}
        # Sorted copies of the keys so that scans and sequence lookups are ordered range walks.
        # SortedList, not a list kept sorted with bisect.insort: an insert or delete in the middle of
        # a plain list moves every later element, which made the store slow down as it filled (a
        # million retained headers: ~0.5 ms per write); SortedList does both in O(log n).
        self._keys: SortedList = SortedList()
        # Index name -> SortedList of (secondary key, key).
        self._index: dict[str, SortedList] = {}
        self._versions = itertools.count(1)
        self._session_ids = itertools.count(1)
        self._sessions: dict[int, NotificationHub] = {}

    # -- sessions -------------------------------------------------------------------------------

    def _open_session(self, hub: NotificationHub) -> int:
        session = next(self._session_ids)
        self._sessions[session] = hub
        return session

    def _close_session(self, session: int) -> None:
        owned = [key for key, entry in self._entries.items() if entry[_SESSION] == session]
        notes = [self._remove(key) for key in sorted(owned)]
        self._publish(notes)
        hub = self._sessions.pop(session)
        hub.close()

    def _publish(self, notes: list[Notification]) -> None:
        for hub in list(self._sessions.values()):
            hub.publish(notes)

    # -- writes ---------------------------------------------------------------------------------

    def _apply(self, ops: Sequence[Put | Delete], session: int) -> list[WriteResult]:
        for op in ops:
            if isinstance(op, Put):
                validate_put(op)
        results: list[WriteResult] = []
        notes: list[Notification] = []
        for op in ops:
            result, note = self._apply_put(op, session) if isinstance(op, Put) else self._apply_delete(op)
            results.append(result)
            if note is not None:
                notes.append(note)
        self._publish(notes)
        return results

    def _apply_put(self, op: Put, session: int) -> tuple[WriteResult, Notification | None]:
        key = sequence_key(op.key, self._highest_sequence(op.key) + 1) if op.sequential else op.key
        existing = self._entries.get(key)
        if not version_matches(_version(existing), op.expected_version):
            return WriteResult(Outcome.BAD_VERSION, key), None
        now = now_ms()
        version = next(self._versions)
        if existing is None:
            self._keys.add(key)
        else:
            self._drop_indexes(key, existing)
        indexes: list[str] = []
        for name, secondary in op.secondary_indexes.items():
            entries = self._index.get(name)
            if entries is None:
                entries = self._index[name] = SortedList()
            entries.add((secondary, key))
            indexes += (name, secondary)
        # A put replaces the owner: a non-ephemeral put makes the record persistent (Oxia does the same).
        self._entries[key] = (bytes(op.value), version, existing[2] if existing else now, now,
                              session if op.ephemeral else None, *indexes)
        kind = NotificationType.MODIFIED if existing else NotificationType.CREATED
        return WriteResult(Outcome.OK, key, version), Notification(kind, key, version)

    def _apply_delete(self, op: Delete) -> tuple[WriteResult, Notification | None]:
        existing = self._entries.get(op.key)
        if not version_matches(_version(existing), op.expected_version):
            return WriteResult(Outcome.BAD_VERSION, op.key), None
        if existing is None:
            return WriteResult(Outcome.NOT_FOUND, op.key), None
        return WriteResult(Outcome.OK, op.key), self._remove(op.key)

    def _remove(self, key: str) -> Notification:
        entry = self._entries.pop(key)
        self._keys.remove(key)
        self._drop_indexes(key, entry)
        return Notification(NotificationType.DELETED, key)

    def _drop_indexes(self, key: str, entry: _Stored) -> None:
        names_and_keys = iter(entry[_FIRST_INDEX:])
        for name, secondary in zip(names_and_keys, names_and_keys, strict=True):
            self._index[name].remove((secondary, key))

    def _highest_sequence(self, prefix: str) -> int:
        # Walk down from just above prefix-99..9 to the first key of the exact sequence shape.
        head = prefix + "-"
        pos = self._keys.bisect_left(sequence_upper_bound(prefix))
        while pos > 0:
            pos -= 1
            candidate = self._keys[pos]
            if not candidate.startswith(head):
                break
            number = sequence_suffix(candidate, prefix)
            if number is not None:
                return number
        return 0

    # -- reads ----------------------------------------------------------------------------------

    def _get(self, key: str) -> Record | None:
        entry = self._entries.get(key)
        return None if entry is None else self._record(key, entry)

    @staticmethod
    def _record(key: str, entry: _Stored) -> Record:
        return Record(key, entry[0], entry[1], entry[2], entry[3])

    def _next_child(self, prefix: str, after: str | None) -> Record | None:
        # Keyset pagination: each step re-finds its place, so writes between steps are harmless.
        keys = self._keys
        pos = keys.bisect_left(prefix) if after is None else keys.bisect_right(after)
        while pos < len(self._keys):
            key = self._keys[pos]
            if not key.startswith(prefix):
                return None
            if is_child(key, prefix):
                return self._record(key, self._entries[key])
            pos += 1
        return None

    def _next_indexed(self, name: str, start: str, end: str,
                      after: tuple[str, str] | None) -> tuple[tuple[str, str], Record] | None:
        entries = self._index.get(name)
        if entries is None:
            return None
        if after is None:
            pos = entries.bisect_left((start, ""))
        else:
            pos = entries.bisect_right(after)
        if pos >= len(entries) or entries[pos][0] >= end:
            return None
        position = entries[pos]
        return position, self._record(position[1], self._entries[position[1]])


class MemoryStore(StoreWrites):
    """One session on a :class:`MemoryBackend` (a private one by default); implements
    :class:`~tc_server.store.api.MetadataStore`. Every method raises :class:`StoreClosedError`
    after :meth:`close`; ``close`` itself may be called again."""

    def __init__(self, backend: MemoryBackend | None = None) -> None:
        self.backend = backend if backend is not None else MemoryBackend()
        self._hub = NotificationHub()
        self._session = self.backend._open_session(self._hub)
        self._closed = False

    def _check_open(self) -> MemoryBackend:
        if self._closed:
            raise StoreClosedError("memory store is closed")
        return self.backend

    async def get(self, key: str, *, partition_key: str | None = None) -> Record | None:
        return self._check_open()._get(key)

    async def _put_record(self, op: Put) -> Record | None:
        backend = self._check_open()
        (result,) = backend._apply([op], self._session)
        if result.outcome is not Outcome.OK:
            return None
        return backend._get(result.key)

    async def write_batch(self, ops: Sequence[Put | Delete]) -> list[WriteResult]:
        """Applies the operations in order, atomically with respect to other callers."""
        return self._check_open()._apply(ops, self._session)

    def scan_prefix(self, prefix: str, *, partition_key: str | None = None) -> AsyncIterator[Record]:
        backend = self._check_open()
        return self._scan_prefix(backend, prefix)

    async def _scan_prefix(self, backend: MemoryBackend, prefix: str) -> AsyncIterator[Record]:
        after: str | None = None
        for count in itertools.count(1):
            if count % SCAN_PAGE == 0:
                await asyncio.sleep(0)
            if (record := backend._next_child(prefix, after)) is None:
                return
            self._check_open()
            yield record
            after = record.key

    def scan_index(
        self,
        index_name: str,
        start_inclusive: str,
        end_exclusive: str,
        *,
        partition_key: str | None = None,
    ) -> AsyncIterator[Record]:
        backend = self._check_open()
        return self._scan_index(backend, index_name, start_inclusive, end_exclusive)

    async def _scan_index(self, backend: MemoryBackend, name: str, start: str,
                          end: str) -> AsyncIterator[Record]:
        after: tuple[str, str] | None = None
        for count in itertools.count(1):
            if count % SCAN_PAGE == 0:
                await asyncio.sleep(0)
            if (found := backend._next_indexed(name, start, end, after)) is None:
                return
            self._check_open()
            after, record = found
            yield record

    index_has = index_has_by_scan

    def notifications(self, key_prefix: str = "") -> Subscription:
        self._check_open()
        return self._hub.subscribe(key_prefix)

    async def close(self) -> None:
        """End the session: its ephemeral records are deleted (subscribers of every session see the
        deletes) and this session's notification streams end."""
        if self._closed:
            return
        self._closed = True
        self.backend._close_session(self._session)
