"""A leader stalled longer than its Oxia session timeout (SIGSTOP of a real tc-server process) does not
answer, once it runs again, a NEW_TXN whose header it wrote after its session may have expired: by then
another instance may lead the coordinator and have scanned the store already, and would neither track
nor time out that txn, and its low watermark could pass it (docs/participants.md, The low watermark).
The instance answers TransactionCoordinatorNotFound (the client looks the coordinator up again) and
serves again once it leads under a live session.

The Oxia server is the STAND-IN (tests/oxia_standin, 3 shards, in this test's event loop): the real
server cannot be installed here (the Go module proxy refuses github.com/oxia-db/oxia). It expires
sessions by timeout as Oxia does (4 s here)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tc_server.wire import AddPartitionToTxn, ServerError
from tests.oxia_coordinator.support import client_for, get_json, led, start_oxia_server
from tests.oxia_standin.server import StandinOxia
from tests.support.waiting import async_wait_for

pytestmark = pytest.mark.slow

TTL_MS = 600_000
TC_ID = 1


async def test_a_leader_stalled_past_its_session_answers_no_new_txn_written_after_it(tmp_path, standin: StandinOxia):
    server = await start_oxia_server(tmp_path, "a", standin)
    try:
        async def leads() -> bool:
            return TC_ID in (await led(server) or set())

        await async_wait_for(leads, f"the instance leads coordinator {TC_ID}")
        client = await client_for(server, TC_ID)
        served = await client.new_txn(tc_id=TC_ID, ttl_ms=TTL_MS)
        assert served.error is None, served

        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            async def sessions_expired() -> bool:
                return not standin.sessions

            await async_wait_for(sessions_expired, "the stopped instance's sessions expired on the store")
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

        await async_wait_for(serves_again, "the instance serves NEW_TXN again under a live session")
    finally:
        await asyncio.to_thread(server.kill)


@pytest.mark.parametrize("scalable", [True, False], ids=["v5-segment-add", "repeated-legacy-add"])
async def test_a_lapsed_leader_answers_no_add_for_a_txn_the_new_leader_aborted(tmp_path, standin: StandinOxia,
                                                                             scalable: bool):
    # Stalled past its session while the next leader aborted a txn, the instance answered an ADD it read on
    # waking with success, from its header in memory, when the ADD wrote nothing (a v5 ADD, or participants
    # already recorded): the lease was checked after writes only. Now TransactionCoordinatorNotFound (or
    # InvalidTxnStatus once it reads the header).
    a = await start_oxia_server(tmp_path, "a", standin)
    b = None
    clients = []
    try:
        b = await start_oxia_server(tmp_path, "b", standin)

        async def split() -> bool:
            la, lb = await led(a) or set(), await led(b) or set()
            return bool(la) and bool(lb) and len(la) + len(lb) == 16

        await async_wait_for(split, "two instances split the coordinators")
        tc_id = min(await led(a) or set())
        client = await client_for(a, tc_id)
        clients.append(client)
        created = await client.new_txn(tc_id=tc_id, ttl_ms=TTL_MS)
        assert created.error is None, created
        txn = (created.most, created.least)
        topic = "segment://t/ns/topic/0000-ffff-1" if scalable else "persistent://t/ns/topic-partition-0"
        if not scalable:
            first = await client.add_partition(*txn, topic)
            assert first.error is None, first

        assert a.proc is not None
        a_pid = a.proc.pid
        os.kill(a_pid, signal.SIGSTOP)
        try:
            async def a_sessions_gone() -> bool:
                return not any(f":{a_pid}" in s.identity for s in standin.sessions.values())

            await async_wait_for(a_sessions_gone, "the stopped instance's sessions expired")

            async def b_leads() -> bool:
                return tc_id in (await led(b) or set())

            await async_wait_for(b_leads, "the other instance took the coordinator over")
            other = await client_for(b, tc_id)
            clients.append(other)
            aborted = await other.end_txn(*txn, commit=False)
            assert aborted.error is None, aborted
            status, doc = await get_json(b, f"/admin/v3/transactions/transactionMetadata/{txn[0]}/{txn[1]}")
            assert status == 200 and isinstance(doc, dict) and doc["status"] == "ABORTED", doc

            # Sent to the stalled instance: it reads it as soon as it runs again.
            stale = asyncio.ensure_future(client.request(
                AddPartitionToTxn(client.next_request_id(), txn[0], txn[1], (topic,), scalable=scalable)))
            await asyncio.sleep(0.3)
        finally:
            os.kill(a_pid, signal.SIGCONT)
        answer = await asyncio.wait_for(stale, 30)
        assert answer.error in (ServerError.InvalidTxnStatus, ServerError.TransactionCoordinatorNotFound), (
            f"the instance whose session lapsed answered ADD for the ABORTED txn {txn}: {answer}")
    finally:
        for c in clients:
            c.close()
        await asyncio.to_thread(a.kill)
        if b is not None:
            await asyncio.to_thread(b.kill)
