"""A client that sends small requests and reads nothing makes the server hold many times what it sent
in its write buffer: answers are produced frame after frame of one read without looking at the
transport's write buffer, so the input budget (--max-buffered-input-bytes) says nothing about it."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from tc_server.app import App
from tc_server.client import connect_command
from tc_server.config import Settings
from tc_server.wire import WatchTcAssignments, encode_command
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

