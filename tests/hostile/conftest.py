"""An in-process tc-server on real loopback sockets, and a way to read what it logged.

The server's log lines are captured with structlog's testing helper, so a test can assert that no
traceback (``exc_info``) and no error line was written while hostile input was served."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
import structlog

from tc_server.app import App, start_app
from tc_server.client import TcClient, connect
from tc_server.config import Settings

BASE = Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", store="memory", coordinators=16,
                keepalive_s=30, log_format="json")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return replace(BASE, data_dir=str(tmp_path / "data"))


@pytest.fixture
def server_log() -> Iterator[list[dict[str, Any]]]:
    """Every event the server logs during the test (structlog's capture)."""
    with structlog.testing.capture_logs() as captured:
        # structlog types the events as MutableMapping; what it captures are dicts.
        yield cast(list[dict[str, Any]], captured)


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reached the event loop's exception handler: an exception that escaped a protocol
    callback (asyncio then logs "Fatal error: protocol.data_received() call failed" and drops the
    connection) or a task's exception nobody retrieved."""
    loop = asyncio.get_running_loop()
    caught: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: caught.append(context))
    yield caught
    loop.set_exception_handler(previous)


@pytest.fixture
async def app(settings: Settings, server_log: list[dict[str, Any]],
              loop_errors: list[dict[str, Any]]) -> AsyncIterator[App]:
    app = await start_app(settings)
    yield app
    await app.stop()


@pytest.fixture
async def client(app: App) -> AsyncIterator[TcClient]:
    assert app.listener is not None
    c = await connect("127.0.0.1", app.listener.port)
    yield c
    c.close()


def tracebacks(server_log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Log events that carry an exception, or are at error level: none is expected for bad input."""
    return [e for e in server_log if e.get("exc_info") or e.get("log_level") in ("error", "critical")]
