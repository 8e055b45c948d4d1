"""The Oxia client against the STAND-IN server (tests/oxia_standin): a Python imitation of Oxia's
client API, used because the real server cannot be installed here. What these tests prove is the
client's own behaviour (batching, matching, failure handling) against docs/oxia-client.md's description of the
server, not the server's behaviour itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest

from tc_server._proto import oxia_client_pb2 as pb
from tc_server._proto import oxia_client_pb2_grpc as pb_grpc
from tc_server.coordinator import layout
from tc_server.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
from tc_server.coordinator.leadership import leader_value
from tc_server.metrics import Metrics
from tc_server.store.api import (
    EXPECT_ABSENT,
    BadVersionError,
    Delete,
    InvalidOperationError,
    NotificationType,
    Outcome,
    Put,
    StoreClosedError,
    StoreUnavailableError,
    lease_clock,
)
from tc_server.store.oxia import OxiaStore, connect
from tc_server.store.oxia.notifications import INDEX_CHECK_PREFIX
from tc_server.store.oxia.routing import HASH_SPACE_MAX, ShardInfo, ShardMap, key_hash
from tc_server.store.oxia.store import children_range, is_child
from tc_server.store.oxia.write_stream import MAX_BATCHES_IN_FLIGHT
from tests.oxia_standin import server as standin
from tests.oxia_standin.server import StandinOxia, compare_with_slash
from tests.support.waiting import async_wait_for

# Only a bound so that a broken test fails instead of hanging; nothing asserts on durations.
WAIT = 10.0
# The request timeout of the tests that hold writes until it runs out: short, but their writes after the hold
# must still be answered within it, by a stand-in in the test's own loop (0.3 s failed on a stall of the machine).
HELD_TIMEOUT_S = 1.0


async def test_concurrent_puts_are_batched(store: OxiaStore, oxia: StandinOxia) -> None:
    before = oxia.write_requests
    records = await asyncio.gather(*(store.put(f"/b/{i}", str(i).encode()) for i in range(1000)))
    assert [r.key for r in records] == [f"/b/{i}" for i in range(1000)]
    # 1000 operations submitted in one event-loop step: at most one batch of 1000 (plus none).
    assert oxia.write_requests - before <= 2
    assert oxia.write_ops >= 1000


async def test_index_probes_of_one_turn_share_one_read(store: OxiaStore, oxia: StandinOxia) -> None:
    # END_TXN's question "did a participant write op records?" (index_probes.py): 300 asked in one step
    # are one Read call, each answered on its own.
    await store.put("/o/1_7-01", b"", partition_key="1_7", secondary_indexes={"idx:ops": "/txn/op/1_7"})
    found = await asyncio.gather(*(store.index_has("idx:ops", f"/txn/op/1_{i}", partition_key="1_7")
                                   for i in range(300)))
    assert found == [i == 7 for i in range(300)]
    # The store's one check whether the server answers index gets, then one Read for all 300 (who
    # waited for the check go on together).
    assert oxia.read_requests == 2
    before = oxia.read_requests
    await asyncio.gather(*(store.index_has("idx:ops", f"/txn/op/1_{i}", partition_key="1_7") for i in range(300)))
    assert oxia.read_requests - before == 1


async def test_index_probes_fail_typed_when_oxia_is_gone_and_after_close(oxia: StandinOxia) -> None:
    store = await connect(oxia.address, request_timeout_s=1.0)
    try:
        await oxia.stop()
        probes = [store.index_has("idx:ops", f"/txn/op/1_{i}", partition_key="p") for i in range(5)]
        for outcome in await asyncio.gather(*probes, return_exceptions=True):
            assert isinstance(outcome, StoreUnavailableError), outcome
    finally:
        await store.close()
    with pytest.raises(StoreClosedError):
        await store.index_has("idx:ops", "/txn/op/1_1", partition_key="p")


async def test_index_has_scans_on_a_server_without_index_gets(caplog: pytest.LogCaptureFixture) -> None:
    # A server before v0.13 takes a get on an index for a get of the key itself: index_has would say
    # "no" to everything. The store finds out once (a record of its own, looked up through an index of
    # its own, then deleted) and scans instead.
    server = StandinOxia(shards=1, index_gets=False)
    await server.start()
    store = await connect(server.address, request_timeout_s=2.0)
    try:
        await store.put("/o/1_7-01", b"", partition_key="1_7", secondary_indexes={"idx:ops": "/txn/op/1_7"})
        found = await asyncio.gather(*(store.index_has("idx:ops", f"/txn/op/1_{i}", partition_key="1_7")
                                       for i in range(10)))
        assert found == [i == 7 for i in range(10)]
        reads_after_check = server.read_requests
        assert await store.index_has("idx:ops", "/txn/op/1_7", partition_key="1_7")
        assert server.read_requests == reads_after_check == 1  # the check's probe; scans since
        await check_record_deleted(store)
    finally:
        await store.close()
        await server.stop()


async def test_index_has_asks_the_server_once_whether_it_answers_index_gets(store: OxiaStore,
                                                                          oxia: StandinOxia) -> None:
    assert not await store.index_has("idx:ops", "/txn/op/1_1", partition_key="p")
    assert oxia.read_requests == 2  # the check's probe, then this one
    assert not await store.index_has("idx:ops", "/txn/op/1_2", partition_key="p")
    assert oxia.read_requests == 3
    await check_record_deleted(store)


async def check_record_deleted(store: OxiaStore) -> None:
    """The index check's record is deleted once its answer is known (in the background, not waited for)."""
    async with asyncio.timeout(WAIT):
        while [r async for r in store.scan_prefix(INDEX_CHECK_PREFIX)]:
            await asyncio.sleep(0.01)


