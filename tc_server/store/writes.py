"""The single-operation writes of :class:`~tc_server.store.api.MetadataStore`, written once.

``put``, ``put_sequential`` and ``delete`` mean the same on every backend: build one operation, check
it as Oxia would, apply it, and turn a failed condition into :class:`BadVersionError`. A backend
subclasses :class:`StoreWrites` and provides only how one put is applied (``_put_record``, which must
return the record as stored, timestamps included) and ``write_batch``; deletes go through
``write_batch`` as a batch of one.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

from tc_server.store.api import (
    EXPECT_ABSENT,
    BadVersionError,
    Delete,
    Outcome,
    Put,
    Record,
    WriteResult,
    validate_put,
)


def version_matches(stored: int | None, expected: int | None) -> bool:
    """Whether a conditional write may proceed, as Oxia's ``checkExpectedVersionId`` decides: no
    condition always; "must not exist" only on an absent key; a version only on that very version
    (so a version on an absent key fails)."""
    if expected is None:
        return True
    if stored is None:
        return expected == EXPECT_ABSENT
    return stored == expected


def condition_failed(key: str, expected_version: int | None) -> BadVersionError:
    return BadVersionError(key, expected_version if expected_version is not None else EXPECT_ABSENT)


def checked_put(key: str, value: bytes, *, expected_version: int | None, partition_key: str | None,
                secondary_indexes: Mapping[str, str] | None, ephemeral: bool = False,
                sequential: bool = False) -> Put:
    """The operation of a :meth:`~StoreWrites.put`, ``put_sequential`` or ``start_put``,
    checked as Oxia would check it: raises :class:`InvalidOperationError` for one it would refuse. The
    value is taken as immutable bytes now (no copy when it is bytes already): the record a put returns
    is what was written, also if the caller reuses a bytearray before the answer."""
    if type(value) is not bytes:
        value = bytes(value)
    op = Put(key, value, expected_version=expected_version, partition_key=partition_key,
             secondary_indexes=secondary_indexes or {}, ephemeral=ephemeral, sequential=sequential)
    validate_put(op)
    return op


class StoreWrites(ABC):
    """``put`` / ``put_sequential`` / ``delete`` on top of a backend's ``_put_record`` and ``write_batch``."""

    @abstractmethod
    async def write_batch(self, ops: Sequence[Put | Delete]) -> list[WriteResult]:
        """See :meth:`MetadataStore.write_batch`."""

    @abstractmethod
    async def _put_record(self, op: Put) -> Record | None:
        """Apply one put that passed :func:`validate_put`; the record as stored, or None when its
        expected version did not match. Raises like any write (unavailable, closed)."""

    def write_problem(self) -> str | None:
        """See :meth:`MetadataStore.write_problem`: nothing, unless the backend says otherwise (embedded)."""
        return None

    def index_surely_empty(self, index_name: str) -> bool:
        """See :meth:`MetadataStore.index_surely_empty`: not known, unless the backend knows (embedded)."""
        return False

    def ephemeral_lease(self, key: str, session_id: int | None = None) -> Callable[[], float] | None:
        """See :meth:`MetadataStore.ephemeral_lease`: ephemeral records live as long as the store is
        open, unless the backend says otherwise (Oxia)."""
        return None

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
        """See :meth:`MetadataStore.put`. Raises :class:`BadVersionError` when the condition fails,
        :class:`InvalidOperationError` for an operation Oxia would refuse."""
        # Applied right here, not in a shared helper coroutine: every header write of the coordinator
        # passes through this, and each coroutine layer costs its resumptions (issue 13).
        op = checked_put(key, value, expected_version=expected_version, partition_key=partition_key,
                         secondary_indexes=secondary_indexes, ephemeral=ephemeral)
        record = await self._put_record(op)
        if record is None:
            raise condition_failed(key, expected_version)
        return record

    def start_put(
        self,
        key: str,
        value: bytes,
        *,
        expected_version: int | None = None,
        partition_key: str | None = None,
        secondary_indexes: Mapping[str, str] | None = None,
    ) -> asyncio.Future[Record]:
        """See :meth:`MetadataStore.start_put`. The operation is checked and its value taken now (see
        :func:`checked_put`); what put() would raise, that check's failure too, comes through the future.
        How it is under way is the backend's :meth:`_start_put`."""
        try:
            op = checked_put(key, value, expected_version=expected_version, partition_key=partition_key,
                             secondary_indexes=secondary_indexes)
            return self._start_put(op)
        except Exception as exc:  # noqa: BLE001 - reported through the future, as put() would raise it
            failed: asyncio.Future[Record] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    def _start_put(self, op: Put) -> asyncio.Future[Record]:
        """Start one put that passed :func:`validate_put`: :meth:`put` as a task (a backend with a cheaper
        way overrides this: no task per NEW_TXN). May raise what cannot even be submitted."""
        return asyncio.ensure_future(self.put(op.key, op.value, expected_version=op.expected_version,
                                              partition_key=op.partition_key,
                                              secondary_indexes=op.secondary_indexes))

    async def put_sequential(
        self,
        prefix: str,
        value: bytes,
        *,
        partition_key: str,
        secondary_indexes: Mapping[str, str] | None = None,
    ) -> Record:
        """See :meth:`MetadataStore.put_sequential`. Raises :class:`InvalidOperationError` without a
        partition key (Oxia would end the write stream)."""
        op = checked_put(prefix, value, expected_version=None, partition_key=partition_key,
                         secondary_indexes=secondary_indexes, sequential=True)
        record = await self._put_record(op)
        if record is None:  # unconditional: only a backend bug gets here
            raise condition_failed(prefix, None)
        return record

    async def delete(
        self, key: str, *, expected_version: int | None = None, partition_key: str | None = None
    ) -> bool:
        """See :meth:`MetadataStore.delete`: False if the key did not exist; :class:`BadVersionError`
        when ``expected_version`` does not match (a version on a missing key does not match)."""
        (result,) = await self.write_batch([Delete(key, expected_version=expected_version,
                                                   partition_key=partition_key)])
        if result.outcome is Outcome.BAD_VERSION:
            raise condition_failed(key, expected_version)
        return result.outcome is Outcome.OK
