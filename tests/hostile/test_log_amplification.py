"""Log amplification (issue 15: ~10-byte unknown commands made 19x their size in log lines): what a
client can repeat at will is logged once per interval, while every frame is still answered and
counted in the metrics."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tc_server.app import App
from tc_server.client import TcClient, connect, connect_command
from tc_server.wire import EndTxn, ServerError, TxnAction, Unknown, encode_command
from tests.support.waiting import async_wait_for

REPEATS = 500
ANSWER_BOUND_S = 30.0


async def test_unknown_commands_are_answered_each_and_logged_once(
        app: App, client: TcClient, server_log: list[dict[str, Any]]) -> None:
    # A command type tc-server has no route for (26, REDELIVER_UNACKNOWLEDGED_MESSAGES), and no
    # upstream to forward it to: NotAllowedError each time.
    frame = encode_command(Unknown(type_code=26))
    client.send_raw(frame * REPEATS)
    await async_wait_for(lambda: len(client.errors) >= REPEATS)
    assert len(client.errors) == REPEATS
    assert {e.error for e in client.errors} == {ServerError.NotAllowedError}
    lines = [e for e in server_log if e["event"] == "command not served"]
    assert len(lines) == 1, len(lines)
    assert (await client.new_txn(tc_id=1)).error is None


async def test_failing_requests_are_logged_once_per_interval(
        app: App, client: TcClient, server_log: list[dict[str, Any]]) -> None:
    # END_TXN of ids that do not exist: TransactionNotFound for every one.
    frames = b"".join(encode_command(EndTxn(1000 + i, 4, 10_000_000 + i, TxnAction.COMMIT))
                      for i in range(REPEATS))
    waiters = {1000 + i: asyncio.get_running_loop().create_future() for i in range(REPEATS)}

    def answered(cmd: Any, _frame: bytes) -> None:
        waiter = waiters.get(getattr(cmd, "request_id", None) or -1)
        if waiter is not None:
            waiter.set_result(cmd)

    client.set_listener(answered)
    client.send_raw(frames)
    got = await asyncio.wait_for(asyncio.gather(*waiters.values()), ANSWER_BOUND_S)
    assert {a.error for a in got} == {ServerError.TransactionNotFound}
    lines = [e for e in server_log if e["event"] == "request failed"]
    # One line per second at most, with the count of those left out: far fewer than the requests.
    assert 1 <= len(lines) < REPEATS // 50, len(lines)


VERSION_BYTES = 60 * 1024  # near the most a CONNECT may be (64 KiB: a frame before the handshake)


def line_bytes(event: dict[str, Any]) -> int:
    return len(json.dumps(event, default=str))


async def test_a_long_client_version_is_not_repeated_in_every_log_line(
        app: App, server_log: list[dict[str, Any]]) -> None:
    # CONNECT's client_version was bound to the connection's logger uncut: every later line of the
    # connection repeated up to a frame's worth (256 KiB then; 64 KiB before the handshake since) of it, however
    # few lines the limiters let out.
    assert app.listener is not None
    client = await connect("127.0.0.1", app.listener.port, handshake=False)
    client_command = connect_command(client_version="v" * VERSION_BYTES)
    await client.handshake(client_command)
    sent = len(encode_command(client_command))
    unknown = encode_command(Unknown(type_code=26))  # a type tc-server does not serve
    client.send_raw(unknown)
    sent += len(unknown)
    await async_wait_for(lambda: client.errors)
    assert client.errors
    client.close()
    await async_wait_for(lambda: any(e["event"] == "connection closed" for e in server_log))
    logged = sum(line_bytes(e) for e in server_log)
    biggest = max(server_log, key=line_bytes)
    assert line_bytes(biggest) <= 4096, (
        f"the client sent {sent} bytes; the server logged {logged} bytes in {len(server_log)} lines, "
        f"{line_bytes(biggest)} in its line {biggest['event']!r} alone")
