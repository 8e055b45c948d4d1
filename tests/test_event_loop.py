"""The asyncio tests run on the loop TC_TEST_LOOP names (tests/conftest.py): uvloop under
`make test-uvloop`, pytest-asyncio's default asyncio loop otherwise."""

from __future__ import annotations

import asyncio
import os

import uvloop


async def test_the_loop_is_the_one_asked_for() -> None:
    loop = asyncio.get_running_loop()
    if os.environ.get("TC_TEST_LOOP", "asyncio") == "uvloop":
        assert isinstance(loop, uvloop.Loop), type(loop)
    else:
        assert not isinstance(loop, uvloop.Loop), type(loop)
        assert isinstance(loop, asyncio.BaseEventLoop), type(loop)