async def test_the_index_check_starts_with_the_first_write_and_a_store_that_writes_nothing_makes_none(
        oxia: StandinOxia) -> None:
    # The check's own put and delete went in line behind the first END_TXN's CAS: on a slow Oxia the first
    # END_TXNs after a start ran out of their request timeout (a review's). Started by the store's first
    # write instead; a store that only reads (tc-server export) writes nothing.
    reader = await connect(oxia.address, request_timeout_s=5.0)
    try:
        assert [r async for r in reader.scan_prefix("/")] == []
        assert oxia.write_requests == 0
    finally:
        await reader.close()
    store = await connect(oxia.address, request_timeout_s=5.0)
    try:
        await store.put("/txn/tc/leader/0", b"")
        await async_wait_for(lambda: store.index_gets_known, "the index check done after the first write")
        reads = oxia.read_requests
        assert not await store.index_has("idx:ops", "/txn/op/1_1", partition_key="p")
        assert oxia.read_requests == reads + 1  # the probe alone: nothing of the check left to do
        await check_record_deleted(store)
    finally:
        await store.close()


async def test_a_cancelled_put_not_yet_sent_is_never_sent(oxia: StandinOxia) -> None:
    # put()'s caller owns its write: END_TXN's deadline cancelling its CAS while the batch waits for the
    # writer's window withdraws it (what _send's gather did by cancelling the writer's future).
    store = await connect(oxia.address, request_timeout_s=5.0)
    try:
        await store.put("/w/warm", b"")
        writer = store.writers[0]
        oxia.hold_writes()
        held = []
        for i in range(MAX_BATCHES_IN_FLIGHT):  # the writer's window, full
            held.append(store.start_put(f"/w/{i}", b""))
            await async_wait_for(lambda count=i + 2: writer.batches_sent >= count,  # type: ignore[misc]
                                 f"batch {i} sent")
        cancelled = asyncio.ensure_future(store.put("/w/cancelled", b""))
        await asyncio.sleep(0.05)
        assert writer.batches_sent == MAX_BATCHES_IN_FLIGHT + 1  # /w/cancelled waits in the queue
        cancelled.cancel()
        oxia.release_writes()
        await asyncio.gather(*held)
        await store.put("/w/after", b"")
        assert await store.get("/w/cancelled") is None
        assert await store.get("/w/after") is not None
    finally:
        await store.close()


async def test_batch_limit_of_1000_ops(store: OxiaStore, oxia: StandinOxia) -> None:
    before = oxia.write_requests
    await store.write_batch([Put(f"/l/{i}", b"") for i in range(2500)])
    assert oxia.write_requests - before == 3


async def test_batch_byte_limit(store: OxiaStore, oxia: StandinOxia) -> None:
    before = oxia.write_requests
    await store.write_batch([Put(f"/big/{i}", b"x" * 40_000) for i in range(10)])
    # 128 KiB per batch: three 40 kB values fit, a fourth does not.
    assert oxia.write_requests - before == 4


async def test_responses_matched_in_order(store: OxiaStore) -> None:
    a = await store.put("/m/a", b"1")
    results = await store.write_batch([
        Put("/m/a", b"2", expected_version=a.version + 1000),
        Put("/m/b", b"b", expected_version=EXPECT_ABSENT),
        Delete("/m/none"),
        Put("/m/a", b"3", expected_version=a.version),
        Delete("/m/b"),
    ])
    assert [(r.outcome, r.key) for r in results] == [
        (Outcome.BAD_VERSION, "/m/a"), (Outcome.OK, "/m/b"), (Outcome.NOT_FOUND, "/m/none"),
        (Outcome.OK, "/m/a"), (Outcome.OK, "/m/b")]
    values = await asyncio.gather(*(store.put(f"/m/v{i}", bytes([i])) for i in range(200)))
    for i, record in enumerate(values):
        assert (record.key, record.value) == (f"/m/v{i}", bytes([i]))
        got = await store.get(record.key)
        assert got is not None
        assert got.version == record.version


async def test_put_after_delete_of_same_key_keeps_order(store: OxiaStore) -> None:
    await store.put("/o/k", b"1")
    results = await store.write_batch([Delete("/o/k"), Put("/o/k", b"2", expected_version=EXPECT_ABSENT)])
    assert [r.outcome for r in results] == [Outcome.OK, Outcome.OK]


async def test_write_stream_requires_metadata(oxia: StandinOxia) -> None:
    async with grpc.aio.insecure_channel(oxia.address) as channel:
        stub = pb_grpc.OxiaClientStub(channel)
        call = stub.WriteStream()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.write(pb.WriteRequest(shard=0, puts=[pb.PutRequest(key="/x", value=b"")]))
            await call.read()
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert oxia.visible_keys() == set()


async def test_invalid_operations_never_reach_the_server(store: OxiaStore, oxia: StandinOxia) -> None:
    before = oxia.write_requests
    with pytest.raises(InvalidOperationError):
        await store.put_sequential("/s/x", b"", partition_key="")
    with pytest.raises(InvalidOperationError):
        await store.write_batch([Put("/s/x", b"", sequential=True, partition_key="p", expected_version=1)])
    with pytest.raises(InvalidOperationError):
        await store.put("/s/y", b"", secondary_indexes={"a/b": "1"})
    assert oxia.write_requests == before
    # The stream is still the one opened before: nothing broke it.
    await store.put("/s/z", b"")
    assert oxia.write_streams_opened <= 1


