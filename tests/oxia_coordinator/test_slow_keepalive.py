"""The STAND-IN Oxia answering session keep-alives slowly: it handles each one at once (the session stays
alive on the server, so no other instance can ever take the coordinators over) but its answer arrives after
more than half the session timeout (a slow path back, a busy server's send queue).

tc-server gave each keep-alive up to half the session timeout and sent the next only after the previous one's
answer, so its lease lapsed for good while the server kept the session: every coordinator refused NEW_TXN
with TransactionCoordinatorNotFound and /readyz said 503 forever, and since the session never expired nobody
else led them either (a review's). An answer counted from its send time renews the lease safely up to 90 % of
the timeout (docs/oxia-client.md); the heartbeats now go on their own schedule, each waited for that long."""

from __future__ import annotations

import asyncio

from tests.oxia_coordinator.support import SESSION_TIMEOUT_MS, client_for, get_json, start_oxia_server
from tests.oxia_standin import server as standin_server
from tests.oxia_standin.server import StandinOxia
from tests.support.waiting import async_wait_for

# Above half the session timeout, below its lease share (90 %): 2.4 s of 4.
ANSWER_DELAY_S = 0.6 * SESSION_TIMEOUT_MS / 1000
TTL_MS = 600_000


async def test_keepalives_answered_late_but_in_time_keep_the_lease(tmp_path, monkeypatch):
    slow = {"on": False}
    original = standin_server._Servicer.KeepAlive

    async def keep_alive(self, request, context):
        answer = await original(self, request, context)  # handled now: the session's timer restarts
        if slow["on"]:
            await asyncio.sleep(ANSWER_DELAY_S)
        return answer

    monkeypatch.setattr(standin_server._Servicer, "KeepAlive", keep_alive)
    oxia = StandinOxia(shards=3)
    await oxia.start()
    server = await start_oxia_server(tmp_path, "a", oxia)
    try:
        client = await client_for(server, 0)
        assert (await client.new_txn(tc_id=0, ttl_ms=TTL_MS)).error is None
        sessions = set(oxia.sessions)
        slow["on"] = True
        await asyncio.sleep(4 * SESSION_TIMEOUT_MS / 1000)  # long past the lease of any renewal given up
        assert set(oxia.sessions) == sessions, "precondition: the server kept the instance's sessions"
        last: list[object] = []

        async def serves() -> bool:
            answer = await client.new_txn(tc_id=0, ttl_ms=TTL_MS)
            ready = await get_json(server, "/readyz")
            last[:] = [answer.error, ready]
            return answer.error is None and ready[0] == 200

        try:
            await async_wait_for(serves, "NEW_TXN served and /readyz 200", bound_s=20)
        except AssertionError:
            raise AssertionError(f"keep-alives answered {ANSWER_DELAY_S} s late: still refused after 20 s; last "
                                 f"NEW_TXN error and /readyz: {last}") from None
        client.close()
    finally:
        slow["on"] = False
        await asyncio.to_thread(server.kill)
        await oxia.stop()
