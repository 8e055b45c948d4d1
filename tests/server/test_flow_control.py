"""ReadFlowControl (tc_server/server/flow_control.py) on a real socket transport: reading stops at the
first reason and resumes only when the last one is gone."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from tc_server.server.flow_control import ReadFlowControl


@pytest.fixture
async def transport() -> AsyncIterator[asyncio.Transport]:
    ours, peer = socket.socketpair()
    made, _ = await asyncio.get_running_loop().create_connection(asyncio.Protocol, sock=ours)
    yield made
    made.close()
    peer.close()


async def test_reading_resumes_only_when_every_reason_is_gone(transport: asyncio.Transport) -> None:
    flow = ReadFlowControl()
    flow.attach(transport)
    assert transport.is_reading() and not flow.paused
    flow.pause("write-buffer")
    flow.pause("in-flight")
    assert not transport.is_reading() and flow.paused
    assert flow.resume("write-buffer") is False  # the budget still holds it
    assert not transport.is_reading()
    assert flow.resume("in-flight") is True
    assert transport.is_reading() and not flow.paused


async def test_a_reason_not_held_changes_nothing(transport: asyncio.Transport) -> None:
    flow = ReadFlowControl()
    flow.attach(transport)
    flow.pause("shutdown")
    assert flow.resume("write-buffer") is False
    assert not transport.is_reading() and flow.paused


async def test_a_closed_transport_is_left_alone(transport: asyncio.Transport) -> None:
    flow = ReadFlowControl()
    flow.attach(transport)
    flow.pause("in-flight")
    transport.close()
    assert flow.resume("in-flight") is False  # nothing to go on with: the caller must not read on
    assert not flow.paused