async def test_broken_stream_fails_in_flight_then_recovers(store: OxiaStore, oxia: StandinOxia) -> None:
    await store.put("/f/warm", b"")
    oxia.hold_writes()
    before = oxia.write_requests
    pending = [asyncio.ensure_future(store.put(f"/f/{i}", b"")) for i in range(10)]
    await async_wait_for(lambda: oxia.write_requests > before, "the batch reached the server")
    oxia.break_write_streams()
    oxia.release_writes()
    outcomes = await asyncio.gather(*pending, return_exceptions=True)
    assert all(isinstance(o, StoreUnavailableError) for o in outcomes), outcomes
    # The next write opens a new stream by itself.
    record = await store.put("/f/after", b"ok")
    assert await store.get("/f/after") == record
    assert oxia.write_streams_opened == 2


async def test_unanswered_write_times_out_typed(oxia: StandinOxia) -> None:
    store = await connect(oxia.address, request_timeout_s=HELD_TIMEOUT_S)
    try:
        oxia.hold_writes()
        with pytest.raises(StoreUnavailableError):
            await store.put("/t/k", b"")
        oxia.release_writes()
        await store.put("/t/k2", b"")
    finally:
        await store.close()


async def test_start_put_without_a_task_fails_typed_like_put(store: OxiaStore, oxia: StandinOxia) -> None:
    # NEW_TXN's header write (start_put) is resolved from the shard writer's answer, with no task of its
    # own: a broken stream fails it as it fails put().
    await store.put("/s/warm", b"")
    oxia.hold_writes()
    before = oxia.write_requests
    pending = [store.start_put(f"/s/{i}", b"", expected_version=EXPECT_ABSENT) for i in range(10)]
    await async_wait_for(lambda: oxia.write_requests > before, "the batch reached the server")
    oxia.break_write_streams()
    oxia.release_writes()
    outcomes = await asyncio.gather(*pending, return_exceptions=True)
    assert all(isinstance(o, StoreUnavailableError) for o in outcomes), outcomes
    record = await store.start_put("/s/after", b"ok", expected_version=EXPECT_ABSENT)
    assert await store.get("/s/after") == record


async def test_start_put_times_out_typed_and_an_unsent_one_is_never_sent(oxia: StandinOxia) -> None:
    store = await connect(oxia.address, request_timeout_s=HELD_TIMEOUT_S)
    try:
        oxia.hold_writes()
        with pytest.raises(StoreUnavailableError, match="no answer within"):
            await store.start_put("/u/held", b"")  # in flight, held: its outcome stays unknown
        # The writer keeps MAX_BATCHES_IN_FLIGHT batches in flight; the next one waits in its queue and
        # times out unsent.
        sent = []
        writer = store.writers[0]
        for i in range(MAX_BATCHES_IN_FLIGHT - 1):  # the held one above is the first
            sent.append(store.start_put(f"/u/{i}", b""))
            await async_wait_for(lambda count=i + 2: writer.batches_sent >= count,  # type: ignore[misc]
                                 f"batch {i} sent")
        queued = store.start_put("/u/queued", b"")
        with pytest.raises(StoreUnavailableError, match="no answer within"):
            await queued
        oxia.release_writes()
        await asyncio.gather(*sent, return_exceptions=True)
        await store.put("/u/after", b"")
        assert await store.get("/u/queued") is None
    finally:
        await store.close()
    with pytest.raises(StoreClosedError):
        await store.start_put("/u/closed", b"")


async def test_outage_fails_typed_then_recovers_by_itself(oxia: StandinOxia) -> None:
    store = await connect(oxia.address, request_timeout_s=1.0)
    try:
        await store.put("/r/before", b"1")
        await oxia.stop()
        with pytest.raises(StoreUnavailableError):
            await store.put("/r/during", b"")
        with pytest.raises(StoreUnavailableError):
            await store.get("/r/before")
        with pytest.raises(StoreUnavailableError):
            [r async for r in store.scan_prefix("/r/")]
        await oxia.start()
        async with asyncio.timeout(WAIT):
            while True:
                try:
                    await store.put("/r/after", b"2")
                    break
                except StoreUnavailableError:
                    await asyncio.sleep(0.05)
        record = await store.get("/r/before")
        assert record is not None
        assert record.value == b"1"
    finally:
        await store.close()


async def test_connect_to_nothing_fails_typed() -> None:
    with pytest.raises(StoreUnavailableError):
        await connect("127.0.0.1:1", request_timeout_s=0.5)


async def test_bad_session_timeout() -> None:
    with pytest.raises(ValueError, match="session_timeout_ms"):
        await connect("127.0.0.1:1", session_timeout_ms=1000, request_timeout_s=0.5)


async def test_three_shard_fan_out(oxia3: StandinOxia) -> None:
    store = await connect(oxia3.address)
    try:
        keys = {f"/i/{pk}": pk for pk in (f"p{i}" for i in range(12))}
        shards_used = {store._route(k, pk).shard for k, pk in keys.items()}
        assert len(shards_used) == 3
        for key, pk in keys.items():
            await store.put(key, b"", partition_key=pk, secondary_indexes={"n": key[-2:]})
        found = [r.key async for r in store.scan_index("n", "", "~")]
        assert sorted(found) == sorted(keys)
        children = [r.key async for r in store.scan_prefix("/i/")]
        assert sorted(children) == sorted(keys)
        # Every shard holds some of them: the data really is spread.
        assert sum(1 for s in oxia3.shards if s.kv) == 3
    finally:
        await store.close()


