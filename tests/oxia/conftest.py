"""Fixtures for the Oxia client tests. They run against the STAND-IN server (tests/oxia_standin),
a Python imitation of Oxia's client API, because the real Oxia server cannot be installed here."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tc_server.store.oxia import OxiaStore, connect
from tests.oxia_standin.server import StandinOxia


@pytest.fixture
async def oxia() -> AsyncIterator[StandinOxia]:
    server = StandinOxia(shards=1)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def oxia3() -> AsyncIterator[StandinOxia]:
    server = StandinOxia(shards=3)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def store(oxia: StandinOxia) -> AsyncIterator[OxiaStore]:
    s = await connect(oxia.address, request_timeout_s=2.0)
    yield s
    await s.close()
