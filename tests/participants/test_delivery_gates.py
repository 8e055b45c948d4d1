"""BrokerDelivery's bounds (--delivery-max-in-flight, --delivery-max-in-flight-per-broker): a broker that
never answers holds its own slots only. The brokers here are in-process stand-ins behind the connection
pool's interface, or on real sockets (tests/support/stand_in_broker.py): a real broker cannot be made to hang
on cue (the real ones are in test_real_broker.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import structlog

from tc_server.bench.process import free_port
from tc_server.client import ConnectionPool, connect_command
from tc_server.coordinator.layout import Participant
from tc_server.metrics import Metrics
from tc_server.participants import delivery as delivery_module
from tc_server.participants.delivery import BrokerDelivery
from tc_server.wire import EndTxnOnPartitionResponse, ServerError
from tests.support.stand_in_broker import StandInBroker as SocketStandIn
from tests.support.stand_in_broker import acknowledge, connect_to
from tests.support.waiting import async_wait_for

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


UPSTREAM = "pulsar://upstream:6650"


async def test_deliveries_waiting_for_one_slow_lookup_do_not_hold_the_others_back() -> None:
    # Every delivery waiting for the one lookup of its topic held an overall slot: 4 of them (1,000 with the
    # default bound, one second of commits to a hot partition) stalled the deliveries to every other broker
    # until that lookup's deadline (a review).
    class NoAnswer:
        def next_request_id(self) -> int:
            return 1

        async def request_frame(self, frame: bytes, request_id: int, timeout_s: float | None = None) -> Any:
            await asyncio.Event().wait()

    pool = StandInPool()
    pool.brokers[UPSTREAM] = NoAnswer()  # type: ignore[assignment]
    delivery = BrokerDelivery([UPSTREAM], pool, request_timeout_s=60.0,  # type: ignore[arg-type]
                              max_in_flight=4, max_in_flight_per_broker=100, metrics=Metrics("lookup_gates"))
    delivery._owners["healthy"] = HEALTHY  # its owner is known: no lookup
    waiting = [asyncio.create_task(delivery.end_txn_on(Participant("slow-topic"), 0, n, True, lambda: -1))
               for n in range(4)]
    await asyncio.sleep(0.05)  # all four wait for the one lookup of slow-topic
    try:
        await asyncio.wait_for(delivery.end_txn_on(Participant("healthy"), 0, 99, True, lambda: -1), 30.0)
        assert pool.brokers[HEALTHY].answered == 1
        assert not any(task.done() for task in waiting), "the slow lookup is still under way"
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)


def owner_broker() -> SocketStandIn:
    """A broker on a real socket that acknowledges every END_TXN_ON_PARTITION at once (``end_txns`` holds them)."""
    return SocketStandIn(end_txn_answer=acknowledge)


async def test_a_first_upstream_that_does_not_answer_lookups_is_passed_over_for_the_next() -> None:
    # --upstream-url A,B: delivery asked A for every lookup and went to B only when A refused the
    # connection. A broker that takes connections and answers PING but no LOOKUP (it lost its metadata
    # session) held every delivery whose owner was not known yet, for good.
    hung = await SocketStandIn(answer=lambda lookup: None).start()
    owner = owner_broker()
    await owner.start()
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
    owner = owner_broker()
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
        assert len(owner.end_txns) == 100
    finally:
        for task in owed:
            task.cancel()
        await asyncio.gather(*owed, return_exceptions=True)
        await pool.close()
        for broker in (upstream, owner):
            broker.stop()


def lookups_under_way() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if task.get_name().startswith("lookup ") and not task.done()]


async def test_a_lookup_no_delivery_waits_for_any_more_ends_with_them() -> None:
    # A step-down or a stop cancels every delivery. Their shared lookup ran on untracked until its own
    # deadline, past stop(), and then passed over the first upstream URL for every later lookup of the
    # instance, although that URL had done nothing wrong but be slow.
    slow = await SocketStandIn(answer=lambda lookup: None).start()
    pool = ConnectionPool(connect_command(), timeout_s=3.0)
    delivery = BrokerDelivery([slow.url, "pulsar://127.0.0.1:1"], pool, request_timeout_s=3.0, max_in_flight=10,
                              max_in_flight_per_broker=10, metrics=Metrics("abandoned_lookup"))
    topic = "persistent://t/n/topic-partition-0"
    owed = [asyncio.create_task(delivery.end_txn_on(Participant(topic), 0, least, True, lambda: -1))
            for least in range(3)]
    try:
        # Until the lookup is in (a connection and its handshake first), not a fixed time: CI machines run slowly.
        await async_wait_for(lambda: slow.lookup_frames, "the shared lookup reached the upstream", 10, 0.01)
        assert len(slow.lookup_frames) == 1 and len(lookups_under_way()) == 1
        for task in owed:
            task.cancel()
        await asyncio.gather(*owed, return_exceptions=True)
        await asyncio.sleep(0.01)
        assert lookups_under_way() == []
        await asyncio.sleep(3.3)  # past the lookup's deadline
        assert delivery._urls[delivery._preferred] == slow.url
    finally:
        await pool.close()
        slow.stop()


@contextlib.asynccontextmanager
async def lookups_taking_a_while(name: str) -> AsyncIterator[tuple[SocketStandIn, SocketStandIn, BrokerDelivery]]:
    """A broker that acknowledges, an upstream whose lookups name it after 1 s, and a delivery through them."""
    owner = owner_broker()
    await owner.start()
    upstream = await SocketStandIn(connect_to(owner.url), lookup_delay_s=1.0).start()
    pool = ConnectionPool(connect_command(), timeout_s=1.0)
    try:
        yield owner, upstream, BrokerDelivery([upstream.url], pool, request_timeout_s=5.0, max_in_flight=10,
                                              max_in_flight_per_broker=10, metrics=Metrics(name))
    finally:
        await pool.close()
        for broker in (upstream, owner):
            broker.stop()


async def test_a_delivery_cancelled_while_it_waits_leaves_the_lookup_to_the_others() -> None:
    async with lookups_taking_a_while("shared_lookup_left") as (owner, upstream, delivery):
        topic = "persistent://t/n/topic-partition-0"
        cancelled, waiting = (asyncio.create_task(delivery.end_txn_on(Participant(topic), 0, least, True, lambda: -1))
                              for least in range(2))
        # Cancelled while the lookup is under way (it is answered 1 s after it arrived).
        await async_wait_for(lambda: upstream.lookup_frames, "the shared lookup reached the upstream", 10, 0.01)
        cancelled.cancel()
        await asyncio.wait_for(waiting, 10)
        assert cancelled.cancelled()
        assert len(upstream.lookup_frames) == 1 and len(owner.end_txns) == 1


async def test_a_delivery_whose_lookup_is_cancelled_under_it_retries() -> None:
    # Only this delivery's own cancellation may end it: had the shared lookup been cancelled by anything
    # else (a pool closing its connects), the delivery ended quietly and its participant was never told.
    async with lookups_taking_a_while("lookup_cancelled_under_it") as (owner, upstream, delivery):
        owed = asyncio.create_task(delivery.end_txn_on(Participant("persistent://t/n/topic"), 0, 1, True,
                                                       lambda: -1))
        try:
            # While the first lookup is under way (it is answered 1 s after it arrived).
            await async_wait_for(lambda: upstream.lookup_frames, "the first lookup reached the upstream", 10, 0.01)
            (lookup,) = lookups_under_way()
            lookup.cancel()
            await asyncio.wait_for(owed, 10)
            assert len(upstream.lookup_frames) == 2 and len(owner.end_txns) == 1
        finally:
            owed.cancel()


def refusing_broker() -> SocketStandIn:
    """A broker on a real socket that refuses every END_TXN_ON_PARTITION, as one whose authorization does not
    take tc-server's role answers (TransactionNotFound, not retryable)."""
    return SocketStandIn(end_txn_answer=lambda command: EndTxnOnPartitionResponse(
        command.request_id, command.most, command.least, ServerError.TransactionNotFound,
        "tc-server is not a super user"))


