"""A leader stalled longer than its Oxia session timeout (SIGSTOP of a real tc-server process) does not
answer, once it runs again, a NEW_TXN whose header it wrote after its session may have expired: by then
another instance may lead the coordinator and have scanned the store already, and would neither track
nor time out that txn, and its low watermark could pass it (docs/participants.md, The low watermark).
The instance answers TransactionCoordinatorNotFound (the client looks the coordinator up again) and
serves again once it leads under a live session.

The Oxia server is the STAND-IN (tests/oxia_standin, 3 shards, in this test's event loop): the real
server cannot be installed here (the Go module proxy refuses github.com/oxia-db/oxia). It expires
sessions by timeout as Oxia does (2 s here)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tc_server.wire import ServerError
from tests.oxia_coordinator.support import client_for, led, poll, start_oxia_server
from tests.oxia_standin.server import StandinOxia

pytestmark = pytest.mark.slow

TTL_MS = 600_000
TC_ID = 1


async def test_a_leader_stalled_past_its_session_answers_no_new_txn_written_after_it(tmp_path, standin: StandinOxia):
    server = await start_oxia_server(tmp_path, "a", standin)
    try:
        async def leads() -> bool:
            return TC_ID in (await led(server) or set())

        await poll(leads, f"the instance leads coordinator {TC_ID}")
        client = await client_for(server, TC_ID)
        served = await client.new_txn(tc_id=TC_ID, ttl_ms=TTL_MS)
        assert served.error is None, served

        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            async def sessions_expired() -> bool:
                return not standin.sessions

            await poll(sessions_expired, "the stopped instance's sessions expired on the store")
            # Sent while the process is stopped: it reads the request as soon as it runs again, before
            # anything has told it that its session is gone.
            stale = asyncio.ensure_future(client.new_txn(tc_id=TC_ID, ttl_ms=TTL_MS))
            await asyncio.sleep(0.2)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        answer = await stale
        assert answer.error is ServerError.TransactionCoordinatorNotFound, (answer, server.log_tail())
        client.close()

        # It campaigns again under a new session and serves the coordinator as before.
        async def serves_again() -> bool:
            if not await leads():
                return False
            fresh = await client_for(server, TC_ID)
            try:
                return (await fresh.new_txn(tc_id=TC_ID, ttl_ms=TTL_MS)).error is None
            finally:
                fresh.close()

        await poll(serves_again, "the instance serves NEW_TXN again under a live session")
    finally:
        await asyncio.to_thread(server.kill)
