"""The metadata-store interface every backend implements (docs/architecture.md §3, §9).

The coordinator only talks to this Protocol. It names the capabilities PIP-473 asks of a store:
conditional put/delete on a version, partition keys (records that must sit on one shard), server
assigned sequential keys, secondary indexes with range scans, prefix scans, batched writes,
change notifications and ephemeral records bound to the store session.

The semantics follow Oxia's, because Oxia is the production backend and the others must not
promise more than it keeps:

* A version is an opaque integer that changes on every modification of a key. Use it only to
  compare with what a later read returns.
* A batch is *not* a transaction: each operation succeeds or fails on its own (CAS failures are
  per-operation results), exactly as one Oxia ``WriteRequest``.
* Secondary-index entries belong to the record that carries them: a put replaces all of the
  record's index entries with the ones it names, a delete removes them.
* Sequential keys are ``prefix + "-%020d"``; the first key under a prefix ends in ``...0001``
  (Oxia adds the delta 1 to the highest existing suffix, 0 when there is none).
* Scans across shards come back in no particular order; with a partition key (one shard) they are
  ordered by key (for index scans: by secondary key, then primary key).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, runtime_checkable


def lease_clock() -> float:
    """The clock of leases (MetadataStore.ephemeral_lease), in seconds: CLOCK_BOOTTIME, which, unlike
    time.monotonic(), goes on while the machine is suspended. The store's server counts a session's
    timeout through a suspend of this machine; a lease on the monotonic clock would then look alive for
    up to its whole length after the session had expired."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)

# expected_version value meaning "the key must not exist" (Oxia's -1, Pulsar's -1).
EXPECT_ABSENT = -1

# The width of the server-assigned sequence suffix: prefix + "-" + 20 digits (Oxia's "%020d").
SEQUENCE_DIGITS = 20


class StoreError(Exception):
    """Base of every error a backend raises."""


class BadVersionError(StoreError):
    """A conditional put or delete found another version (or a record where none was expected)."""

    def __init__(self, key: str, expected: int) -> None:
        super().__init__(f"conditional write on {key!r} failed: expected version {expected}")
        self.key = key
        self.expected = expected


class StoreUnavailableError(StoreError):
    """The store could not be reached or did not answer within the request timeout.

    The outcome of a write that raised this is unknown: it may or may not have been applied.
    """


class InvalidOperationError(StoreError):
    """An operation the store would reject (or that would break a stream), refused before sending."""


class StoreClosedError(StoreError):
    """The backend was closed."""


# Record and Put are not frozen, for the speed of their __init__ (one or more per request; see the note
# above NewTxn in tc_server/wire/commands.py). Both are values: nothing changes one after it is built.
@dataclass(slots=True)
class Record:
    """A stored record as read back."""

    key: str
    value: bytes
    version: int
    # When the key was first created, in epoch ms (Oxia's Version.created_timestamp); 0 if unknown.
    created_ms: int = 0
    # When this version was written, in epoch ms (Oxia's Version.modified_timestamp); 0 if unknown.
    modified_ms: int = 0
    # The session an ephemeral record lives as long as (Oxia's Version.session_id); None for a durable record,
    # or on a store without sessions (embedded, memory). What ephemeral_lease is asked about.
    session_id: int | None = None


@dataclass(slots=True)
class Put:
    """One put inside a batch.

    ``sequential=True`` makes the store append ``-%020d`` to ``key`` (then ``key`` is a prefix and
    ``partition_key`` is required, ``expected_version`` forbidden, as in Oxia).
    """

    key: str
    value: bytes
    expected_version: int | None = None
    partition_key: str | None = None
    secondary_indexes: Mapping[str, str] = field(default_factory=dict)
    ephemeral: bool = False
    sequential: bool = False


@dataclass(frozen=True, slots=True)
class Delete:
    """One delete inside a batch."""

    key: str
    expected_version: int | None = None
    partition_key: str | None = None


class Outcome(Enum):
    OK = "ok"
    BAD_VERSION = "bad_version"
    NOT_FOUND = "not_found"


@dataclass(frozen=True, slots=True)
class WriteResult:
    """The result of one operation of a batch: for puts, ``key`` is the stored key (the generated
    one for sequential puts) and ``version`` its new version; for deletes ``version`` is -1."""

    outcome: Outcome
    key: str
    version: int = -1


class NotificationType(Enum):
    CREATED = "created"
    MODIFIED = "modified"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class Notification:
    type: NotificationType
    key: str
    version: int = -1


