"""A client that half-closes its socket (shutdown(SHUT_WR)) after sending its requests still gets every
answer, then the server closes the connection. Found by a fuzzer of the wire: asyncio's default closed the
transport at the client's EOF, and every request still in flight lost its answer while its txn was created
or ended all the same."""

from __future__ import annotations

import asyncio

from tc_server.app import App
from tc_server.client import connect_command
from tc_server.wire import FrameDecoder, NewTxn, NewTxnResponse, decode_command, encode_command

REQUESTS = 200


async def test_requests_sent_before_a_half_close_are_all_answered(app: App) -> None:
    assert app.listener is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", app.listener.port)
    writer.write(encode_command(connect_command()))
    writer.write(b"".join(encode_command(NewTxn(i + 1, 60_000, i % 16)) for i in range(REQUESTS)))
    writer.write_eof()  # "no more requests"; the socket stays open for the answers
    decoder = FrameDecoder(1 << 24)
    answered: set[int] = set()
    async with asyncio.timeout(20):
        while len(answered) < REQUESTS and (data := await reader.read(65536)):
            decoder.feed(data)
            while (frame := decoder.next_frame()) is not None:
                cmd = decode_command(frame)
                if isinstance(cmd, NewTxnResponse):
                    answered.add(cmd.request_id)
        assert len(answered) == REQUESTS, f"{REQUESTS - len(answered)} of {REQUESTS} requests lost their answer"
        assert await reader.read() == b""  # then the server closes: nothing of this client is left
    writer.close()
