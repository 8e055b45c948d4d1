"""Wire edges the fuzzers do not reach by construction, against a real
``tc-server run`` process: frames split at every byte, BaseCommands whose sub-messages contradict or repeat,
unknown fields, payload commands (magic 0x0e01) on the coordinator port, one request id used three times at
once, txn ids at the extremes of both halves. Each is answered with a specific code (or served), the
connection stays up, and a well-behaved client on another connection is served meanwhile."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator

import pytest

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.client import connect, connect_command
from tc_server.wire import (
    AddPartitionToTxn,
    AddPartitionToTxnResponse,
    Command,
    Connected,
    EndTxn,
    EndTxnResponse,
    Error,
    NewTxn,
    NewTxnResponse,
    Ping,
    Pong,
    ServerError,
    TxnAction,
    encode_command,
    encode_frame,
)
from tests.support.raw_frames import read_commands
from tests.support.server_process import ServerProcess, started


async def raw_connected(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw socket past CONNECT/CONNECTED."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode_command(connect_command()))
    got, _ = await read_commands(reader, 10, until=lambda c: any(isinstance(x, Connected) for x in c))
    assert got and isinstance(got[0], Connected), got
    return reader, writer


async def send_and_read(port: int, data: bytes, seconds: float = 3.0) -> tuple[list[Command], bool]:
    """Send ``data`` on a fresh connected socket; what came back within ``seconds`` and whether it closed."""
    reader, writer = await raw_connected(port)
    try:
        writer.write(data)
        return await read_commands(reader, seconds)
    finally:
        writer.close()




@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = started(ServerProcess(tmp_path_factory.mktemp("edges") / "data", store="memory"))
    yield process
    process.kill()


async def assert_still_served(server: ServerProcess) -> None:
    client = await connect("127.0.0.1", server.port)
    answer = await asyncio.wait_for(client.new_txn(tc_id=4), 20)
    assert answer.error is None
    client.close()
    assert server.running()


async def test_frames_split_at_every_byte_are_served(server: ServerProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    data = encode_command(connect_command()) + encode_command(NewTxn(1, 60_000, 1)) + encode_command(Ping())
    for i in range(len(data)):
        writer.write(data[i:i + 1])
        await writer.drain()
        await asyncio.sleep(0.001)
    got, closed = await read_commands(reader, 10, until=lambda c: any(isinstance(x, Pong) for x in c))
    writer.close()
    kinds = [type(c) for c in got]
    assert not closed and kinds[0] is Connected and NewTxnResponse in kinds and Pong in kinds, got
    assert next(c for c in got if isinstance(c, NewTxnResponse)).error is None


def _frame(base: pb.BaseCommand, extra: bytes = b"") -> bytes:
    return encode_frame(base.SerializeToString() + extra)


async def test_contradicting_repeated_and_unknown_fields_are_read_as_protobuf_reads_them(server: ServerProcess) -> None:
    both = pb.BaseCommand(type=pb.BaseCommand.NEW_TXN)
    both.newTxn.request_id, both.newTxn.tc_id = 6, 1
    both.endTxn.request_id = 7  # a second sub-message, of another command: ignored, as at a broker
    twice = pb.BaseCommand(type=pb.BaseCommand.NEW_TXN)
    twice.newTxn.request_id, twice.newTxn.tc_id = 8, 1
    again = pb.BaseCommand(newTxn=pb.CommandNewTxn(request_id=9, tc_id=2)).SerializeToString()  # merged: last wins
    unknown = pb.BaseCommand(type=pb.BaseCommand.NEW_TXN)
    unknown.newTxn.request_id, unknown.newTxn.tc_id = 10, 1
    data = _frame(both) + _frame(twice, again) + _frame(unknown, b"\xf8\x7f\x01") + encode_command(Ping())
    got, closed = await send_and_read(server.port, data)
    answers = {c.request_id: c for c in got if isinstance(c, NewTxnResponse)}
    assert not closed and set(answers) == {6, 9, 10}, got
    assert answers[9].most == 2 and all(a.error is None for a in answers.values())
    await assert_still_served(server)


async def test_payload_commands_on_the_coordinator_port(server: ServerProcess) -> None:
    metadata = b"\x0a\x01x"
    tail = struct.pack(">HI", 0x0E01, 0) + struct.pack(">I", len(metadata)) + metadata + b"payload"

    def with_payload(command: bytes) -> bytes:
        return struct.pack(">II", 4 + len(command) + len(tail), len(command)) + command + tail

    new_txn = pb.BaseCommand(type=pb.BaseCommand.NEW_TXN)
    new_txn.newTxn.request_id, new_txn.newTxn.tc_id = 11, 1
    send = b"\x08\x06"  # BaseCommand{type: SEND}, no body our .proto knows
    got, closed = await send_and_read(server.port, with_payload(new_txn.SerializeToString()) + with_payload(send)
                                      + encode_command(Ping()))
    assert not closed, got
    assert any(isinstance(c, NewTxnResponse) and c.request_id == 11 and c.error is None for c in got), got
    refused = [c for c in got if isinstance(c, Error)]
    assert refused and refused[0].error is ServerError.NotAllowedError and "SEND" in refused[0].message, got
    assert any(isinstance(c, Pong) for c in got)


async def test_one_request_id_three_times_at_once_gets_three_answers(server: ServerProcess) -> None:
    got, closed = await send_and_read(server.port, encode_command(NewTxn(12, 60_000, 1)) * 3)
    assert not closed
    answers = [c for c in got if isinstance(c, NewTxnResponse) and c.request_id == 12]
    assert len(answers) == 3 and len({a.least for a in answers}) == 3, got


async def test_txn_ids_at_the_extremes_get_specific_codes(server: ServerProcess) -> None:
    top = 2**64 - 1
    data = (encode_command(EndTxn(13, top, top, TxnAction.ABORT))
            + encode_command(EndTxn(14, 0, 0, TxnAction.COMMIT))
            + encode_command(EndTxn(15, 1, top, TxnAction.COMMIT))  # never issued
            + encode_command(AddPartitionToTxn(16, 16, 123, ("persistent://a/b/c",)))  # coordinator 16 of 16
            + encode_command(NewTxn(17, top, 1))
            + encode_command(NewTxn(-1, 0, 1)))
    got, closed = await send_and_read(server.port, data)
    assert not closed
    by_id = {c.request_id: c for c in got if isinstance(c, EndTxnResponse | AddPartitionToTxnResponse | NewTxnResponse)}
    assert by_id[13].error is ServerError.TransactionCoordinatorNotFound and by_id[13].most == top
    assert by_id[14].error is ServerError.TransactionNotFound
    assert by_id[15].error is ServerError.TransactionNotFound
    assert by_id[16].error is ServerError.TransactionCoordinatorNotFound and by_id[16].most == 16
    assert by_id[17].error is ServerError.NotAllowedError and "86400000" in (by_id[17].message or "")
    assert by_id[-1].error is None
    await assert_still_served(server)


@pytest.mark.parametrize("data", [
    pytest.param(struct.pack(">I", 5 * 1024 * 1024), id="frame-over-the-limit"),
    pytest.param(_frame(pb.BaseCommand(type=pb.BaseCommand.NEW_TXN)), id="type-without-its-sub-message"),
])
async def test_input_closed_on_is_named_first(server: ServerProcess, data: bytes) -> None:
    # A frame over --max-frame-size, or a command whose request id cannot be read, was a bare disconnect: the
    # client's log could not say why (a review). An ERROR for request id -1 says it before the close.
    got, closed = await send_and_read(server.port, data)
    errors = [c for c in got if isinstance(c, Error)]
    assert closed and len(errors) == 1, got
    assert errors[0].error is ServerError.UnknownError
    assert (errors[0].message or "").startswith(("bad frame: ", "malformed command: ")), errors
    await assert_still_served(server)