@runtime_checkable
class MetadataStore(Protocol):
    """What the coordinator needs from a metadata store. Every method may raise
    :class:`StoreUnavailableError` (outcome unknown for writes) and :class:`StoreClosedError`."""

    async def get(self, key: str, *, partition_key: str | None = None) -> Record | None:
        """The record at ``key``, or None."""
        ...

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        expected_version: int | None = None,
        partition_key: str | None = None,
        secondary_indexes: Mapping[str, str] | None = None,
        ephemeral: bool = False,
    ) -> Record:
        """Write ``key``; with ``expected_version`` only if the stored version matches
        (:data:`EXPECT_ABSENT`: only if absent). Returns the record as stored.

        Raises :class:`BadVersionError` when the condition fails."""
        ...

    def start_put(
        self,
        key: str,
        value: bytes,
        *,
        expected_version: int | None = None,
        partition_key: str | None = None,
        secondary_indexes: Mapping[str, str] | None = None,
    ) -> asyncio.Future[Record]:
        """:meth:`put`, already under way: the future of its outcome (the record, or the exception
        :meth:`put` would raise). Whoever awaits it does not own it: a caller that stops waiting
        (NEW_TXN's request timeout) leaves the write to finish, and a callback on the future still
        learns its outcome (NEW_TXN counts the header it wrote, issue 15). Cancelling the future
        itself leaves the outcome unknown, as cancelling :meth:`put` does. A future that is done as
        this returns has failed before anything was sent (an invalid operation, a closed store, one
        refusing new writes): nothing was written."""
        ...

    async def put_sequential(
        self,
        prefix: str,
        value: bytes,
        *,
        partition_key: str,
        secondary_indexes: Mapping[str, str] | None = None,
    ) -> Record:
        """Write under ``prefix + "-%020d"`` with the next suffix; returns the record with its key."""
        ...

    async def delete(
        self, key: str, *, expected_version: int | None = None, partition_key: str | None = None
    ) -> bool:
        """Delete ``key``; False if it did not exist. Raises :class:`BadVersionError` when
        ``expected_version`` is given and does not match."""
        ...

    async def write_batch(self, ops: Sequence[Put | Delete]) -> list[WriteResult]:
        """Apply many operations in as few round trips as the backend allows. Each operation has
        its own outcome (a failed condition does not fail the others). Raises
        :class:`InvalidOperationError` before sending anything if an operation is malformed."""
        ...

    def scan_prefix(self, prefix: str, *, partition_key: str | None = None) -> AsyncIterator[Record]:
        """Every record whose key starts with ``prefix`` and has no further ``/`` after it (the
        children of a path ending in ``/``). Streams; memory stays bounded."""
        ...

    def scan_index(
        self,
        index_name: str,
        start_inclusive: str,
        end_exclusive: str,
        *,
        partition_key: str | None = None,
    ) -> AsyncIterator[Record]:
        """Records whose secondary key in ``index_name`` lies in ``[start_inclusive, end_exclusive)``.
        With ``partition_key``: that one shard, ordered; without: every shard."""
        ...

    async def index_has(self, index_name: str, secondary_key: str, *, partition_key: str | None = None) -> bool:
        """Whether some record holds exactly ``secondary_key`` in ``index_name`` (on that one shard with
        ``partition_key``). What :meth:`scan_index` of :func:`exact_index_range` would say about being
        empty, in one cheap round trip where the backend has one (Oxia: a get on the index, many to a call)."""
        ...

    def index_surely_empty(self, index_name: str) -> bool:
        """True only when the store knows, without a query, that no record has an entry in ``index_name``
        (the embedded store keeps the names its records use); False means "ask" (:meth:`index_has`).
        A synchronous answer, so that the hot path skips the coroutines of a query it need not make."""
        ...

    def notifications(self, key_prefix: str = "") -> AsyncIterator[Notification]:
        """Changes committed after the call to the keys that start with ``key_prefix`` (every key by
        default). Oxia has no per-range watch: the stream carries every key and tc-server filters."""
        ...

    def ephemeral_lease(self, key: str, session_id: int | None = None) -> Callable[[], float] | None:
        """Until when the ephemeral record ``key`` of this process, held by session ``session_id`` (its
        Record.session_id as written or read; None: the session that would hold it if written now), surely
        still exists: a function giving that instant in :func:`lease_clock` seconds (0.0 once that session is
        not this process's live one), or None when such records last as long as this store is open (embedded,
        memory). On Oxia the server ends a session whose keep-alives stop arriving, whether or not this process
        has noticed (a stall, a partition); what was written under it after that is not what a successor saw
        (docs/semantics.md §8). The record's own session, not the current one: a record written under a
        session this process has since replaced goes when the server expires that session, whatever the
        new one's keep-alives say."""
        ...

    def write_problem(self) -> str | None:
        """What the store knows, without waiting for anyone, to be wrong with its writes now (the embedded
        store's writer process far behind), for /readyz; None when nothing is. It may start a check whose
        outcome a later call tells (the embedded store's empty write while it is idle)."""
        ...

    async def close(self) -> None:
        """Release connections and end the session (its ephemeral records go away)."""
        ...


def exact_index_range(secondary: str) -> tuple[str, str]:
    """The ``[start, end)`` range that matches exactly one secondary key, on every store.

    Not ``key + "\\x00"``: Oxia stores an index entry as ``<secondaryKey>\\x01<primaryKey>`` and
    compares the range with that, so the end must sort after ``\\x01``; no secondary key here holds a
    control character, so nothing else falls in the range (docs/record-layout.md).
    """
    return secondary, secondary + "\x02"


def sequence_key(prefix: str, number: int) -> str:
    """The key a sequential put stores: ``prefix-%020d``."""
    return f"{prefix}-{number:0{SEQUENCE_DIGITS}d}"


def validate_put(op: Put) -> None:
    """Reject what Oxia would reject at the request level (it would end the whole write stream), a key
    that is not text (a caller's bug: a store would write it and then fail to describe it), and a NUL in
    an index name or secondary key (the embedded store's separator)."""
    if type(op.key) is not str:
        raise InvalidOperationError(f"a key must be a str, not {type(op.key).__name__}: {op.key!r}")
    if op.sequential:
        if not op.partition_key:
            raise InvalidOperationError(f"sequential put under {op.key!r} needs a partition key")
        if op.expected_version is not None:
            raise InvalidOperationError(f"sequential put under {op.key!r} cannot have an expected version")
    for name, secondary_key in op.secondary_indexes.items():
        if "/" in name or not name:
            raise InvalidOperationError(f"secondary index name {name!r} must be non-empty and contain no '/'")
        # The embedded store lists a record's entries joined by NUL (sqlite_writer.encode_entries). No index
        # key tc-server makes holds one: digits, state names, and names URL-encoded (coordinator/layout.enc).
        if "\x00" in name or "\x00" in secondary_key:
            raise InvalidOperationError(f"secondary index {name!r}: a NUL character in the name or the secondary "
                                        f"key {secondary_key!r}")
