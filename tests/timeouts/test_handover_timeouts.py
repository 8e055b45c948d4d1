"""Timeouts across a coordinator hand-over, on two real tc-server processes sharing the STAND-IN Oxia
(tests/oxia_standin; the real server cannot be installed here): the txns a leader left open are aborted at
their deadline by the instance that takes its coordinators, after a ``kill -9`` and after a rebalance."""

from __future__ import annotations

import asyncio

import pytest

from tests.oxia_coordinator.support import client_for, get_json, led, start_oxia_server
from tests.oxia_standin.server import StandinOxia
from tests.support.waiting import async_wait_for

pytestmark = pytest.mark.slow

ALL = set(range(16))
TTL_MS = 6_000


@pytest.fixture
async def standin():
    oxia = StandinOxia(shards=3)
    await oxia.start()
    yield oxia
    await oxia.stop()


async def _status(server, most: int, least: int) -> object:
    code, doc = await get_json(server, f"/admin/v3/transactions/transactionMetadata/{most}/{least}")
    return doc.get("status") if code == 200 and isinstance(doc, dict) else (code, doc)


async def _open_on(server, tc_ids) -> list[tuple[int, int]]:
    opened = []
    for tc in tc_ids:
        client = await client_for(server, tc)
        try:
            for _ in range(3):
                created = await client.new_txn(tc_id=tc, ttl_ms=TTL_MS)
                assert created.error is None, created
                opened.append((created.most, created.least))
        finally:
            client.close()
    return opened


async def test_the_survivor_aborts_what_a_killed_leader_left_open(tmp_path, standin: StandinOxia) -> None:
    a = await start_oxia_server(tmp_path, "a", standin)
    b = None
    try:
        b = await start_oxia_server(tmp_path, "b", standin)

        async def split() -> bool:
            la, lb = await led(a), await led(b)
            return la is not None and lb is not None and len(la) == len(lb) == 8 and la | lb == ALL

        await async_wait_for(split, "two instances split the coordinators")
        victims = sorted(await led(a) or ())
        opened = await _open_on(a, victims)
        await asyncio.to_thread(a.kill)

        async def all_aborted() -> bool:
            return all([await _status(b, *txn) == "ABORTED" for txn in opened])

        await async_wait_for(all_aborted, "the survivor aborts the dead leader's txns at their deadline")
    finally:
        await asyncio.to_thread(a.kill)
        if b is not None:
            await asyncio.to_thread(b.stop)


async def test_txns_of_coordinators_handed_over_in_a_rebalance_time_out(tmp_path, standin: StandinOxia) -> None:
    a = await start_oxia_server(tmp_path, "a", standin)
    b = None
    try:
        await async_wait_for(lambda: _leads_all(a), "the first instance leads every coordinator")
        opened = await _open_on(a, sorted(ALL))
        b = await start_oxia_server(tmp_path, "b", standin)

        async def split() -> bool:
            la, lb = await led(a), await led(b)
            return la is not None and lb is not None and len(la) == len(lb) == 8

        await async_wait_for(split, "the coordinators are split")

        async def all_aborted() -> bool:
            states = [await _status(a if (await led(a) or set()) & {most} else b, most, least)
                      for most, least in opened]
            return all(state == "ABORTED" for state in states)

        await async_wait_for(all_aborted, "every txn is aborted at its deadline by whichever instance leads it")
    finally:
        await asyncio.to_thread(a.stop)
        if b is not None:
            await asyncio.to_thread(b.stop)


async def _leads_all(server) -> bool:
    return await led(server) == ALL
