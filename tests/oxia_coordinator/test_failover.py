"""Failover between two real tc-server processes sharing one Oxia, which here is the STAND-IN Oxia
server (tests/oxia_standin, 3 shards, in this test's event loop): the real server cannot be
installed on these machines (the Go module proxy refuses github.com/oxia-db/oxia).

Two instances split the 16 coordinators 8/8. ``kill -9`` of one leaves its leader records in place
until its Oxia sessions expire by timeout (4 s here); then the survivor leads all 16, clients that
look up again are served by it, no txn id is ever handed out twice, and no decided txn changes state.
"""

from __future__ import annotations

import asyncio

import pytest

from tc_server.client import TcClient
from tests.oxia_coordinator.support import client_for, get_json, led, start_oxia_server
from tests.oxia_standin.server import StandinOxia
from tests.support.waiting import async_wait_for

pytestmark = pytest.mark.slow

ALL = set(range(16))
TXNS_PER_COORDINATOR = 9
TTL_MS = 600_000  # the open ones must outlive the test


class Ledger:
    """Every txn id answered, and the state every txn should be in."""

    def __init__(self) -> None:
        self.ids: list[tuple[int, int]] = []
        self.expected: dict[tuple[int, int], str] = {}

    async def run(self, client: TcClient, tc_id: int, count: int) -> None:
        """``count`` txns on ``tc_id``: a third committed, a third aborted, a third left open."""
        for i in range(count):
            created = await client.new_txn(tc_id=tc_id, ttl_ms=TTL_MS)
            assert created.error is None and created.most == tc_id, created
            txn = (created.most, created.least)
            self.ids.append(txn)
            self.expected[txn] = "OPEN"
            if i % 3 == 2:
                continue
            commit = i % 3 == 0
            ended = await client.end_txn(*txn, commit=commit)
            assert ended.error is None, ended
            self.expected[txn] = "COMMITTED" if commit else "ABORTED"


async def test_survivor_takes_every_coordinator_and_nothing_decided_changes(tmp_path, standin: StandinOxia):
    a = await start_oxia_server(tmp_path, "a", standin)
    clients: list[TcClient] = []
    try:
        b = await start_oxia_server(tmp_path, "b", standin)
    except BaseException:
        await asyncio.to_thread(a.stop)
        raise
    try:

        seen: dict[str, set[int]] = {}

        async def split() -> bool:
            led_a, led_b = await led(a), await led(b)
            if led_a is not None and led_b is not None and len(led_a) == len(led_b) == 8 and led_a | led_b == ALL:
                seen["a"] = led_a
                return True
            return False

        await async_wait_for(split, "two instances split the 16 coordinators 8/8")
        # What the poll saw, not a second /readyz: in a fresh-clone run on a machine loaded by benchmarks beside it,
        # the second read found the instance not ready for a moment and failed the test (its logs were not kept).
        led_by_a = seen["a"]

        # Before: each coordinator's client goes to the leader its LOOKUP names (TC_CLIENT_CONNECT
        # succeeds only there), half of them on each instance.
        ledger = Ledger()
        clients = [await client_for(a, tc) for tc in range(16)]
        await asyncio.gather(*(ledger.run(c, tc, TXNS_PER_COORDINATOR) for tc, c in enumerate(clients)))
        before = list(ledger.ids)

        # kill -9 with NEW_TXNs in flight on the victim: those answered count, the rest are unknown.
        in_flight = [asyncio.ensure_future(clients[tc].new_txn(tc_id=tc, ttl_ms=TTL_MS))
                     for tc in sorted(led_by_a) for _ in range(20)]
        await asyncio.sleep(0)
        await asyncio.to_thread(a.kill)
        for result in await asyncio.gather(*in_flight, return_exceptions=True):
            if not isinstance(result, BaseException) and result.error is None:
                ledger.ids.append((result.most, result.least))
                ledger.expected[(result.most, result.least)] = "OPEN"

        async def survivor_leads_all() -> bool:
            return await led(b) == ALL

        await async_wait_for(survivor_leads_all, "the survivor leads all 16 coordinators")

        # After: every client looks up again (through the survivor) and is served by the survivor.
        for c in clients:
            c.close()
        clients = [await client_for(b, tc) for tc in range(16)]
        after_start = len(ledger.ids)
        await asyncio.gather(*(ledger.run(c, tc, TXNS_PER_COORDINATOR) for tc, c in enumerate(clients)))

        assert len(set(ledger.ids)) == len(ledger.ids), "a txn id was handed out twice"
        for tc in range(16):
            earlier = [least for most, least in ledger.ids[:after_start] if most == tc]
            later = [least for most, least in ledger.ids[after_start:] if most == tc]
            assert min(later) > max(earlier), (tc, earlier, later)

        # Nothing decided changed, and the dead instance's open txns are still OPEN: all read on the
        # survivor.
        for (most, least), state in ledger.expected.items():
            status, doc = await get_json(b, f"/admin/v3/transactions/transactionMetadata/{most}/{least}")
            assert status == 200 and isinstance(doc, dict) and doc["status"] == state, ((most, least), state, doc)

        # The survivor governs the txns the dead instance left open: they can be ended there.
        orphans = [txn for txn in before if txn[0] in led_by_a and ledger.expected[txn] == "OPEN"]
        assert orphans
        for most, least in orphans:
            ended = await clients[most].end_txn(most, least, commit=True)
            assert ended.error is None, ended
            status, doc = await get_json(b, f"/admin/v3/transactions/transactionMetadata/{most}/{least}")
            assert isinstance(doc, dict) and doc["status"] == "COMMITTED"
    finally:
        for c in clients:
            c.close()
        await asyncio.to_thread(a.kill)
        await asyncio.to_thread(b.stop)
