"""Many short connections, each with one bad frame or one bad token: what a client can repeat at will is
logged once per interval (issue 15, "Log amplification"; tests/hostile/test_log_amplification.py covers
repeats on ONE connection). A real tc-server process."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tc_server.client.connection import ClientAuth, connect_command
from tc_server.wire import encode_command
from tests.logs.support import log_lines, named
from tests.security.pki import data_url, make_token
from tests.support.server_process import ServerProcess, started

CONNECTIONS = 150
SECRET = os.urandom(32)
FORGED = make_token(os.urandom(32), "HS256", "mallory", expires_in_s=None)  # signed with another key


async def send_and_wait_close(port: int, payload: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    try:
        await asyncio.wait_for(reader.read(), 30)  # until the server closes it (30 s: a failure's bound)
    finally:
        writer.close()


@pytest.mark.parametrize(("payload", "event"), [
    # A frame whose command size does not fit in its total size (FrameError).
    (b"\x00\x00\x00\x05\x00\x00\x00\x09zzzzz", "bad frame; closing"),
    # CONNECT with a token the configured key did not sign.
    (encode_command(connect_command(ClientAuth("token", FORGED.encode()))), "authentication failed"),
], ids=["bad-frame", "bad-token"])
async def test_one_bad_input_per_connection_is_logged_once_per_interval(tmp_path: Path, payload: bytes,
                                                                        event: str) -> None:
    server = started(ServerProcess(tmp_path / "data", "--coordinators", "1",
                                   "--authentication-providers", "token", "--token-secret-key", data_url(SECRET)))
    try:
        for _ in range(CONNECTIONS // 50):
            await asyncio.gather(*(send_and_wait_close(server.port, payload) for _ in range(50)))
    finally:
        server.stop()
    warned = named(server.log_path, event)
    written = sum(len(line) + 1 for line in log_lines(server.log_path))
    sent = CONNECTIONS * len(payload)
    # Refused connections (max_connections) get one line per 10 s; a bad frame or credential on a fresh
    # connection too, with the count of those left out (it was one warning per connection).
    assert len(warned) <= 3, (f"{len(warned)} {event!r} warnings for {CONNECTIONS} connections; the log "
                              f"grew {written} bytes for {sent} bytes sent ({written / sent:.0f}x)")