async def test_routing_matches_the_servers_shard(oxia3: StandinOxia) -> None:
    store = await connect(oxia3.address)
    try:
        await store.put("foo", b"")
        (holder,) = [s for s in oxia3.shards if "foo" in s.kv]
        assert holder.min_hash <= key_hash("foo") <= holder.max_hash
    finally:
        await store.close()


async def test_notifications_resume_after_reconnect(oxia: StandinOxia) -> None:
    store = await connect(oxia.address, request_timeout_s=1.0)
    try:
        stream = store.notifications("/n/")  # not the record of the store's index check, which its first put starts
        await store.put("/n/1", b"")
        first = await asyncio.wait_for(anext(stream), WAIT)
        assert first.key == "/n/1"
        await oxia.stop()
        await oxia.start()
        async with asyncio.timeout(WAIT):
            while True:
                try:
                    await store.put("/n/2", b"")
                    break
                except StoreUnavailableError:
                    await asyncio.sleep(0.05)
        await store.put("/n/3", b"")
        got = [await asyncio.wait_for(anext(stream), WAIT) for _ in range(2)]
        assert [(n.type, n.key) for n in got] == [
            (NotificationType.CREATED, "/n/2"), (NotificationType.CREATED, "/n/3")]
        resumed = [r for r in oxia.notification_requests if r.HasField("start_offset_exclusive")]
        assert resumed, "the stream was re-opened from the last offset"
    finally:
        await store.close()


async def test_ephemeral_records_removed_on_close(oxia3: StandinOxia) -> None:
    owner = await connect(oxia3.address)
    other = await connect(oxia3.address)
    try:
        for i in range(6):
            await owner.put(f"/e/{i}", b"", ephemeral=True)
        assert len(oxia3.sessions) >= 2  # one session per shard that holds ephemeral records
        assert await other.get("/e/0") is not None
        stream = other.notifications()
        await owner.close()
        assert oxia3.sessions == {}
        for i in range(6):
            assert await other.get(f"/e/{i}") is None
        deleted = {(await asyncio.wait_for(anext(stream), WAIT)).key for _ in range(6)}
        assert deleted == {f"/e/{i}" for i in range(6)}
    finally:
        await owner.close()
        await other.close()


async def renewed_lease(store: OxiaStore, key: str, what: str) -> Callable[[], float]:
    """The lease of ``key``, written now as an ephemeral record, once a keep-alive has renewed it."""
    await store.put(key, b"me", ephemeral=True)
    lease = store.ephemeral_lease(key)
    assert lease is not None
    first = lease()
    assert first > lease_clock()
    await async_wait_for(lambda: lease() > first, what)
    return lease


async def test_the_lease_of_an_ephemeral_record_follows_its_session(oxia: StandinOxia) -> None:
    # A heartbeat every 0.2 s at the shortest session timeout (2 s); the lease is 90 % of it past each one.
    owner = await connect(oxia.address, session_timeout_ms=2_000)
    try:
        lease = await renewed_lease(owner, "/l/leader", "a keep-alive renews the lease")
        (session_id,) = oxia.sessions
        oxia.close_session(session_id)  # as the server does when the session times out
        await async_wait_for(lambda: lease() == 0.0, "the lease ends once the session is found gone")
        # Written again, the record is held by a new session: a lease taken now follows that one; the
        # old lease stays over.
        await owner.put("/l/leader", b"me", ephemeral=True)
        assert lease() == 0.0
        assert (renewed := owner.ephemeral_lease("/l/leader")) is not None and renewed() > lease_clock()
    finally:
        await owner.close()
    assert lease() == 0.0


async def test_a_lease_follows_the_session_that_holds_the_record_not_the_one_held_now(oxia: StandinOxia) -> None:
    # The client took its session for gone (keep-alives unanswered: forget) while the server still has it, and
    # made a new one: the record written under the first goes when the server expires that one, whatever the
    # keep-alives of the second say. Its lease was taken from the session held now, the second, and lasted.
    owner = await connect(oxia.address, session_timeout_ms=2_000)
    try:
        first = await owner.put("/l/leader", b"me", ephemeral=True)
        again = await owner.get("/l/leader")
        assert first.session_id is not None and again is not None and again.session_id == first.session_id
        (shard,) = {info.shard for info in owner._assignments.current.shards}
        owner._sessions.forget(shard, first.session_id)
        second = await owner.put("/l/other", b"me", ephemeral=True)
        assert second.session_id not in (None, first.session_id)
        assert first.session_id in oxia.sessions  # the server still holds the record under the first
        read = await owner.get("/l/leader")
        assert read is not None and read.session_id == first.session_id
        held = owner.ephemeral_lease("/l/leader", read.session_id)
        assert held is not None and held() == 0.0
        now = owner.ephemeral_lease("/l/other", second.session_id)
        assert now is not None and now() > lease_clock()
        durable = await owner.put("/l/durable", b"x")
        assert durable.session_id is None
    finally:
        await owner.close()


