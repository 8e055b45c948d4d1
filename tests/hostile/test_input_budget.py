"""Bounded input (issue 15, "Memory is unbounded"): frames are limited to what a coordinator receives
(--max-frame-size, far below a producer's 5 MiB message: payloads reach brokers through relay.py, never
the frame decoder), and the input all connections buffer is capped (--max-buffered-input-bytes): past
it, a connection growing a large unfinished frame is closed, while small commands keep flowing."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tc_server.app import App
from tc_server.client import TcClient, connect
from tc_server.config import Settings
from tests.support.waiting import async_wait_for

from .conftest import BASE, tracebacks

CLOSE_BOUND_S = 5.0
FRAME_LIMIT = 64 * 1024
BUDGET = 256 * 1024


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return replace(BASE, data_dir=str(tmp_path / "data"), max_frame_size=FRAME_LIMIT,
                   max_buffered_input_bytes=BUDGET)


async def closed_within(client: TcClient, seconds: float = CLOSE_BOUND_S) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(client.closed), seconds)
    except TimeoutError:
        return False
    return True


def buffered_input(app: App) -> int:
    assert app.listener is not None
    return app.context.buffered_input


async def test_the_default_frame_limit_fits_a_coordinator_not_a_producer() -> None:
    assert Settings().max_frame_size <= 1024 * 1024 < Settings().max_message_size


async def test_a_frame_header_announcing_5_mib_closes_at_the_header(app: App, client: TcClient) -> None:
    assert app.listener is not None
    victim = await connect("127.0.0.1", app.listener.port)
    victim.send_raw(struct.pack(">I", 5 * 1024 * 1024))  # then nothing: the stall of issue 15
    assert await closed_within(victim)
    assert (await client.new_txn(tc_id=1)).error is None


async def test_stalled_large_frames_cannot_take_more_than_the_budget(
        app: App, client: TcClient, server_log: list[dict[str, Any]]) -> None:
    assert app.listener is not None
    stallers = [await connect("127.0.0.1", app.listener.port) for _ in range(12)]
    body = 48 * 1024  # of a frame announced at the limit: 12 of them are more than the budget
    for staller in stallers:
        # totalSize FRAME_LIMIT - 4: the limit counts the 4-byte size field, as a broker does
        staller.send_raw(struct.pack(">II", FRAME_LIMIT - 4, FRAME_LIMIT - 8) + b"\x00" * body)
        await asyncio.sleep(0.01)
        # A connection whose input does not fit the budget is closed, so the total stays within it
        # (plus the one read that found it over).
        assert buffered_input(app) <= BUDGET + body + 8
    closed = [await closed_within(s, 1.0) for s in stallers]
    assert any(closed) and not all(closed), closed
    # Small commands still flow: a well-behaved client is served while the budget is full.
    for _ in range(5):
        opened = await client.new_txn(tc_id=2)
        assert opened.error is None
    assert any(e["event"] == "closing: buffered input over the server's budget" for e in server_log)
    assert tracebacks(server_log) == []
    for staller in stallers:
        staller.close()
    await async_wait_for(lambda: buffered_input(app) == 0)
    assert buffered_input(app) == 0
