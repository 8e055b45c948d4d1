"""Bad input never crashes the server or touches another connection (docs/semantics.md §7).

Each case opens a victim connection and a bystander; after the bad input the bystander still
completes a transaction."""

from __future__ import annotations

import asyncio
import struct

import pytest

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.client import TcClient, connect
from tc_server.wire import NewTxn as NewTxnCmd
from tc_server.wire import ServerError, Unknown, encode_command, encode_frame


async def bystander_still_works(app, bystander: TcClient) -> None:
    t = await bystander.new_txn(tc_id=1)
    assert t.error is None
    assert (await bystander.end_txn(1, t.least, commit=True)).error is None
    fresh = await connect("127.0.0.1", app.listener.port)
    assert (await fresh.new_txn(tc_id=2)).error is None
    fresh.close()


async def closed_within(c: TcClient, seconds: float = 5) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(c.closed), seconds)
    except TimeoutError:
        return False
    return True


@pytest.fixture
async def bystander(app):
    c = await connect("127.0.0.1", app.listener.port)
    yield c
    c.close()


async def test_truncated_frame_then_disconnect(app, bystander):
    victim = await connect("127.0.0.1", app.listener.port)
    frame = encode_command(NewTxnCmd(1, 0, 0))
    victim.send_raw(frame[: len(frame) - 3])  # the peer dies mid-frame
    victim.close()
    await bystander_still_works(app, bystander)


async def test_command_size_larger_than_frame(app, bystander):
    victim = await connect("127.0.0.1", app.listener.port)
    victim.send_raw(struct.pack(">II", 10, 50) + b"\x00" * 6)
    assert await closed_within(victim)
    await bystander_still_works(app, bystander)


async def test_frame_over_the_limit_closes_at_the_header(app, bystander):
    victim = await connect("127.0.0.1", app.listener.port)
    victim.send_raw(struct.pack(">I", 5_242_880 + 10_240 + 1))  # no body needed to refuse it
    assert await closed_within(victim)
    await bystander_still_works(app, bystander)


async def test_garbage_protobuf(app, bystander):
    victim = await connect("127.0.0.1", app.listener.port)
    victim.send_raw(encode_frame(b"\xff\xff\xff\xff\xff\xff"))
    assert await closed_within(victim)
    await bystander_still_works(app, bystander)


async def test_malformed_request_gets_error_with_its_request_id(app, bystander):
    victim = await connect("127.0.0.1", app.listener.port)
    # END_TXN (type 56) with request_id 77 and txn_action 9, which is no TxnAction.
    body = bytes([0x08, 56, 0xC2, 0x03, 6, 0x08, 77, 0x20, 9, 0x18, 1])
    victim.send_raw(encode_frame(body))
    assert await closed_within(victim)
    assert [(e.request_id, e.error) for e in victim.errors] == [(77, ServerError.UnknownError)]
    assert "malformed" in victim.errors[0].message
    await bystander_still_works(app, bystander)


async def test_request_before_connect(app, bystander):
    victim = await connect("127.0.0.1", app.listener.port, handshake=False)
    victim.send(NewTxnCmd(5, 0, 0))
    assert await closed_within(victim)
    assert [(e.request_id, e.error) for e in victim.errors] == [(5, ServerError.NotAllowedError)]
    await bystander_still_works(app, bystander)


async def test_unknown_command_keeps_the_connection(app, bystander):
    victim = await connect("127.0.0.1", app.listener.port)
    victim.send(Unknown(type_code=4, request_id=None))  # SUBSCRIBE without its message: no request id
    rid = 31
    # GET_SCHEMA (34) is for brokers, not a TC (and there is no upstream here): BaseCommand{type=34,
    # getSchema(field 34)={request_id=31}}.
    victim.send_raw(encode_frame(bytes([0x08, 34, 0x92, 0x02, 2, 0x08, rid])))
    t = await victim.new_txn(tc_id=0)
    assert t.error is None  # still served on the same connection
    codes = sorted((e.request_id, e.error) for e in victim.errors)
    assert codes == [(-1, ServerError.NotAllowedError), (rid, ServerError.NotAllowedError)]
    assert all("not served by a transaction coordinator" in e.message for e in victim.errors)
    victim.close()
    await bystander_still_works(app, bystander)


async def test_a_bug_while_serving_a_txn_request_is_answered_on_a_connection_that_stays(app, bystander, monkeypatch):
    """The request's task raising (never the dispatcher's contract) still answers that request once,
    typed and with its request id, and the connection keeps serving."""
    victim = await connect("127.0.0.1", app.listener.port)
    dispatcher = app.context.dispatcher
    serve = dispatcher.transaction

    async def broken_once(cmd, principal, superuser, conn_log):
        monkeypatch.setattr(dispatcher, "transaction", serve)
        raise RuntimeError("a bug")

    monkeypatch.setattr(dispatcher, "transaction", broken_once)
    answer = await victim.new_txn(tc_id=3)
    assert (answer.most, answer.error) == (3, ServerError.UnknownError)
    assert "RuntimeError" in (answer.message or "")
    assert (await victim.new_txn(tc_id=3)).error is None
    victim.close()
    await bystander_still_works(app, bystander)


