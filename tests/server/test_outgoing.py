"""Frames gathered per loop turn (tc_server/outgoing.py), and that closing a connection loses none of them.

The batching itself is checked on a transport that records its write() calls (how many calls is the
property); what reaches the peer is checked on real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tc_server.client.connection import PulsarConnection
from tc_server.outgoing import OutgoingFrames


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing


async def test_frames_of_one_turn_leave_in_one_write_in_order() -> None:
    out = OutgoingFrames(asyncio.get_running_loop())
    transport = RecordingTransport()
    out.transport = transport
    for frame in (b"a", b"bb", b"ccc"):
        out.add(frame)
    assert transport.writes == []  # not before the end of the turn
    await asyncio.sleep(0)
    assert transport.writes == [b"abbccc"]
    out.add(b"d")
    await asyncio.sleep(0)
    assert transport.writes == [b"abbccc", b"d"]


async def test_flush_writes_at_once_and_the_end_of_the_turn_writes_nothing_twice() -> None:
    out = OutgoingFrames(asyncio.get_running_loop())
    transport = RecordingTransport()
    out.transport = transport
    out.add(b"x")
    out.flush()
    assert transport.writes == [b"x"]
    await asyncio.sleep(0)
    assert transport.writes == [b"x"]


async def test_frames_for_a_closing_or_missing_transport_are_dropped() -> None:
    out = OutgoingFrames(asyncio.get_running_loop())
    out.add(b"no transport yet")
    await asyncio.sleep(0)
    transport = RecordingTransport()
    transport.closing = True
    out.transport = transport
    out.add(b"closing")
    await asyncio.sleep(0)
    assert transport.writes == []


@contextlib.asynccontextmanager
async def peer_reading_to_eof() -> AsyncIterator[tuple[int, Callable[[], Awaitable[bytes]]]]:
    """A real listening socket that reads one connection until EOF: its port, and what waits for the
    bytes it read."""
    received = bytearray()
    done = asyncio.Event()

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.extend(await reader.read())  # until EOF
        writer.close()
        done.set()

    async def read_all() -> bytes:
        await asyncio.wait_for(done.wait(), 10)
        return bytes(received)

    server = await asyncio.start_server(peer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], read_all
    finally:
        server.close()
        await server.wait_closed()


async def test_a_frame_sent_right_before_close_reaches_the_peer() -> None:
    async with peer_reading_to_eof() as (port, read_all):
        _, conn = await asyncio.get_running_loop().create_connection(
            lambda: PulsarConnection("pulsar://test"), "127.0.0.1", port)
        conn.send_raw(b"first")
        conn.send_raw(b"-last")
        conn.close()  # in the same turn as the sends
        assert await read_all() == b"first-last"


async def test_a_frame_queued_when_the_peer_half_closes_still_goes() -> None:
    """The peer shuts its sending side in the same turn as our send: asyncio calls eof_received, then
    closes the transport itself (not through PulsarConnection.close())."""
    async with peer_reading_to_eof() as (port, read_all):
        transport, conn = await asyncio.get_running_loop().create_connection(
            lambda: PulsarConnection("pulsar://test"), "127.0.0.1", port)
        conn.send_raw(b"queued")
        assert not conn.eof_received()  # what the loop does on EOF: then it closes the transport
        transport.close()
        assert await read_all() == b"queued"
