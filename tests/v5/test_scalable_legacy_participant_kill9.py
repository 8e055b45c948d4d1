"""The participant path for v5 clients: a ``scalable`` ADD_PARTITION / ADD_SUBSCRIPTION naming a
``persistent://`` topic is answered only once its participant record is durable; kill -9 of the real process
with many such ADDs in flight must leave a record for every ADD answered success.

Upstream facts relied on (apache/pulsar 5.0.0-M1): ``TransactionCoordinatorV5.addProducedPartitionToTxn`` /
``addAckedSubscriptionToTxn`` are no-ops (v5 participants record themselves as op records), while a
``persistent://`` topic keeps the legacy ``TopicTransactionBuffer`` / pending-ack handle in 5.x, which only
learns a decision from END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION (``ServerCnx.handleEndTxnOnPartition``).
tc-server therefore records such participants (docs/participants.md); a record lost after its ADD was
answered is a partition pinned for good.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tc_server.client import connect
from tc_server.coordinator import layout
from tc_server.coordinator.layout import Participant
from tc_server.store import open_store
from tc_server.wire.commands import AddPartitionToTxn, AddSubscriptionToTxn, NewTxn, Subscription, TcClientConnect
from tests.support.server_process import ServerProcess, started

pytestmark = pytest.mark.timeout(300)

TXNS = 40
PER_TXN = 6


@pytest.mark.parametrize("seed", [7])
async def test_every_answered_scalable_add_of_a_persistent_topic_survives_kill9(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    server = started(ServerProcess(tmp_path / "data", "--coordinators", "1"))
    try:
        client = await connect("127.0.0.1", server.port)
        answer = await client.request(TcClientConnect(client.next_request_id(), 0, scalable=True))
        assert answer.error is None, answer
        leasts = []
        for _ in range(TXNS):
            created = await client.request(NewTxn(client.next_request_id(), 120_000, 0, scalable=True))
            assert created.error is None, created
            leasts.append(created.least)
        wanted: dict[asyncio.Future[Any], tuple[int, Participant]] = {}
        for least in leasts:
            for j in range(PER_TXN):
                topic = f"persistent://public/default/t \u00e9 {j}-partition-{j}"
                cmd: AddPartitionToTxn | AddSubscriptionToTxn
                if j % 2:
                    sub = f"sub:{j} \U0001F600"
                    cmd = AddSubscriptionToTxn(client.next_request_id(), 0, least, (Subscription(topic, sub),),
                                               scalable=True)
                    participant = Participant(topic, sub)
                else:
                    cmd = AddPartitionToTxn(client.next_request_id(), 0, least, (topic,), scalable=True)
                    participant = Participant(topic)
                wanted[asyncio.ensure_future(client.request(cmd))] = (least, participant)
        target = rng.randint(10, len(wanted) // 2)
        deadline = time.monotonic() + 30
        while sum(f.done() for f in wanted) < target and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        server.kill()
        await asyncio.sleep(0.2)
        answered = [wanted[f] for f in wanted if f.done() and not f.cancelled() and f.exception() is None
                    and f.result().error is None]
        for f in wanted:
            f.cancel()
        client.close()
        assert answered
    finally:
        server.kill()
    store = await open_store("embedded", data_dir=str(tmp_path / "data"))
    try:
        lost = []
        for least, participant in answered:
            record = await store.get(participant.path(0, least), partition_key=layout.txn_key(0, least))
            if record is None or Participant.from_json(record.value) != participant:
                lost.append((least, participant))
        assert not lost, f"{len(lost)} of {len(answered)} answered ADDs have no participant record: {lost[:3]}"
    finally:
        await store.close()