async def test_refusals_of_many_topics_are_one_line_per_broker_pointing_at_the_listing() -> None:
    # A line per refused topic (each topic's own key) let a client that names a new topic no broker knows in
    # every txn write a line per txn, again every 30 s, for good: 9,220 lines for 30,000 txns (a review). One
    # line a second per broker and error now; every refused participant is in the admin's listing.
    broker = await refusing_broker().start()
    upstream = await SocketStandIn(connect_to(broker.url)).start()
    pool = ConnectionPool(connect_command(), timeout_s=1.0)
    delivery = BrokerDelivery([upstream.url], pool, request_timeout_s=5.0, max_in_flight=10,
                              max_in_flight_per_broker=10, metrics=Metrics("refusals_named"))
    topics = [f"persistent://t/n/topic-{n}" for n in range(20)]
    with structlog.testing.capture_logs() as lines:
        owed = [asyncio.create_task(delivery.end_txn_on(Participant(topic), 0, 1, True, lambda: -1))
                for topic in topics]
        try:
            await async_wait_for(lambda: any("refused by the broker" in line["event"] for line in lines),
                                 "a refusal logged", 10, 0.01)
            await asyncio.sleep(0.3)  # the other topics' refusals, which must add no line
        finally:
            for task in owed:
                task.cancel()
            await asyncio.gather(*owed, return_exceptions=True)
            await pool.close()
            for stand_in in (upstream, broker):
                stand_in.stop()
    refused = [line for line in lines if "refused by the broker" in line["event"]]
    # One line a second: on a slow machine the 20 refusals may spread over two seconds, never a line each.
    assert 1 <= len(refused) <= 2, refused
    assert refused[0]["topic"] in topics and "/admin/v3/transactions/undelivered" in refused[0]["event"]


