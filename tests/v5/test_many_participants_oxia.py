"""PIP-473 participant path at scale: one txn with thousands of Pulsar 5 participants on the Oxia
stand-in with 3 shards: END_TXN must write one event to every participant's stream (on its own shard), none
missing past a batch or scan page boundary.

Upstream facts relied on (apache/pulsar 5.0.0-M1): ``TransactionCoordinatorV5.fanOutEvents`` publishes one event
per distinct WRITE segment and per distinct (segment, subscription) found by ``listOpsByTxn``; a participant
re-reads the header only when an event reaches its own stream (``MetadataTransactionBuffer.triggerReconcile``),
so a missing event leaves its segment pinned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tc_server.coordinator import layout
from tc_server.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
from tc_server.coordinator.layout import OpKind, TxnOp
from tc_server.coordinator.partition import PartitionConfig
from tc_server.metrics import Metrics
from tc_server.store.api import Put
from tc_server.store.oxia import connect as connect_oxia
from tests.support.oxia_standin import StandinStartError, standin_oxia_process

pytestmark = pytest.mark.timeout(400)

SEGMENTS = 1500
ACKS = 600


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def oxia_address(tmp_path: Path) -> Iterator[str]:
    try:
        with standin_oxia_process(tmp_path / "standin.log", shards=3) as address:
            yield address
    except StandinStartError as exc:
        pytest.fail(str(exc))


async def test_every_one_of_thousands_of_participants_gets_its_event(oxia_address: str) -> None:
    import time
    store = await connect_oxia(oxia_address, request_timeout_s=30.0)
    config = CoordinatorConfig(partitions=1, timeout_sweep=False, partition=PartitionConfig(id_block_size=10))
    tc = TransactionCoordinator(store, config, Metrics("v5"), FakeClock(int(time.time() * 1000)))
    await tc.start()
    try:
        await tc.wait_recovered()
        part = tc.partition(0)
        least = await part.new_txn(600_000, None)
        segments = [f"segment://public/default/many-{i} \u00e9/{i % 7}" for i in range(SEGMENTS)]
        pairs = [(segments[i], f"sub {i}:x") for i in range(ACKS)]
        ops = [TxnOp(OpKind.WRITE, s, 0, 0) for s in segments] + [TxnOp(OpKind.ACK, s, 1, 2, sub) for s, sub in pairs]
        pk = layout.txn_key(0, least)
        puts = [Put(layout.op_prefix(0, least), op.to_json(), partition_key=pk, sequential=True,
                    secondary_indexes=op.index_entries(0, least)) for op in ops]
        for start in range(0, len(puts), 500):
            await store.write_batch(puts[start:start + 500])
        await asyncio.wait_for(part.end_txn(least, True, None), 120)
        event = layout.event_json(0, least, layout.TxnState.COMMITTED)
        missing = []
        for s in segments:
            found = [r async for r in store.scan_prefix(layout.segment_events_prefix(s) + "-",
                                                        partition_key=layout.enc(s))]
            if [r.value for r in found] != [event]:
                missing.append(s)
        for s, sub in pairs:
            key = layout.subscription_partition_key(s, sub)
            found = [r async for r in store.scan_prefix(layout.subscription_events_prefix(s, sub) + "-",
                                                        partition_key=key)]
            if [r.value for r in found] != [event]:
                missing.append(f"{s} / {sub}")
        assert not missing, f"{len(missing)} participants without exactly one event, e.g. {missing[:3]}"
    finally:
        await tc.stop()
        await store.close()