async def test_a_coordinator_adopting_its_record_of_a_replaced_session_writes_it_under_its_live_one(
        oxia: StandinOxia) -> None:
    # Its own leader record, whose create's answer was lost, adopted at the next check while the session that
    # holds it was one the client had given up for lost: served under the lease of the session held now, the
    # record went when the server expired the other one, and another instance could lead alongside.
    owner = await connect(oxia.address, session_timeout_ms=2_000)
    tc = TransactionCoordinator(owner, CoordinatorConfig(partitions=1, advertised_url="pulsar://a:1"), Metrics("t"))
    try:
        planted = await owner.put(layout.leader_path(0), leader_value("pulsar://a:1", tc._election.instance_id),
                                  expected_version=EXPECT_ABSENT, ephemeral=True)
        (shard,) = {info.shard for info in owner._assignments.current.shards}
        assert planted.session_id is not None
        owner._sessions.forget(shard, planted.session_id)
        await tc.start()
        assert tc._election.led == {0}
        adopted = await owner.get(layout.leader_path(0))
        assert adopted is not None and adopted.session_id == owner._sessions.current(shard) != planted.session_id
        assert not tc.partition(0).lease_lapsed()
        # The forgotten session's end takes nothing this instance leads by.
        oxia.close_session(planted.session_id)
        assert await owner.get(layout.leader_path(0)) is not None
        assert tc._election.led == {0} and not tc.partition(0).lease_lapsed()
        assert not tc._member_lapsed()
    finally:
        await tc.stop()
        await owner.close()


async def test_close_does_not_wait_the_request_timeout_for_an_oxia_that_does_not_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # CloseSession never answered (patched before the server binds its handlers), the request timeout far
    # above any test's bound: close() must not wait that long, for the session's close nor for the drain of
    # the notification of its record's deletion (a stop has a pod's grace to fit; the session expires anyway).
    async def never(self, request, context):
        await asyncio.Event().wait()

    monkeypatch.setattr(standin._Servicer, "CloseSession", never)
    server = StandinOxia(shards=1)
    await server.start()
    try:
        owner = await connect(server.address, request_timeout_s=600.0)
        await owner.put("/c/leader", b"me", ephemeral=True)
        stream = owner.notifications("/c/")
        await asyncio.wait_for(owner.close(), 60.0)
        assert [n async for n in stream] == []  # ended by close(), without the deletion it could not see
    finally:
        await server.stop()


@pytest.mark.parametrize("late_close_s", [0.0, 5.0], ids=["its-close-answered", "its-close-cut-by-the-store's"])
async def test_a_session_created_while_the_store_closes_does_not_outlive_it(
        monkeypatch: pytest.MonkeyPatch, late_close_s: float) -> None:
    # An ephemeral put waited for its shard's new session while close() closed the sessions it knew; the
    # session then arrived, was kept, and its keep-alive task ran on after close() (and died on the closed
    # pool at its first beat), the server holding the session until it expired. The late session is now
    # closed too; when close() closes the channels under that close (slower than the others), the put
    # still ends StoreClosedError, not CancelledError (a CI run met that order).
    asked, answer = asyncio.Event(), asyncio.Event()
    create, close_session = standin._Servicer.CreateSession, standin._Servicer.CloseSession

    async def slow_create(self, request, context):
        if request.shard == 1:
            asked.set()
            await answer.wait()
        return await create(self, request, context)

    async def slow_close(self, request, context):
        if request.shard == 1:  # the late session's
            await asyncio.sleep(late_close_s)
        else:
            answer.set()  # shard 1's session is created while close() waits for this
            await asyncio.sleep(0.3)
        return await close_session(self, request, context)

    monkeypatch.setattr(standin._Servicer, "CreateSession", slow_create)
    monkeypatch.setattr(standin._Servicer, "CloseSession", slow_close)
    server = StandinOxia(shards=3)
    await server.start()
    try:
        store = await connect(server.address, session_timeout_ms=2000, request_timeout_s=5.0)
        key_on = {store._route(f"/c/{i}", None).shard: f"/c/{i}" for i in range(100)}
        await store.put(key_on[0], b"me", ephemeral=True)
        late = asyncio.ensure_future(store.put(key_on[1], b"me", ephemeral=True))
        await asyncio.wait_for(asked.wait(), WAIT)
        await store.close()
        with pytest.raises(StoreClosedError):
            await late
        assert [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("oxia-session")] == []
        await async_wait_for(lambda: not server.sessions, "the late session closed on the server")
    finally:
        await server.stop()


