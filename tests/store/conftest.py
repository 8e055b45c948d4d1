"""The store conformance fixtures: every backend in BACKENDS runs the whole suite.

To add a backend, add an entry that opens a store session on the data set named by the given
directory. Calling it again with the same directory must open ANOTHER session on the SAME data (the
tests use that to check what survives a session: e.g. ephemeral records do not).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from tc_server.store.api import MetadataStore
from tc_server.store.embedded import EmbeddedStore
from tc_server.store.memory import MemoryBackend, MemoryStore
from tests.store.oxia_backends import OXIA_BACKENDS, stop_real, stop_standin

OpenSession = Callable[[], Awaitable[MetadataStore]]

# One MemoryBackend per test directory, so that a second session sees the first one's data.
_memory_backends: dict[Path, MemoryBackend] = {}


async def _open_memory(path: Path) -> MetadataStore:
    return MemoryStore(_memory_backends.setdefault(path, MemoryBackend()))


async def _open_embedded(path: Path) -> MetadataStore:
    return await EmbeddedStore.open(path / "data")


BACKENDS: dict[str, Callable[[Path], Awaitable[MetadataStore]]] = {
    "memory": _open_memory,
    "embedded": _open_embedded,
    **OXIA_BACKENDS,
}


@pytest.fixture(params=sorted(BACKENDS))
def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
async def open_session(backend_name: str, tmp_path: Path) -> AsyncIterator[OpenSession]:
    """Opens sessions on this test's data set; all are closed at the end of the test."""
    opened: list[MetadataStore] = []

    async def open_one() -> MetadataStore:
        store = await BACKENDS[backend_name](tmp_path)
        opened.append(store)
        return store

    yield open_one
    for store in reversed(opened):
        await store.close()
    _memory_backends.pop(tmp_path, None)
    await stop_standin(tmp_path)
    await stop_real(tmp_path)


@pytest.fixture
async def store(open_session: OpenSession) -> MetadataStore:
    return await open_session()