async def test_a_txn_request_whose_serving_is_cancelled_from_elsewhere_is_answered_once(app, bystander, monkeypatch):
    """Only its deadline cancels a request's task, and the dispatcher answers that; a cancellation
    from anywhere else (e.g. an awaited task cancelled under it) must still answer the request once,
    typed and with its request id, instead of leaving the client waiting for its operation timeout."""
    victim = await connect("127.0.0.1", app.listener.port)
    dispatcher = app.context.dispatcher
    serve = dispatcher.transaction

    async def cancelled_once(cmd, principal, superuser, conn_log):
        monkeypatch.setattr(dispatcher, "transaction", serve)
        raise asyncio.CancelledError

    monkeypatch.setattr(dispatcher, "transaction", cancelled_once)
    # Bounded so that a missing answer fails the test instead of hanging it (not a timing assertion).
    answer = await victim.request(NewTxnCmd(victim.next_request_id(), 0, 3), timeout_s=30)
    assert (answer.most, answer.error) == (3, ServerError.UnknownError)
    assert "CancelledError" in (answer.message or "")
    assert (await victim.new_txn(tc_id=3)).error is None
    victim.close()
    await bystander_still_works(app, bystander)


async def test_a_frame_over_64_kib_before_connect_closes_the_connection_naming_the_limit(app, bystander):
    # Found by a review: a frame was parsed whole before anything asked for CONNECT, so anyone who could reach
    # the port made the event loop parse 5 MB of junk per frame, without a credential. Before the handshake
    # the limit is 64 KiB; after it, --max-frame-size (the test below).
    victim = await connect("127.0.0.1", app.listener.port, handshake=False)
    victim.send_raw(struct.pack(">II", 64 * 1024 - 4 + 1, 5) + b"\x00" * 1024)
    assert await closed_within(victim)
    assert [e.error for e in victim.errors] == [ServerError.UnknownError]
    assert "exceeds the limit of 65536 (before CONNECT is served)" in victim.errors[0].message, victim.errors[0].message
    await bystander_still_works(app, bystander)


async def test_after_connect_frames_up_to_the_max_frame_size_are_read(app, bystander):
    # The same client, handshaken (CONNECT and the large frame in one write: the CONNECT is served first), may
    # send frames up to --max-frame-size (256 KiB in these tests): this PING, padded to 128 KiB with a field
    # no version of the protocol has, is read and answered.
    victim = await connect("127.0.0.1", app.listener.port)
    ping = pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing()).SerializeToString()
    victim.send_raw(encode_frame(ping + bytes([0xFA, 0x3E, 0x80, 0x80, 0x08]) + b"\x00" * 128 * 1024))
    assert (await victim.new_txn(tc_id=1)).error is None  # the connection goes on
    assert not victim.errors
    victim.close()
    await bystander_still_works(app, bystander)


def _add_partitions(count: int) -> bytes:
    return pb.BaseCommand(type=pb.BaseCommand.ADD_PARTITION_TO_TXN, addPartitionToTxn=pb.CommandAddPartitionToTxn(
        request_id=5, partitions=["a"] * count)).SerializeToString()


def _lookup_properties(count: int) -> bytes:
    return pb.BaseCommand(type=pb.BaseCommand.LOOKUP, lookupTopic=pb.CommandLookupTopic(
        topic="t", request_id=5, properties=[pb.KeyValue(key="", value="")] * count)).SerializeToString()


@pytest.mark.parametrize(("body", "named"), [
    (_add_partitions(5000), "ADD_PARTITION_TO_TXN (52) lists 5000 partitions; at most 4096"),
    (_lookup_properties(5000), "LOOKUP (23) lists 5000 properties; at most 4096"),
], ids=["add-partition", "lookup-properties"])
async def test_a_request_listing_more_than_4096_entries_is_refused_naming_the_count(app, bystander, body, named):
    # Found by a review: each entry became Python objects before the coordinator could refuse the request
    # (1.25 million partitions: ~3.6 s of the event loop and 170 MB).
    victim = await connect("127.0.0.1", app.listener.port)
    victim.send_raw(encode_frame(body))
    assert await closed_within(victim)
    assert [(e.request_id, e.error) for e in victim.errors] == [(5, ServerError.UnknownError)]
    assert named in victim.errors[0].message, victim.errors[0].message
    await bystander_still_works(app, bystander)
