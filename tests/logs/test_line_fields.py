"""What a line of a real tc-server's log says about where it comes from: the part of tc-server that wrote
it, and for a failed request the connection it failed on (found by a review of the docs: the README and
docs/security.md promised both, and the lines had neither)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import time
from pathlib import Path

import jwt
import structlog

from tc_server.client.connection import ClientAuth
from tc_server.client.tc import connect
from tc_server.logs import configure_logging, logging_state, restore_logging
from tests.logs.support import events
from tests.support.server_process import ServerProcess, started


def test_every_line_names_the_part_of_tc_server_that_wrote_it() -> None:
    # docs/participants.md sends operators to the tc_server.delivery lines; no line said so.
    buffer = io.StringIO()
    saved = sys.stderr
    sys.stderr = buffer
    state = logging_state()
    try:
        configure_logging("json", "info")
        structlog.get_logger("tc_server.delivery").warning("END_TXN_ON_PARTITION failing for 5 s")
    finally:
        sys.stderr = saved
        restore_logging(state)
    lines = [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]
    assert [(line["logger"], line["event"]) for line in lines] == [
        ("tc_server.delivery", "END_TXN_ON_PARTITION failing for 5 s")]


def _fail_an_end_txn(port: int, auth: ClientAuth | None = None) -> None:
    async def fail_one() -> None:
        client = await (connect("127.0.0.1", port) if auth is None else connect("127.0.0.1", port, auth=auth))
        try:
            await client.tc_client_connect(0)
            assert (await client.end_txn(0, 12345, True)).error is not None
        finally:
            client.close()
    asyncio.run(fail_one())


def test_a_failed_request_is_logged_with_its_connections_peer(tmp_path: Path) -> None:
    server = started(ServerProcess(tmp_path / "data", store="memory"))
    try:
        _fail_an_end_txn(server.port)
    finally:
        server.stop()
    failed = [line for line in events(server.log_path) if line.get("event") == "request failed"]
    assert failed, server.log_tail()
    assert all(line.get("peer", "").startswith("127.0.0.1:") and line["logger"] == "tc_server.connection"
               for line in failed), failed


def test_a_failed_request_is_logged_with_its_connections_role(tmp_path: Path) -> None:
    secret = os.urandom(32)
    (tmp_path / "secret.key").write_bytes(secret)
    server = started(ServerProcess(
        tmp_path / "data", "--authentication-providers", "token",
        "--token-secret-key", f"file://{tmp_path / 'secret.key'}", store="memory"))
    token = jwt.encode({"sub": "alice", "exp": int(time.time()) + 600}, secret, algorithm="HS256")
    try:
        _fail_an_end_txn(server.port, ClientAuth("token", token.encode()))
    finally:
        server.stop()
    failed = [line for line in events(server.log_path) if line.get("event") == "request failed"]
    assert failed, server.log_tail()
    assert all((line.get("role"), line.get("method")) == ("alice", "token") for line in failed), failed
