"""Transaction id allocation: block reservation by CAS on ``/txn/tc-seq/<tcId>`` (docs/semantics.md §1).

One CAS reserves ``[next, next + block)`` and the leader hands those ids out from memory, so NEW_TXN
does not serialize on a store round trip (Pulsar's v5 TC does one CAS per txn on this record). The
next block is reserved in the background when half of the current one is used. Ids are never reused:
a new leader (or this process after a restart) starts at the stored ``next`` and skips whatever the
previous holder had reserved but not handed out. Two instances that both believe they lead still get
disjoint blocks, because each block is one successful CAS.

No block starts below the wall clock's milliseconds times a million (``id_floor``), and a sequence the
store does not hold yet starts there, not at 0. A broker keeps the ids of the aborted transactions it saw
for as long as their topic's data is kept (its transaction-buffer snapshot), and drops the messages of
any later transaction with such an id as aborted: ids must not repeat across stores either. Not those of
the brokers' own coordinator that tc-server replaces (its ids count from 0), nor those of an earlier
store in front of the same brokers (a new deployment, a move from the embedded store to Oxia, a lost
data directory, a backup restored: its sequence is behind the ids handed out since). With ids from 0, a
committed transaction with the id of one they had aborted lost its messages, with no error anywhere
(tests/participants/test_id_reuse.py). Any earlier sequence is behind the floor unless it handed out a
million ids per millisecond, or the clock went back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tc_server.coordinator import layout
from tc_server.coordinator.errors import CoordinatorNotFound, StoreCorrupted
from tc_server.store.api import EXPECT_ABSENT, BadVersionError, MetadataStore

# A txn id half is a Java long in Pulsar (TxnID) and a uint64 on the wire: ids stay below 2^63.
MAX_TXN_ID = 2**63 - 1
# The floor of ids per millisecond of the wall clock (module docstring): ids read as the time their
# block was reserved (1795948345678000000: 2026-11-29 10:32:25.678 UTC), and the floor would reach 2^63
# in the year 2262 (it stops at half of it, so that a clock far ahead still leaves ids to hand out).
IDS_PER_MS = 1_000_000


def id_floor(now_ms: int) -> int:
    """The lowest id a block reserved at ``now_ms`` (the wall clock, milliseconds) starts at."""
    return min(max(0, now_ms) * IDS_PER_MS, MAX_TXN_ID // 2)


class IdAllocator:
    def __init__(self, store: MetadataStore, tc_id: int, block_size: int, clock: Callable[[], int]) -> None:
        self._store = store
        self._clock = clock  # the wall clock in milliseconds (the partition's): id_floor
        self._tc_id = tc_id
        self._block_size = block_size
        self._blocks: list[tuple[int, int]] = []  # reserved [start, end) ranges, oldest first
        self._next = 0
        self.last_issued = -1  # the last id handed out by this allocator (-1: none yet)
        self._end = 0
        self._refill: asyncio.Task[None] | None = None
        self._error: Exception | None = None
        self._closed = False  # the partition stepped down: reserve nothing more

    @property
    def reserved_next(self) -> int:
        """The exclusive end of everything this allocator has reserved so far."""
        return self._blocks[-1][1] if self._blocks else self._end

    async def close(self) -> None:
        """Stop a prefetch in flight (the partition is no longer led)."""
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            await asyncio.gather(self._refill, return_exceptions=True)
            self._refill = None

    def take(self) -> int | None:
        """The next id if one is at hand without waiting, else None (then await :meth:`next_id`). NEW_TXN
        calls this first: a coroutine per id, almost never suspended, was per-request cost (issue 13).
        None once closed: next_id then answers that the partition stepped down, and no prefetch starts
        that would outlive the partition's stop()."""
        if self._closed:
            return None
        while self._next >= self._end:
            if not self._blocks:
                return None
            self._next, self._end = self._blocks.pop(0)
        least = self._next
        self._next += 1
        self.last_issued = least
        if not self._blocks and self._end - self._next <= self._block_size // 2 and self._refill is None:
            # Prefetch so that the block runs out without anyone waiting on the store.
            self._refill = asyncio.create_task(self._reserve_quietly())
        return least

    async def next_id(self) -> int:
        while (least := self.take()) is None:
            await self._ensure_refill()
        return least

    async def _ensure_refill(self) -> None:
        if self._closed:
            raise self._stepped_down()
        if self._refill is None:
            self._refill = asyncio.create_task(self._reserve_quietly())
        refill = self._refill
        try:
            await asyncio.shield(refill)
        except asyncio.CancelledError:
            # close() cancelled the reservation, not the caller's own deadline (which cancels the
            # caller's task): a CancelledError would end the NEW_TXN's task as cancelled, and such a
            # request is never answered. Tell the client to look the coordinator up again instead.
            task = asyncio.current_task()
            if self._closed and refill.cancelled() and task is not None and task.cancelling() == 0:
                raise self._stepped_down() from None
            raise
        if not self._blocks and self._error is not None:
            error, self._error = self._error, None
            raise error

    def _stepped_down(self) -> CoordinatorNotFound:
        return CoordinatorNotFound(f"transaction coordinator {self._tc_id} stepped down on this instance while "
                                   f"the request waited for transaction ids; look it up again")

    async def _reserve_quietly(self) -> None:
        # A background prefetch must not leave an unretrieved task exception: keep the error for
        # the next caller that actually needs a block.
        try:
            self._blocks.append(await self._reserve_block())
            self._error = None  # an earlier failure is over: no waiter may hear of it after this success
        except Exception as exc:  # noqa: BLE001 - re-raised to the waiting caller
            self._error = exc
        finally:
            self._refill = None

    async def _reserve_block(self) -> tuple[int, int]:
        path = layout.tc_seq_path(self._tc_id)
        while True:
            record = await self._store.get(path)
            if record is None:
                stored, expected = 0, EXPECT_ABSENT
            else:
                try:
                    stored, expected = layout.parse_tc_seq(record.value), record.version
                except layout.MalformedRecord as exc:
                    # Not repaired here: its true value may be above the clock's floor, and ids below it were
                    # handed out. Named (it was UnknownError and a traceback naming no key: a review's).
                    raise StoreCorrupted(f"{path}: unreadable ({exc}); NEW_TXN of coordinator {self._tc_id} "
                                         "waits for it to be repaired") from None
            start = max(stored, id_floor(self._clock()))
            end = start + self._block_size
            if stored < 0 or end > MAX_TXN_ID + 1:
                # A damaged (or exhausted) sequence record: handing out such ids would create
                # headers no client can name; the stored value stays out of the message.
                raise StoreCorrupted(f"{path}: the next transaction id is outside 0..{MAX_TXN_ID}")
            try:
                await self._store.put(path, layout.tc_seq_json(end), expected_version=expected)
            except BadVersionError:
                continue  # another instance reserved a block meanwhile: take the one after it
            return start, end
