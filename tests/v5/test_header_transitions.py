"""What tc-server writes when it CASes a header that Pulsar 5's own coordinator wrote (PIP-473 records).

Upstream facts relied on (apache/pulsar, pulsar-broker 5.0.0-M1, the same in master):

* ``pulsar-broker/src/main/java/org/apache/pulsar/broker/transaction/coordinator/v5/TransactionCoordinatorV5.java``,
  ``endTransaction``: the terminal header is built from the stored one, keeping its ``timeout``, ``createdAt``
  and ``owner`` objects as read, and setting only ``state`` and ``finalizedAt`` (``Instant.now()``). The timeout
  sweep (``sweepTimeouts``) ends a txn through the same ``endTransaction(ABORT)``.
* ``newTransaction`` stamps ``createdAt`` with ``Instant.now()``, which on Linux carries microseconds, and
  ``TxnMetadataStore.toJson`` (Jackson) writes it as decimal seconds with 9 fraction digits
  (``1795447209.230663502``).

So the bytes of ``createdAt`` in a terminal header Pulsar writes are exactly the bytes the OPEN header held.
tc-server keeps instants in milliseconds, and when it ended such a txn (after a take-over from Pulsar's
coordinator, a migration, or a shared store where tc-server's recovery adopted the OPEN header) it wrote
``createdAt`` rounded down to the millisecond: a terminal header byte-different from Pulsar's (found by a
review). It now writes back the stored text.
"""

from __future__ import annotations

import pytest

from tc_server.coordinator import layout
from tc_server.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
from tc_server.coordinator.errors import TransactionNotFound
from tc_server.coordinator.partition import PartitionConfig
from tc_server.metrics import Metrics
from tc_server.store.api import EXPECT_ABSENT
from tc_server.store.memory import MemoryStore

CREATED_TEXT = "1795447209.230663502"  # what Pulsar's Instant.now() serialises to (sub-ms digits)
CREATED_MS = 1795447209230
TIMEOUT_MS = 60_000
TC = 1
LEAST = 5


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


async def _pulsar_open_header(store: MemoryStore, owner: str | None = None) -> bytes:
    """An OPEN header byte for byte as Pulsar's TransactionCoordinatorV5.newTransaction writes it."""
    value = '{"state":"OPEN","timeout":60.000000000,"createdAt":' + CREATED_TEXT
    if owner is not None:
        value += ',"owner":"' + owner + '"'
    raw = (value + "}").encode()
    await store.put(layout.header_path(TC, LEAST), raw, expected_version=EXPECT_ABSENT,
                    partition_key=layout.txn_key(TC, LEAST),
                    secondary_indexes={layout.IDX_TXN_BY_DEADLINE: layout.deadline_index_key(CREATED_MS + TIMEOUT_MS)})
    return raw


async def _coordinator(store: MemoryStore, clock: FakeClock) -> TransactionCoordinator:
    config = CoordinatorConfig(partitions=4, partition=PartitionConfig(id_block_size=10), timeout_sweep=False,
                               gc_retention_s=900)
    tc = TransactionCoordinator(store, config, Metrics("v5"), clock)
    await tc.start()
    await tc.wait_recovered()
    return tc


def _expected_terminal(state: str, finalized_ms: int, owner: str | None = None) -> bytes:
    """Pulsar's endTransaction: same timeout/createdAt/owner objects, new state and finalizedAt."""
    text = (f'{{"state":"{state}","timeout":60.000000000,"createdAt":{CREATED_TEXT},'
            f'"finalizedAt":{layout.seconds_text(finalized_ms)}')
    if owner is not None:
        text += f',"owner":"{owner}"'
    return (text + "}").encode()


@pytest.mark.parametrize("commit", [True, False])
async def test_end_txn_keeps_pulsars_created_at_bytes(commit: bool) -> None:
    """END_TXN at tc-server on a header Pulsar's coordinator created: Pulsar would keep ``createdAt`` as it was
    stored (TransactionCoordinatorV5.endTransaction copies current.getCreatedAt()); tc-server rewrites it at
    millisecond precision (1795447209.230000000)."""
    store = MemoryStore()
    clock = FakeClock(CREATED_MS + 1_000)
    await _pulsar_open_header(store, owner="app-1")
    tc = await _coordinator(store, clock)
    try:
        await tc.partition(TC).end_txn(LEAST, commit, "app-1")
        record = await store.get(layout.header_path(TC, LEAST), partition_key=layout.txn_key(TC, LEAST))
        assert record is not None
        expected = _expected_terminal("COMMITTED" if commit else "ABORTED", clock.now, owner="app-1")
        assert record.value == expected
    finally:
        await tc.stop()
        await store.close()


async def test_timeout_abort_keeps_pulsars_created_at_bytes() -> None:
    """The timeout path (Pulsar: sweepTimeouts -> endTransaction(ABORT)): the aborted header keeps the stored
    createdAt bytes; tc-server's timeout abort (recovered from the deadline index) truncated them."""
    store = MemoryStore()
    clock = FakeClock(CREATED_MS + 1_000)
    await _pulsar_open_header(store)
    tc = await _coordinator(store, clock)
    try:
        clock.now = CREATED_MS + TIMEOUT_MS + 5
        aborted = await tc.abort_expired_now()
        assert aborted == 1
        record = await store.get(layout.header_path(TC, LEAST), partition_key=layout.txn_key(TC, LEAST))
        assert record is not None
        assert record.value == _expected_terminal("ABORTED", clock.now)
    finally:
        await tc.stop()
        await store.close()


async def test_commit_after_deadline_keeps_pulsars_created_at_bytes() -> None:
    """tc-server's own rule (commit past the deadline aborts; docs/semantics.md) writes the same kind of
    ABORTED header; its createdAt must still be the bytes the stored header held."""
    store = MemoryStore()
    clock = FakeClock(CREATED_MS + 1_000)
    await _pulsar_open_header(store)
    tc = await _coordinator(store, clock)
    try:
        clock.now = CREATED_MS + TIMEOUT_MS + 5
        with pytest.raises(TransactionNotFound, match="timed out"):
            await tc.partition(TC).end_txn(LEAST, True, None)
        record = await store.get(layout.header_path(TC, LEAST), partition_key=layout.txn_key(TC, LEAST))
        assert record is not None
        assert record.value == _expected_terminal("ABORTED", clock.now)
    finally:
        await tc.stop()
        await store.close()


async def test_a_clamped_end_is_not_before_the_kept_created_at() -> None:
    # The end is never stamped before the creation (a clock behind the creator's, or the same millisecond): it
    # was clamped to createdAt floored to the millisecond, while createdAt is written back with its nanoseconds,
    # so the header said finalizedAt 1795447209.230000000 < createdAt 1795447209.230663502 (a review).
    store = MemoryStore()
    await _pulsar_open_header(store)
    tc = await _coordinator(store, FakeClock(CREATED_MS - 500))  # the clamp's case: a clock behind the creator's
    try:
        await tc.partition(TC).end_txn(LEAST, True, None)
        record = await store.get(layout.header_path(TC, LEAST), partition_key=layout.txn_key(TC, LEAST))
        assert record is not None and record.value == _expected_terminal("COMMITTED", CREATED_MS + 1)
    finally:
        await tc.stop()
        await store.close()
