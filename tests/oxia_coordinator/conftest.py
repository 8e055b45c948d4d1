"""The Oxia server of these tests is the STAND-IN (tests/oxia_standin), a Python imitation of Oxia's
client gRPC API, because the real server cannot be installed here (the Go module proxy refuses
github.com/oxia-db/oxia). ``standin`` runs one with 3 shards in the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.oxia_standin.server import StandinOxia


@pytest.fixture
async def standin() -> AsyncIterator[StandinOxia]:
    oxia = StandinOxia(shards=3)
    await oxia.start()
    yield oxia
    await oxia.stop()
