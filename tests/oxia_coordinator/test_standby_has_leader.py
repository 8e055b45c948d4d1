"""tc_server_coordinator_has_leader with Oxia unreachable from every instance, on the STAND-IN (docs/alerts.md:
"an Oxia unreachable from every instance is alerted on here"). The leader's own lease lapses and it says 0; an
instance that leads nothing (a standby: more instances than coordinators, or a fair share that left it none)
had no partition whose lease could lapse, so it went on saying 1 for the leader it knew, and
TcServerCoordinatorWithoutLeader never fired while no transaction could be served (a review's). Its member
record's lease tells it now."""

from __future__ import annotations

import asyncio

from tests.oxia_coordinator.support import get_json, led, start_oxia_server
from tests.oxia_standin.server import StandinOxia
from tests.support.server_process import ServerProcess
from tests.support.waiting import async_wait_for

SERIES = 'tc_server_coordinator_has_leader{cluster="standalone",coordinator_id="0"}'


async def has_leader(server: ServerProcess) -> float | None:
    try:
        code, body = await asyncio.to_thread(server.get, "/metrics")
    except OSError:
        return None
    if code != 200:
        return None
    for line in body.decode().splitlines():
        if line.startswith(SERIES + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_standby_does_not_report_a_leader_while_oxia_is_unreachable(tmp_path):
    oxia = StandinOxia(shards=1)
    await oxia.start()
    a = await start_oxia_server(tmp_path, "a", oxia, "--coordinators", "1")
    b = None
    stopped = False
    try:
        await async_wait_for(lambda: _led_is(a, {0}), "instance a leads coordinator 0")
        b = await start_oxia_server(tmp_path, "b", oxia, "--coordinators", "1")
        await async_wait_for(lambda: _is(b, 1.0), "standby b reports coordinator 0 as led (by a)")
        assert await led(b) in (set(), None), "precondition: b leads nothing"
        await oxia.stop()  # Oxia unreachable from every instance
        stopped = True
        await async_wait_for(lambda: _lapsed(a), "a's /readyz names its lease as lapsed", bound_s=30)
        last: dict[str, float | None] = {}

        async def no_instance_says_1() -> bool:
            last["a"], last["b"] = await has_leader(a), await has_leader(b)
            return max((v for v in last.values() if v is not None), default=0.0) == 0.0

        try:
            await async_wait_for(no_instance_says_1, "max over instances of has_leader{0} is 0", bound_s=20)
        except AssertionError:
            raise AssertionError(f"Oxia unreachable from every instance, coordinator 0's leader's lease lapsed, yet "
                                 f"has_leader by instance = {last}: the standby still says 1, so the no-leader "
                                 "alert cannot fire") from None
    finally:
        for server in (a, b):
            if server is not None:
                await asyncio.to_thread(server.kill)
        if not stopped:
            await oxia.stop()


async def _led_is(server, expected: set[int]) -> bool:
    return await led(server) == expected


async def _is(server, value: float) -> bool:
    return await has_leader(server) == value


async def _lapsed(server) -> bool:
    try:
        code, body = await get_json(server, "/readyz")
    except OSError:
        return False
    return code == 503 and "keep-alive" in str(body)
