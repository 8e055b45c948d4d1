"""A client that half-closes its socket (shutdown(SHUT_WR)) after sending its requests still gets every
answer, then the server closes the connection. Found by a fuzzer of the wire: asyncio's default closed the
transport at the client's EOF, and every request still in flight lost its answer while its txn was created
or ended all the same."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import replace

from tc_server.app import App, start_app
from tc_server.client import connect, connect_command
from tc_server.config import Settings
from tc_server.wire import EndTxn, FrameDecoder, NewTxn, NewTxnResponse, Ping, TxnAction, decode_command, encode_command

BOUND_S = 30  # a bound for a failing test

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


async def test_a_half_closed_client_that_reads_none_of_its_answers_is_closed(settings: Settings) -> None:
    # Its answers fill the write buffer (reading pauses for it) after its EOF was read: _close_if_done() waits for
    # reading to resume, which only the client's reading brings, and the keep-alive skipped a half-closed client,
    # so the connection held its slot and buffers for good (a review). It is closed as one that does not PONG.
    app = await start_app(replace(settings, keepalive_s=0.5, participant_wait_s=2.0))
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    try:
        assert app.listener is not None
        port = app.listener.port
        client = await connect("127.0.0.1", port)
        txn = await client.new_txn(tc_id=0)
        await client.add_partition(0, txn.least, "persistent://public/default/unreachable-partition")
        client.close()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # it reads nothing: a small window
        sock.setblocking(False)
        before = set(app.context.connections)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        sock.send(encode_command(connect_command()))
        async with asyncio.timeout(BOUND_S):
            while not (new := [c for c in app.context.connections if c not in before]):
                await asyncio.sleep(0.02)
            (conn,) = new
            # PINGs until the kernel's buffers are full and the server's transport holds answers.
            while conn._transport is not None and conn._transport.get_write_buffer_size() == 0:
                with contextlib.suppress(BlockingIOError):
                    sock.send(encode_command(Ping()) * 2000)
                await asyncio.sleep(0.02)
            # A slow request, then answers past the high-water mark (NEW_TXNs of a coordinator that does not
            # exist), then the EOF, read before those answers are written; nothing is ever read.
            sock.send(encode_command(EndTxn(1, 0, txn.least, TxnAction.COMMIT))
                      + b"".join(encode_command(NewTxn(i + 2, 60_000, 999)) for i in range(1500)))
            sock.shutdown(socket.SHUT_WR)
            while conn in app.context.connections:
                await asyncio.sleep(0.05)
    finally:
        sock.close()
        await app.stop()
