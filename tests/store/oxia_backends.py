"""Conformance backends on the STAND-IN Oxia server (tests/oxia_standin), with 1 and 3 shards.

The stand-in is a Python imitation of Oxia's client API, used because the real server cannot be
installed here (the Go module proxy refuses github.com/oxia-db/oxia); passing on it proves the
client against docs/oxia-client.md's notes, not against Oxia itself.

Every session opened for one test directory talks to the same stand-in server, so a second session
sees the first one's data; :func:`stop_standin` ends that server when the test is over.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

from tc_server.bench.process import free_port
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


# -- the real Oxia server, when the project's `make oxia` could install it ---------------------------
#
# `make test-oxia-real` sets TC_SERVER_TEST_OXIA_BIN to the binary `make oxia` installs and runs the
# suite with these backends too. They are not part of `make test`: the Go module proxy refuses every
# github.com/oxia-db/oxia version here (403), so no machine of this project can install the server;
# `make oxia` fails saying so instead of the suite skipping silently.

REAL_OXIA_BIN = os.environ.get("TC_SERVER_TEST_OXIA_BIN")
_real: dict[Path, subprocess.Popen[bytes]] = {}


def _real_opener(shards: int) -> Callable[[Path], Awaitable[MetadataStore]]:
    async def open_session(path: Path) -> MetadataStore:
        assert REAL_OXIA_BIN, "TC_SERVER_TEST_OXIA_BIN is not set"
        address = getattr(_real.get(path), "tc_address", None)
        if address is None:
            port, metrics = free_port(), free_port()
            data = path / "oxia"
            proc = subprocess.Popen(
                [REAL_OXIA_BIN, "standalone", "-p", f"127.0.0.1:{port}", "-m", f"127.0.0.1:{metrics}",
                 "--data-dir", str(data / "db"), "--wal-dir", str(data / "wal"), "-s", str(shards)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            proc.tc_address = address = f"127.0.0.1:{port}"  # type: ignore[attr-defined]
            _real[path] = proc
            for _ in range(200):  # bounded wait for the gRPC port
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    await asyncio.sleep(0.05)
        return await connect(address, request_timeout_s=10.0)

    return open_session


async def stop_real(path: Path) -> None:
    proc = _real.pop(path, None)
    if proc is not None:
        proc.terminate()
        proc.wait(10)


if REAL_OXIA_BIN:
    OXIA_BACKENDS["oxia-real-1shard"] = _real_opener(1)
    OXIA_BACKENDS["oxia-real-3shard"] = _real_opener(3)
