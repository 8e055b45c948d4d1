"""BrokerDelivery's bounds (--delivery-max-in-flight, --delivery-max-in-flight-per-broker): a broker that
never answers holds its own slots only. The brokers here are in-process stand-ins behind the connection
pool's interface, or on real sockets (tests/support/stand_in_broker.py): a real broker cannot be made to hang
on cue (the real ones are in test_real_broker.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from tc_server.bench.process import free_port
from tc_server.client import ConnectionPool, connect_command
from tc_server.coordinator.layout import Participant
from tc_server.metrics import Metrics
from tc_server.participants.delivery import BrokerDelivery
from tc_server.wire import EndTxnOnPartition, EndTxnOnPartitionResponse, decode_command, encode_command
from tests.support.stand_in_broker import StandInBroker as SocketStandIn
from tests.support.stand_in_broker import connect_to

HANGING = "pulsar://hanging:6650"
HEALTHY = "pulsar://healthy:6650"


class StandInBroker:
    """One connection of the pool: answers END_TXN_ON_* at once, or never (``hangs``)."""

    def __init__(self, hangs: bool) -> None:
        self.hangs = hangs
        self.request_ids = 0
        self.answered = 0

    def next_request_id(self) -> int:
        self.request_ids += 1
        return self.request_ids

    async def request(self, command: Any) -> Any:
        if self.hangs:
            await asyncio.Event().wait()
        self.answered += 1
        return SimpleNamespace(error=None)


class StandInPool:
    def __init__(self) -> None:
        self.brokers = {HANGING: StandInBroker(hangs=True), HEALTHY: StandInBroker(hangs=False)}

    async def get(self, url: str) -> StandInBroker:
        return self.brokers[url]


async def test_deliveries_queued_for_a_hanging_broker_do_not_hold_the_others_back() -> None:
    pool = StandInPool()
    delivery = BrokerDelivery(["pulsar://upstream:6650"], pool, request_timeout_s=30.0,  # type: ignore[arg-type]
                              max_in_flight=4, max_in_flight_per_broker=1, metrics=Metrics("gates"))
    for n in range(4):
        delivery._owners[f"hanging-{n}"] = HANGING  # owners known: no lookup
    delivery._owners["healthy"] = HEALTHY
    queued = [asyncio.create_task(delivery.end_txn_on(Participant(f"hanging-{n}"), 0, n, True, lambda: -1))
              for n in range(4)]
    await asyncio.sleep(0.05)  # one request at the hanging broker, three queued at its gate
    try:
        # Before, the three queued held overall slots while they waited: with the one sending, all 4
        # were taken, and the healthy broker's delivery waited for a request timeout.
        await asyncio.wait_for(delivery.end_txn_on(Participant("healthy"), 0, 99, True, lambda: -1), 5.0)
        assert pool.brokers[HEALTHY].answered == 1
    finally:
        for task in queued:
            task.cancel()
        await asyncio.gather(*queued, return_exceptions=True)


class OwnerBroker(SocketStandIn):
    """A broker on a real socket that acknowledges every END_TXN_ON_PARTITION at once (``end_txns`` counts them)."""

    end_txns = 0

    async def _on_frame(self, frame: bytes, writer: asyncio.StreamWriter) -> None:
        command = decode_command(frame)
        if isinstance(command, EndTxnOnPartition):
            self.end_txns += 1
            writer.write(encode_command(EndTxnOnPartitionResponse(command.request_id, command.most,
                                                                  command.least, None, None)))
            return
        await super()._on_frame(frame, writer)


async def test_a_first_upstream_that_does_not_answer_lookups_is_passed_over_for_the_next() -> None:
    # --upstream-url A,B: delivery asked A for every lookup and went to B only when A refused the
    # connection. A broker that takes connections and answers PING but no LOOKUP (it lost its metadata
    # session) held every delivery whose owner was not known yet, for good.
    hung = await SocketStandIn(answer=lambda lookup: None).start()
    owner = await OwnerBroker().start()
    answering = await SocketStandIn(connect_to(owner.url)).start()
    pool = ConnectionPool(connect_command(), timeout_s=1.0)
    delivery = BrokerDelivery([hung.url, answering.url], pool, request_timeout_s=1.0, max_in_flight=10,
                              max_in_flight_per_broker=10, metrics=Metrics("failover"))
    try:
        for least in range(3):
            await asyncio.wait_for(delivery.end_txn_on(Participant(f"persistent://t/n/topic-{least}"), 0, least,
                                                       True, lambda: -1), 30)
        assert len(hung.lookup_frames) == 1  # once, then the next URL for the later lookups too
        assert len(answering.lookup_frames) == 3
    finally:
        await pool.close()
        for broker in (hung, owner, answering):
            broker.stop()


async def test_deliveries_to_one_topic_share_one_lookup_while_its_broker_is_down() -> None:
    # A broker down with many decisions owed to one of its partitions: every delivery retried with a lookup
    # of its own, so the upstream got one lookup per txn per retry (here ~100 per round) for as long as the
    # outage lasted. Deliveries to one topic now wait for one lookup between them.
    down = f"pulsar://127.0.0.1:{free_port()}"  # nothing listens there: connecting is refused at once
    upstream = await SocketStandIn(connect_to(down)).start()
    owner = OwnerBroker()
    await owner.start()
    pool = ConnectionPool(connect_command(), timeout_s=1.0)
    delivery = BrokerDelivery([upstream.url], pool, request_timeout_s=2.0, max_in_flight=1000,
                              max_in_flight_per_broker=1000, metrics=Metrics("shared_lookups"))
    topic = "persistent://t/n/busy-partition-0"
    owed = [asyncio.create_task(delivery.end_txn_on(Participant(topic), 0, least, True, lambda: -1))
            for least in range(100)]
    try:
        await asyncio.sleep(1.5)  # several retry rounds against the broker that is down
        assert not any(task.done() for task in owed)
        lookups_while_down = len(upstream.lookup_frames)
        assert 1 <= lookups_while_down <= 20, lookups_while_down  # before: ~100 per retry round
        upstream.answer = connect_to(owner.url)  # the topic moved to a broker that is up
        await asyncio.wait_for(asyncio.gather(*owed), 30)
        assert owner.end_txns == 100
    finally:
        for task in owed:
            task.cancel()
        await asyncio.gather(*owed, return_exceptions=True)
        await pool.close()
        for broker in (upstream, owner):
            broker.stop()
