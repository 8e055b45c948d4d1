"""Conformance backends on the STAND-IN Oxia server (tests/oxia_standin), with 1 and 3 shards.

The stand-in is a Python imitation of Oxia's client API, used because the real server cannot be
installed here (the Go module proxy refuses github.com/oxia-db/oxia); passing on it proves the
client against oxia.md's notes, not against Oxia itself.

Every session opened for one test directory talks to the same stand-in server, so a second session
sees the first one's data; :func:`stop_standin` ends that server when the test is over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from tc_server.store.api import MetadataStore
from tc_server.store.oxia import connect
from tests.oxia_standin.server import StandinOxia

_standins: dict[Path, StandinOxia] = {}


def _opener(shards: int) -> Callable[[Path], Awaitable[MetadataStore]]:
    async def open_session(path: Path) -> MetadataStore:
        oxia = _standins.get(path)
        if oxia is None:
            oxia = _standins[path] = StandinOxia(shards)
            await oxia.start()
        return await connect(oxia.address, request_timeout_s=10.0)

    return open_session


async def stop_standin(path: Path) -> None:
    oxia = _standins.pop(path, None)
    if oxia is not None:
        await oxia.stop()


OXIA_BACKENDS: dict[str, Callable[[Path], Awaitable[MetadataStore]]] = {
    "oxia-standin-1shard": _opener(1),
    "oxia-standin-3shard": _opener(3),
}