@pytest.mark.parametrize("call", ["get", "scan", "ephemeral put"])
async def test_a_call_under_way_when_the_store_closes_ends_closed_not_cancelled(
        monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    # close() closes the channels, and grpc.aio ends their calls with CancelledError: a caller that nobody
    # cancelled saw its task end cancelled, where the store promises StoreClosedError.
    started = asyncio.Event()

    async def never_stream(self, request, context):
        started.set()
        await asyncio.Event().wait()
        yield  # pragma: no cover

    async def never(self, request, context):
        started.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(standin._Servicer, "Read", never_stream)
    monkeypatch.setattr(standin._Servicer, "RangeScan", never_stream)
    monkeypatch.setattr(standin._Servicer, "CreateSession", never)
    server = StandinOxia(shards=1)
    await server.start()
    try:
        store = await connect(server.address, request_timeout_s=60.0)

        async def calling() -> object:
            if call == "get":
                return await store.get("/k")
            if call == "scan":
                return [r async for r in store.scan_prefix("/")]
            return await store.put("/k", b"", ephemeral=True)

        task = asyncio.ensure_future(calling())
        await asyncio.wait_for(started.wait(), WAIT)
        await store.close()
        with pytest.raises(StoreClosedError):
            await task
    finally:
        await server.stop()


async def test_bad_version_maps(store: OxiaStore) -> None:
    with pytest.raises(BadVersionError):
        await store.put("/v/k", b"", expected_version=5)
    await store.put("/v/k", b"")
    with pytest.raises(BadVersionError):
        await store.put("/v/k", b"", expected_version=EXPECT_ABSENT)
    assert await store.delete("/v/none") is False


@pytest.mark.parametrize("prefix", ["/a/", "/a/b-", "/"])
def test_children_range_holds_children_under_every_order(prefix: str) -> None:
    start, end = children_range(prefix)
    keys = [prefix + s for s in ("", "x", "b-1", "zz", "~~", "x/y", "x/y/z")]
    keys += ["/a", "/a0", "/b/x", "/a/c/d", "/a/b-/x"]
    for key in keys:
        in_hierarchical = compare_with_slash(start, key) <= 0 < compare_with_slash(end, key)
        if is_child(key, prefix):
            # natural (byte) order and segment-wise hierarchical order (Oxia's CompareWithSlash)
            assert start <= key < end
            assert in_hierarchical
        else:
            # Hierarchical order leaves out deeper keys and other parents' children.
            assert not in_hierarchical, key


async def two_leaders_of_one_shard() -> tuple[StandinOxia, StandinOxia]:
    """Two started stand-ins for shard 0's leader before and after a move: the new one takes over the shard with its
    state, its sessions and its log (Oxia replicates them)."""
    old_leader, new_leader = StandinOxia(shards=1), StandinOxia(shards=1)
    new_leader.shards, new_leader.sessions = old_leader.shards, old_leader.sessions
    new_leader._session_ids = old_leader._session_ids
    await old_leader.start()
    await new_leader.start()
    return old_leader, new_leader


async def test_a_write_routed_before_a_leader_move_goes_to_the_new_leader(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # CreateSession is answered only after the move (patched before the servers bind their handlers).
    moved = asyncio.Event()
    asked: list[int] = []
    create_session = standin._Servicer.CreateSession

    async def create_after_the_move(self, request, context):
        asked.append(request.shard)
        await moved.wait()
        return await create_session(self, request, context)

    monkeypatch.setattr(standin._Servicer, "CreateSession", create_after_the_move)
    old_leader, new_leader = await two_leaders_of_one_shard()
    store = await connect(old_leader.address)
    try:
        put = asyncio.ensure_future(store.put("/c/leader", b"me", ephemeral=True))
        await async_wait_for(lambda: bool(asked), "the put waits for its session")
        store._assignments._install(ShardMap([ShardInfo(0, new_leader.address, 0, HASH_SPACE_MAX)]))
        moved.set()
        assert (await asyncio.wait_for(put, WAIT)).key == "/c/leader"
        assert store.writers[0].leader == new_leader.address
        await store.put("/c/after", b"")
        assert (old_leader.write_requests, new_leader.write_requests) == (0, 2)
    finally:
        await store.close()
        await new_leader.stop()
        await old_leader.stop()


class OxiaCode:
    """A custom status code as Oxia's Go server sends it (codes above 16; constant/grpc_errors.go)."""

    def __init__(self, code: int, name: str) -> None:
        self.value = (code, name)
        self.name = name


async def serve_keepalives(monkeypatch: pytest.MonkeyPatch, answer) -> tuple[StandinOxia, list[int]]:
    """A stand-in whose KeepAlive is ``answer(context, n)`` on the n-th heartbeat (from 0), the real
    one when that returns; and the list of heartbeats received."""
    beats: list[int] = []
    keep_alive = standin._Servicer.KeepAlive

    async def patched(self, request, context):
        beats.append(request.session_id)
        await answer(context, len(beats) - 1)
        return await keep_alive(self, request, context)

    # Before the server starts: it binds its handlers then.
    monkeypatch.setattr(standin._Servicer, "KeepAlive", patched)
    server = StandinOxia(shards=1)
    await server.start()
    return server, beats


@pytest.mark.parametrize("error", [
    (OxiaCode(106, "NODE_IS_NOT_LEADER"), "node is not leader for shard 0"),
    (OxiaCode(104, "ALREADY_CLOSED"), "oxia: resource is already closed"),
    (OxiaCode(102, "INVALID_STATUS"), "oxia: invalid status"),
    (grpc.StatusCode.UNAVAILABLE, "stand-in"),
    (grpc.StatusCode.FAILED_PRECONDITION, "stand-in"),
], ids=lambda error: error[0].name)
async def test_a_failed_heartbeat_keeps_the_session(monkeypatch: pytest.MonkeyPatch, error) -> None:
    async def fail_the_first(context, n):
        if n == 0:
            await context.abort(*error)

    server, beats = await serve_keepalives(monkeypatch, fail_the_first)
    store = await connect(server.address, session_timeout_ms=2000)  # a heartbeat every 0.2 s
    try:
        await store.put("/c/leader", b"me", ephemeral=True)
        await async_wait_for(lambda: len(beats) >= 3, "heartbeats go on after the failed one")
        assert len(server.sessions) == 1
        assert await store.get("/c/leader") is not None
    finally:
        await store.close()
        await server.stop()


@pytest.mark.parametrize("error", [
    (grpc.StatusCode.NOT_FOUND, "session not found"),
    (OxiaCode(108, "SESSION_NOT_FOUND"), "oxia: session not found"),
], ids=["v0.17", "v0.16"])
async def test_a_session_the_server_does_not_know_is_forgotten(monkeypatch: pytest.MonkeyPatch, error) -> None:
    async def not_found(context, n):
        await context.abort(*error)

    server, beats = await serve_keepalives(monkeypatch, not_found)
    store = await connect(server.address, session_timeout_ms=2000)
    try:
        await store.put("/c/leader", b"me", ephemeral=True)
        await async_wait_for(lambda: beats and not store._sessions._sessions, "the session is forgotten")
        # The next ephemeral put starts a new session.
        await store.put("/c/again", b"", ephemeral=True)
        assert store._sessions._sessions[0].session_id != beats[0]
    finally:
        await store.close()
        await server.stop()


async def test_a_notification_of_an_unknown_type_is_skipped(store: OxiaStore, oxia: StandinOxia) -> None:
    stream = store.notifications("/n/")
    shard = oxia.shard(0)
    # A type a newer server may send (this client knows 0 to 3).
    shard._commit(shard.commit_offset + 1, {"/n/new-type": pb.Notification(type=7)})  # type: ignore[arg-type]  # a type no version defines
    await store.put("/n/after", b"")
    note = await asyncio.wait_for(anext(stream), WAIT)
    assert (note.type, note.key) == (NotificationType.CREATED, "/n/after")


async def test_an_unexpected_write_status_leaves_the_outcome_unknown(
        store: OxiaStore, monkeypatch: pytest.MonkeyPatch) -> None:
    await store.put("/u/d", b"")
    apply = standin.Shard.apply

    def odd_statuses(self, request, sessions):
        response = apply(self, request, sessions)
        for put in response.puts:
            put.status = 7  # type: ignore[assignment]  # a code this client does not know
        for delete in response.deletes:
            delete.status = pb.SESSION_DOES_NOT_EXIST  # not a delete's answer
        return response

    monkeypatch.setattr(standin.Shard, "apply", odd_statuses)
    with pytest.raises(StoreUnavailableError, match="status 7"):
        await store.put("/u/p", b"")
    with pytest.raises(StoreUnavailableError, match="SESSION_DOES_NOT_EXIST"):
        await store.delete("/u/d")
    with pytest.raises(StoreUnavailableError, match="outcome is unknown"):
        await store.write_batch([Put("/u/q", b""), Delete("/u/d")])


async def test_a_get_answered_with_an_unknown_status_fails_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    async def odd_read(self, request, context):
        yield pb.ReadResponse(gets=[pb.GetResponse(status=7)])  # type: ignore[arg-type]  # unknown code

    monkeypatch.setattr(standin._Servicer, "Read", odd_read)
    async with standin.serve() as server:
        store = await connect(server.address)
        try:
            with pytest.raises(StoreUnavailableError, match="status 7"):
                await store.get("/u/k")
        finally:
            await store.close()


@pytest.mark.parametrize("gone", ["deleted by another client", "with its expired session"])
async def test_close_does_not_wait_for_an_ephemeral_record_already_gone(
        oxia: StandinOxia, monkeypatch: pytest.MonkeyPatch, gone: str) -> None:
    owner = await connect(oxia.address, request_timeout_s=5.0)
    other = await connect(oxia.address)
    try:
        await owner.put("/c/leader", b"", ephemeral=True)
        stream = owner.notifications("/c/")
        if gone == "deleted by another client":
            await other.delete("/c/leader")
        else:
            (session_id,) = oxia.sessions
            oxia.close_session(session_id)
        deleted = await asyncio.wait_for(anext(stream), WAIT)
        assert (deleted.type, deleted.key) == (NotificationType.DELETED, "/c/leader")
        drained: list[bool] = []
        drain = owner._pump.drain

        async def recorded_drain(timeout_s: float) -> bool:
            drained.append(await drain(timeout_s))
            return drained[-1]

        monkeypatch.setattr(owner._pump, "drain", recorded_drain)
        await owner.close()
        # False: close() waited its whole request timeout for a deletion that had come already.
        assert drained == [True]
    finally:
        await owner.close()
        await other.close()


async def test_a_scanned_record_with_an_error_status_fails_the_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    async def odd_scan(self, request, context):
        response = pb.RangeScanResponse()
        response.records.add(status=pb.OK, key="/s/a", value=b"")
        # Deleted between its index entry and its read: skipped.
        response.records.add(status=pb.KEY_NOT_FOUND, key="/s/gone")
        response.records.add(status=7, key="/s/b")
        yield response

    monkeypatch.setattr(standin._Servicer, "RangeScan", odd_scan)
    async with standin.serve() as server:
        store = await connect(server.address)
        try:
            scanned: list[str] = []
            with pytest.raises(StoreUnavailableError, match="'/s/b': status 7"):
                async for record in store.scan_prefix("/s/"):
                    scanned.append(record.key)
            assert scanned == ["/s/a"]
        finally:
            await store.close()


async def test_a_sequential_put_answered_without_its_key_fails(
        store: OxiaStore, monkeypatch: pytest.MonkeyPatch) -> None:
    apply = standin.Shard.apply

    def without_keys(self, request, sessions):
        response = apply(self, request, sessions)
        for put in response.puts:
            put.ClearField("key")
        return response

    monkeypatch.setattr(standin.Shard, "apply", without_keys)
    # Not the prefix as if it were the record's key.
    with pytest.raises(StoreUnavailableError, match="without its key"):
        await store.put_sequential("/q/s", b"", partition_key="q")


@pytest.mark.parametrize("bad", [Put("/h/bad", "not bytes"),  # type: ignore[arg-type]  # deliberately
                                 Delete("/h/\ud800")],
                         ids=["a value that is not bytes", "a key with a lone surrogate"])
async def test_a_batch_with_an_operation_that_cannot_be_encoded_sends_nothing(
        store: OxiaStore, oxia: StandinOxia, bad: Put | Delete) -> None:
    before = oxia.write_requests
    with pytest.raises(InvalidOperationError):
        await store.write_batch([Put("/h/ok", b""), bad])
    # Behind anything the failed call left queued on the shard's writer.
    await store.put("/h/after", b"")
    assert await store.get("/h/ok") is None
    assert oxia.write_requests == before + 1


async def test_heartbeats_answered_slower_than_their_period_still_renew_the_lease(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Each heartbeat was given up after its own period (0.2 s at a 2 s session timeout): an Oxia that
    # answered in 0.3 s renewed nothing, and the lease ran out while the session was alive (every write
    # then answered TransactionCoordinatorNotFound, and no other instance could take over).
    async def slowly(context, n):
        await asyncio.sleep(0.3)

    server, beats = await serve_keepalives(monkeypatch, slowly)
    store = await connect(server.address, session_timeout_ms=2000)
    try:
        await renewed_lease(store, "/c/leader", "a slow heartbeat's answer renews the lease")
    finally:
        await store.close()
        await server.stop()


async def test_a_subscription_after_a_batch_of_puts_gets_the_changes_that_follow(oxia: StandinOxia) -> None:
    # Oxia numbers batches (commit offsets) and puts (version ids) apart; the client took a put's version id
    # for its batch's offset. Ten puts in one batch (offset 0, version ids 0-9) made a later subscription
    # skip every batch up to offset 9: the next changes were never delivered.
    store = await connect(oxia.address, request_timeout_s=2.0)
    other = await connect(oxia.address, request_timeout_s=2.0)
    try:
        await store.write_batch([Put(f"/w/{i}", b"") for i in range(10)])
        stream = store.notifications("/n/")
        await other.put("/n/after", b"")  # offset 1, version id 10
        note = await asyncio.wait_for(anext(stream), WAIT)
        assert (note.type, note.key) == (NotificationType.CREATED, "/n/after")
    finally:
        await store.close()
        await other.close()


async def test_close_waits_for_the_deletion_of_its_ephemeral_records_when_offsets_ran_ahead_of_versions(
        oxia: StandinOxia, monkeypatch: pytest.MonkeyPatch) -> None:
    # A delete takes a commit offset and no version id: offsets run ahead of version ids. The put's own
    # notification (offset 2 > version 1) was then taken for a later change of the record: close() ended
    # the stream without the deletion of the record, which the Protocol promises before the end.
    wake = standin.Shard._wake

    async def later(self: standin.Shard) -> None:  # notifications 0.3 s after their commit (a loaded server)
        await asyncio.sleep(0.3)
        await wake(self)

    monkeypatch.setattr(standin.Shard, "_wake", later)
    store = await connect(oxia.address, request_timeout_s=2.0)
    try:
        await store.put("/d/x", b"")
        await store.write_batch([Delete("/d/x")])
        stream = store.notifications("/e/")
        await store.put("/e/leader", b"me", ephemeral=True)  # offset 2, version id 1
        created = await asyncio.wait_for(anext(stream), WAIT)
        assert (created.type, created.key) == (NotificationType.CREATED, "/e/leader")
        await store.close()
        assert [(n.type, n.key) async for n in stream] == [(NotificationType.DELETED, "/e/leader")]
    finally:
        await store.close()


async def test_notifications_follow_a_shard_to_its_new_leader() -> None:
    # The pump kept streaming from the deposed leader: one that stays up (cut off from its peers, not from us)
    # keeps the stream open and silent, and no change of the shard reached a subscriber again (a review).
    old_leader, new_leader = await two_leaders_of_one_shard()
    store = await connect(old_leader.address)
    try:
        stream = store.notifications("/n/")
        store._assignments._install(ShardMap([ShardInfo(0, new_leader.address, 0, HASH_SPACE_MAX)]))
        await store.put("/n/1", b"x")
        note = await asyncio.wait_for(anext(stream), WAIT)
        assert (note.key, note.type) == ("/n/1", NotificationType.CREATED)
        assert new_leader.notification_requests, "the stream moved to the new leader"
    finally:
        await store.close()
        await new_leader.stop()
        await old_leader.stop()


async def test_a_new_shard_ends_the_subscriptions_made_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # A shard that appears after start (a split) was streamed from its commit offset when its stream opened:
    # a change made on it in between never reached the subscribers, and nothing told them (a review). They
    # are ended with an error (their consumers read again and subscribe again), and a new one sees the shard.
    async def one_shard(self: standin._Servicer, request: object, context: object) -> object:
        message = pb.ShardAssignments()
        namespace = message.namespaces[self.oxia.namespace]
        namespace.shard_key_router = pb.XXHASH3
        assignment = namespace.assignments.add(shard=0, leader=self.oxia.address)
        assignment.int32_hash_range.min_hash_inclusive = 0
        assignment.int32_hash_range.max_hash_inclusive = HASH_SPACE_MAX
        yield message
        await asyncio.Event().wait()

    monkeypatch.setattr(standin._Servicer, "GetShardAssignments", one_shard)
    oxia = StandinOxia(shards=2)
    await oxia.start()
    first, second = oxia.shard(0), oxia.shard(1)
    store = await connect(oxia.address)
    try:
        stream = store.notifications("/n/")
        store._assignments._install(ShardMap([ShardInfo(0, oxia.address, first.min_hash, first.max_hash),
                                              ShardInfo(1, oxia.address, second.min_hash, second.max_hash)]))
        with pytest.raises(StoreUnavailableError, match="shards changed"):
            await asyncio.wait_for(anext(stream), WAIT)
        on_second = [key for key in (f"/n/{i}" for i in range(200)) if key_hash(key) >= second.min_hash][:2]
        await store.put(on_second[0], b"x")  # before the next subscription: not notified to it
        await async_wait_for(lambda: 1 in store._pump._offsets, "the new shard's stream received its first batch")
        again = store.notifications("/n/")
        await store.put(on_second[1], b"y")
        assert (await asyncio.wait_for(anext(again), WAIT)).key == on_second[1]
    finally:
        await store.close()
        await oxia.stop()
