"""A client that sends small requests and reads nothing makes the server hold many times what it sent
in its write buffer: answers are produced frame after frame of one read without looking at the
transport's write buffer, so the input budget (--max-buffered-input-bytes) says nothing about it."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.app import App, start_app
from tc_server.client import connect, connect_command
from tc_server.config import Settings
from tc_server.server.connection import MAX_ANSWERS_HELD_BYTES
from tc_server.wire import Connected, FrameDecoder, WatchTcAssignments, encode_command, encode_frame
from tc_server.wire.codec.registry import varint
from tests.hostile.conftest import BASE

BUDGET = 256 * 1024


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return replace(BASE, data_dir=str(tmp_path / "data"), max_buffered_input_bytes=BUDGET)


def server_write_buffers(app: App) -> int:
    return sum(c._transport.get_write_buffer_size() for c in app.context.connections  # noqa: SLF001
               if c._transport is not None)


async def test_a_client_that_reads_nothing_cannot_make_the_server_hold_many_times_its_input(app: App) -> None:
    assert app.listener is not None
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # reads nothing: its kernel takes little
    sock.connect(("127.0.0.1", app.listener.port))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_sendall(sock, encode_command(connect_command()))
        # The same watch id again and again: each is answered with the whole coordinator map.
        frame = encode_command(WatchTcAssignments(1))
        sent = 0
        data = frame * (BUDGET // len(frame))  # as much as the whole server's input budget, once
        try:
            await asyncio.wait_for(loop.sock_sendall(sock, data), 5)
            sent = len(data)
        except TimeoutError:
            pass
        peak = 0
        for _ in range(50):
            await asyncio.sleep(0.02)
            peak = max(peak, server_write_buffers(app))
        # What one client can make the server hold should stay in the order of the transport's
        # high-water mark (64 KiB) plus one answer, not a multiple of the input budget.
        assert peak <= BUDGET, (f"one client that sent {sent} bytes (the whole input budget is {BUDGET}) "
                                f"made the server hold {peak} bytes of unsent answers")
    finally:
        sock.close()



# A namespace of 16,000 topics: each answer to GET_TOPICS_OF_NAMESPACE is ~1 MiB.
NAMESPACE_TOPICS = [f"persistent://public/default/topic-{i:08d}-padding-padding" for i in range(16_000)]


class TopicsBroker:
    """A stand-in broker (a real one answers a large namespace's listing alike) that answers each
    GET_TOPICS_OF_NAMESPACE with the ~1 MiB listing of NAMESPACE_TOPICS, 0.2 s later (the requests all arrive
    before the first answer)."""

    def __init__(self) -> None:
        # Field 2 of CommandGetTopicsOfNamespaceResponse (repeated string topics): the project's protobuf has
        # request_id only, and keeps the rest as unknown fields.
        self._topics = b"".join(b"\x12" + varint(len(topic)) + topic.encode() for topic in NAMESPACE_TOPICS)
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"pulsar://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        self._server.close()

    def _answer(self, request_id: int) -> bytes:
        listing = pb.BaseCommand(type=pb.BaseCommand.GET_TOPICS_OF_NAMESPACE_RESPONSE)
        listing.getTopicsOfNamespaceResponse.MergeFromString(
            pb.CommandGetTopicsOfNamespaceResponse(request_id=request_id).SerializeToString() + self._topics)
        return encode_frame(listing.SerializeToString())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(64 * 1024 * 1024)
        loop = asyncio.get_running_loop()
        while data := await reader.read(65536):
            decoder.feed(data)
            while (frame := decoder.next_frame()) is not None:
                command = pb.BaseCommand.FromString(frame)
                if command.type == pb.BaseCommand.CONNECT:
                    writer.write(encode_command(Connected("stand-in", 21)))
                elif command.type == pb.BaseCommand.GET_TOPICS_OF_NAMESPACE:
                    loop.call_later(0.2, writer.write, self._answer(command.getTopicsOfNamespace.request_id))


def topics_request(request_id: int) -> bytes:
    command = pb.BaseCommand(type=pb.BaseCommand.GET_TOPICS_OF_NAMESPACE)
    command.getTopicsOfNamespace.MergeFromString(  # and field 2, the namespace
        pb.CommandGetTopicsOfNamespace(request_id=request_id).SerializeToString() + b"\x12\x0epublic/default")
    return encode_frame(command.SerializeToString())


async def test_a_client_that_reads_none_of_its_forwarded_answers_is_closed_at_a_bound(
        settings: Settings, server_log: list[dict[str, Any]]) -> None:
    # Pausing its reads bounded its requests, not the answers to those already forwarded: 200 requests of ~40
    # bytes held 200 MiB of answers until its keep-alive closed it (a review: 2 GiB from 2,000).
    broker = TopicsBroker()
    await broker.start()
    app = await start_app(replace(settings, upstream_url=broker.url, request_timeout_s=30))
    sock = socket.socket()
    try:
        assert app.listener is not None
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # reads nothing: its kernel takes little
        sock.connect(("127.0.0.1", app.listener.port))
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, encode_command(connect_command()))
        await loop.sock_sendall(sock, b"".join(topics_request(i) for i in range(1, 201)))
        peak = 0
        async with asyncio.timeout(30):  # a bound for a failing test, not a timing check
            while not any(line["event"] == "closing: the client leaves its answers unread" for line in server_log):
                peak = max(peak, server_write_buffers(app) + sum(c._out.queued_bytes for c in app.context.connections))
                await asyncio.sleep(0.01)
        answer = len(broker._answer(1))
        assert peak <= MAX_ANSWERS_HELD_BYTES + answer, (peak, answer)
        assert app.context.metrics.connections_refused.labels("answers_unread")._value.get() == 1
        async with asyncio.timeout(10):
            while app.context.connections:
                await asyncio.sleep(0.01)
        client = await connect("127.0.0.1", app.listener.port)  # the server serves on
        try:
            await client.tc_client_connect(0)
        finally:
            client.close()
    finally:
        sock.close()
        await app.stop()
        broker.stop()
