"""An END_TXN whose decision write outlives its request deadline (a writer stalled behind a slow fsync, or
SIGSTOPped): the write lands later, and an ADD that read the header before it landed must not be
answered success once the decision is on disk (docs/semantics.md §2: COMMITTED + ADD_* ->
InvalidTxnStatus; docs/participants.md: records written after the decision are refused). Found by a
review during a kill -9 torture run; a real process showed it with its writer stopped (SIGSTOP)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from tc_server.coordinator.errors import InvalidTxnStatus
from tc_server.coordinator.layout import Participant, TxnState
from tc_server.store.memory import MemoryStore
from tests.coordinator.test_partition import header
from tests.participants.test_outbox import OTHER, TOPIC, RecordingSender, led

_T = TypeVar("_T")


class StalledWriter(MemoryStore):
    """Every write waits, in arrival order, for the gate, and lands even when its caller gave up: the
    embedded store's writer process stalled (what a request timeout cannot take back)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self._tail: asyncio.Future[Any] | None = None

    def _in_order(self, write: Callable[[], Awaitable[_T]]) -> Awaitable[_T]:
        before = self._tail

        async def run() -> _T:
            if before is not None:
                await asyncio.gather(before, return_exceptions=True)
            await self.gate.wait()
            return await write()

        task = asyncio.ensure_future(run())
        self._tail = task
        return asyncio.shield(task)

    async def _put_record(self, op):
        return await self._in_order(lambda: MemoryStore._put_record(self, op))

    async def write_batch(self, ops):
        return await self._in_order(lambda: MemoryStore.write_batch(self, ops))


async def test_an_add_whose_record_lands_after_the_decision_is_refused() -> None:
    store = StalledWriter()
    sender = RecordingSender()
    async with led(store, sender) as tc:
        partition = tc.partition(0)
        least = await partition.new_txn(60_000, None)
        await partition.add_participants(least, None, [Participant(TOPIC)])
        store.gate.clear()  # the writer stalls
        with pytest.raises(TimeoutError):  # the request deadline (--request-timeout-s): outcome unknown
            await asyncio.wait_for(partition.end_txn(least, commit=True, principal=None), 0.1)
        # The same txn's ADD reads the header (still OPEN on disk) and queues its record behind the CAS.
        add = asyncio.ensure_future(partition.add_participants(least, None, [Participant(OTHER)]))
        await asyncio.sleep(0.05)
        store.gate.set()  # the writer goes on: the decision lands first, then the ADD's record
        outcome = (await asyncio.gather(add, return_exceptions=True))[0]
        assert (await header(store, 0, least)).state is TxnState.COMMITTED
        # The ADD was acknowledged after the COMMIT was durable: it must be refused instead.
        assert isinstance(outcome, InvalidTxnStatus), f"ADD answered {outcome!r} on a txn already COMMITTED"
        # Both participants still hear the commit (the refused ADD's record was written all the same).
        for _ in range(200):  # bounded: the delivery runs in the background
            if {t.participant.topic for t in sender.told if t.committed} == {TOPIC, OTHER}:
                break
            await asyncio.sleep(0.01)
        assert {(t.participant.topic, t.committed) for t in sender.told} == {(TOPIC, True), (OTHER, True)}
