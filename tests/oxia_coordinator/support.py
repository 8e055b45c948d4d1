"""Helpers for real tc-server processes on Oxia, where the Oxia server is the STAND-IN (tests/oxia_standin).

The stand-in is a Python imitation of Oxia's client gRPC API, used because the real server cannot
be installed here (the Go module proxy refuses github.com/oxia-db/oxia); what passes here proves the
coordinator against the behaviour docs/oxia-client.md records for Oxia (sessions that expire by timeout,
ephemeral records deleted with them, data kept across a restart), not against Oxia itself.

The stand-in serves from the test's event loop, so everything that blocks (starting a process and
waiting for it, admin HTTP calls, kill) runs in a thread: a blocked loop would stall the stand-in.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tc_server.client import TcClient, connect
from tc_server.server.discovery import ASSIGN_TOPIC
from tc_server.wire import LookupType
from tests.oxia_standin.server import StandinOxia
from tests.support.server_process import ServerProcess

# 4 s, not 2: the stand-in Oxia runs in the test's own event loop, and a stall of ~1.8 s (90 % of 2 s) in the test
# or in tc-server lapsed a lease or expired a session that the test needed alive.
SESSION_TIMEOUT_MS = 4_000


async def start_oxia_server(tmp_path: Path, name: str, oxia: StandinOxia, *extra: str) -> ServerProcess:
    """A started tc-server process on ``oxia``. Its ports are picked free just before the start; if
    another socket took one meanwhile (an outgoing connection's ephemeral port), new ones are picked."""
    for attempt in range(3):
        server = ServerProcess(
            tmp_path / name / "data", "--oxia-address", oxia.address,
            "--oxia-session-timeout-ms", str(SESSION_TIMEOUT_MS), *extra, store="oxia",
        )
        try:
            await asyncio.to_thread(server.start)
            return server
        except RuntimeError:
            if attempt == 2 or "Address already in use" not in server.log_tail():
                raise
    raise AssertionError("unreachable")


async def get_json(server: ServerProcess, path: str) -> tuple[int, object]:
    return await asyncio.to_thread(server.get_json, path)


async def led(server: ServerProcess) -> set[int] | None:
    """The coordinators ``server`` leads (``/readyz``), or None while it is not ready."""
    try:
        status, doc = await get_json(server, "/readyz")
    except OSError:
        return None
    if status != 200 or not isinstance(doc, dict):
        return None
    return set(doc["led"])


async def client_for(bootstrap: ServerProcess, tc_id: int) -> TcClient:
    """As a Pulsar client does: LOOKUP the coordinator's assign partition, connect to the URL it
    names, TC_CLIENT_CONNECT there."""
    probe = await connect("127.0.0.1", bootstrap.port)
    try:
        found = await probe.lookup(f"{ASSIGN_TOPIC}-partition-{tc_id}")
    finally:
        probe.close()
    assert found.response is LookupType.CONNECT and found.broker_service_url, found
    host, port = found.broker_service_url.removeprefix("pulsar://").rsplit(":", 1)
    client = await connect(host, int(port))
    answer = await client.tc_client_connect(tc_id)
    assert answer.error is None, answer
    return client