async def test_a_reminder_is_one_attempt_counted_and_never_retried() -> None:
    # The ABORT reminder (partition.py) tells a broker again what it acknowledged before: best effort. Through
    # end_txn_on, a broker gone meanwhile was retried for the reminder's whole bound, with the warnings of an
    # undelivered decision (a review's).
    pool = StandInPool()
    metrics = Metrics("reminder")
    delivery = BrokerDelivery(["pulsar://upstream:6650"], pool, request_timeout_s=0.2,  # type: ignore[arg-type]
                              max_in_flight=4, max_in_flight_per_broker=1, metrics=metrics)
    delivery._owners["hanging"] = HANGING  # its lookup answered before
    delivery._owners["healthy"] = HEALTHY
    with structlog.testing.capture_logs() as logged:
        assert await asyncio.wait_for(delivery.remind_txn_on(Participant("hanging"), 0, 1, False, lambda: -1), 5.0) \
            is False
        assert await asyncio.wait_for(delivery.remind_txn_on(Participant("healthy"), 0, 1, False, lambda: -1), 5.0)
    assert pool.brokers[HANGING].request_ids == 1 and pool.brokers[HEALTHY].answered == 1
    assert [entry["log_level"] for entry in logged] == ["info"], logged
    requests = metrics.participant_requests
    assert [requests.labels("END_TXN_ON_PARTITION", outcome).value for outcome in ("TimeoutError", "ok")] == [1, 1]


async def test_the_remembered_owners_are_bounded_by_the_bytes_of_their_names(monkeypatch: Any) -> None:
    # Found by a review: bounded by count alone (100,000), the owners of topics with names of 2 KB (the longest a
    # txn may record) held ~200 MB, and a client naming new topics in a namespace that creates them on lookup
    # fills it at will. Past MAX_REMEMBERED_OWNER_BYTES (64 KiB here) the memory starts over.
    monkeypatch.setattr(delivery_module, "MAX_REMEMBERED_OWNER_BYTES", 64 * 1024)
    owner = await owner_broker().start()
    upstream = await SocketStandIn(connect_to(owner.url)).start()
    pool = ConnectionPool(connect_command(), timeout_s=1.0)
    delivery = BrokerDelivery([upstream.url], pool, request_timeout_s=5.0, max_in_flight=10,
                              max_in_flight_per_broker=10, metrics=Metrics("owner_bytes"))
    try:
        for n in range(100):  # 100 names of 2 KB: 200 KB of them
            topic = f"persistent://t/n/{n:04}-" + "x" * 2000
            await asyncio.wait_for(delivery.end_txn_on(Participant(topic), 0, n, True, lambda: -1), 10.0)
            assert sum(map(len, delivery._owners)) <= 64 * 1024 + 2100
        assert len(owner.end_txns) == 100
    finally:
        await pool.close()
        for stand_in in (upstream, owner):
            stand_in.stop()
