"""An in-process tc-server on real sockets (port 0) and the wire-level test client."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tc_server.app import App, start_app
from tc_server.client import connect
from tc_server.config import Settings

BASE = Settings(
    listen="127.0.0.1:0",
    admin_listen="127.0.0.1:0",
    store="memory",
    coordinators=16,
    keepalive_s=30,
    log_format="json",
)


@pytest.fixture
def settings(tmp_path) -> Settings:
    return replace(BASE, data_dir=str(tmp_path / "data"))


@pytest.fixture
async def app(settings):
    app = await start_app(settings)
    yield app
    await app.stop()


@pytest.fixture
async def client(app: App):
    c = await connect("127.0.0.1", app.listeners[0].port)
    yield c
    c.close()
