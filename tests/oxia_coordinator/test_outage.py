"""An Oxia outage under load, against a real tc-server process. The Oxia server is the STAND-IN
(tests/oxia_standin, 3 shards, in this test's event loop), because the real one cannot be installed
on these machines (the Go module proxy refuses github.com/oxia-db/oxia).

While Oxia stalls (takes writes, answers none) or is down, every request is answered with a typed
error (TransactionCoordinatorNotFound, which the Java client retries with a fresh lookup), never left
hanging. The stand-in keeps its data
across ``stop()``/``start()`` on the same port, as a durable server restart does, so after it is back
the txns decided before the outage are still decided, and service resumes without restarting
tc-server.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket

import pytest

from tc_server import __version__
from tc_server.app import start_app
from tc_server.client import TcClient, connect
from tc_server.config import Settings
from tc_server.wire import ServerError
from tests.oxia_coordinator.support import get_json, start_oxia_server
from tests.oxia_standin.server import StandinOxia
from tests.security.pki import data_url
from tests.support.server_process import ServerProcess, free_port
from tests.support.waiting import async_wait_for

pytestmark = pytest.mark.slow

# 5 s: after the outage every one of 320 requests must be answered in time, by a stand-in Oxia in the test's own
# event loop (2 s failed a request on a stall of a loaded machine).
REQUEST_TIMEOUT_S = 5
# A request may take the request timeout plus scheduling on a loaded machine; one not answered by
# this bound is a hang. Not a timing assertion: it only separates "answered" from "never".
HANG_BOUND_S = 5 * REQUEST_TIMEOUT_S
TTL_MS = 600_000


class Load:
    """Pairs of NEW_TXN + END_TXN on every coordinator, recording every answer."""

    def __init__(self, client: TcClient) -> None:
        self.client = client
        self.ids: list[tuple[int, int]] = []
        self.decided: dict[tuple[int, int], str] = {}
        self.errors: collections.Counter[ServerError] = collections.Counter()
        self.answered = 0

    async def request(self, coro):
        response = await asyncio.wait_for(coro, HANG_BOUND_S)  # TimeoutError here = a hang
        self.answered += 1
        if response.error is not None:
            self.errors[response.error] += 1
        return response

    async def pair(self, tc_id: int, commit: bool) -> bool:
        created = await self.request(self.client.new_txn(tc_id=tc_id, ttl_ms=TTL_MS))
        if created.error is not None:
            return False
        txn = (created.most, created.least)
        self.ids.append(txn)
        ended = await self.request(self.client.end_txn(*txn, commit=commit))
        if ended.error is None:
            self.decided[txn] = "COMMITTED" if commit else "ABORTED"
        return ended.error is None

    async def worker(self, tc_id: int, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            if not await self.pair(tc_id, commit=n % 2 == 0):
                await asyncio.sleep(0.05)
            n += 1


async def test_requests_fail_typed_during_an_outage_and_service_resumes(tmp_path, standin: StandinOxia):
    server = await start_oxia_server(tmp_path, "tc", standin, "--request-timeout-s", str(REQUEST_TIMEOUT_S))
    client: TcClient | None = None
    try:
        client = await connect("127.0.0.1", server.port)
        for tc_id in range(16):
            assert (await client.tc_client_connect(tc_id)).error is None

        # Under load: 16 workers, one per coordinator.
        before = Load(client)
        stop = asyncio.Event()
        workers = [asyncio.create_task(before.worker(tc_id, stop)) for tc_id in range(16)]

        async def loaded() -> bool:
            return len(before.decided) >= 160

        await async_wait_for(loaded, "160 txns decided before the outage")
        decided_before_stall = len(before.decided)

        async def loaded_again() -> bool:
            return len(before.decided) >= decided_before_stall + 160

        # A stall first: Oxia takes writes but does not answer them. Requests are answered when the
        # request timeout runs out, with a typed error; service goes on once Oxia answers again.
        stop.set()
        await asyncio.gather(*workers)
        standin.hold_writes()
        stalled = Load(client)
        results = await asyncio.gather(*(stalled.pair(tc_id, commit=True) for tc_id in range(16)))
        assert not any(results) and stalled.answered == 16, stalled.errors
        assert set(stalled.errors) == {ServerError.TransactionCoordinatorNotFound}, stalled.errors
        standin.release_writes()

        async def resumed() -> bool:
            return await before.pair(1, commit=False)

        await async_wait_for(resumed, "a txn succeeds once Oxia answers writes again")

        # The outage: every request sent while Oxia is down gets an answer, and it is a typed error.
        stop.clear()
        workers = [asyncio.create_task(before.worker(tc_id, stop)) for tc_id in range(16)]
        await async_wait_for(loaded_again, "txns decided again under load")
        await standin.stop()
        stop.set()
        await asyncio.gather(*workers)
        during = Load(client)
        results = await asyncio.gather(*(during.pair(tc_id, commit=True) for tc_id in range(16) for _ in range(4)))
        assert not any(results), "a txn was decided with Oxia down"
        assert during.answered == 64 and set(during.errors) == {ServerError.TransactionCoordinatorNotFound}, (
            during.errors)

        # Oxia is back on the same port with the same data: service resumes without a restart.
        await standin.start()
        after = Load(client)

        async def serving() -> bool:
            return await after.pair(0, commit=True)

        await async_wait_for(serving, "a txn succeeds after Oxia is back")
        outcomes = await asyncio.gather(*(after.pair(tc_id, commit=tc_id % 2 == 0) for tc_id in range(16)
                                          for _ in range(10)))
        assert all(outcomes), after.errors

        everything = before.ids + stalled.ids + during.ids + after.ids
        assert len(set(everything)) == len(everything), "a txn id was handed out twice"
        for txn, state in {**before.decided, **after.decided}.items():
            status, doc = await get_json(server, f"/admin/v3/transactions/transactionMetadata/{txn[0]}/{txn[1]}")
            assert status == 200 and isinstance(doc, dict) and doc["status"] == state, (txn, state, doc)
    finally:
        if client is not None:
            client.close()
        await asyncio.to_thread(server.stop)


async def test_a_start_while_oxia_is_down_waits_for_it_alive_and_unready(tmp_path) -> None:
    # Before, the start gave up after --request-timeout-s and the process exited with code 2: restarted
    # ever more slowly (a crash loop), and a sidecar's container that is not running takes its broker's pod
    # out of its Service. Now it tries again, /healthz says it lives and /readyz why it is not ready.
    oxia = StandinOxia(shards=3)
    oxia.port = free_port()  # nothing listens there yet
    server = ServerProcess(tmp_path / "data", "--oxia-address", oxia.address, "--request-timeout-s",
                           str(REQUEST_TIMEOUT_S), store="oxia")
    await asyncio.to_thread(server.start, False)

    async def readyz_is(status: int) -> bool:
        try:
            return (await get_json(server, "/readyz"))[0] == status
        except OSError:  # not listening yet
            return False

    try:
        await async_wait_for(lambda: readyz_is(503), "the waiting start's /readyz")

        async def says_unreachable() -> bool:
            return "metadata store unreachable" in str((await get_json(server, "/readyz"))[1])

        await async_wait_for(says_unreachable, "/readyz naming the failed first try")
        assert (await get_json(server, "/healthz"))[0] == 200
        await asyncio.sleep(2 * REQUEST_TIMEOUT_S)  # longer than the start used to wait
        assert server.running(), server.log_tail()
        await oxia.start()
        await async_wait_for(lambda: readyz_is(200), "ready once Oxia is up")
        assert "the metadata store does not answer yet; trying again" in server.log_path.read_text()
    finally:
        await asyncio.to_thread(server.stop)
        await oxia.stop()


async def test_the_admin_port_answers_while_the_first_try_of_a_silent_oxia_waits(tmp_path) -> None:
    # An Oxia that takes connections and answers nothing held the first try for the whole request timeout
    # with no admin port bound: a liveness probe found nothing and restarted the container, again and again.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        server = ServerProcess(tmp_path / "data", "--oxia-address", f"127.0.0.1:{silent.getsockname()[1]}",
                               "--request-timeout-s", "600", store="oxia")
        await asyncio.to_thread(server.start, False)

        async def answers() -> bool:
            try:
                return (await get_json(server, "/healthz"))[0] == 200
            except OSError:  # not listening yet
                return False

        try:
            await async_wait_for(answers, "/healthz while the first try waits")  # before: only after 600 s
            status, body = await get_json(server, "/readyz")
            assert status == 503 and "connecting to" in str(body), body
            # A scrape meanwhile finds an instance that is not ready, not a failed scrape (TcServerDown).
            status, metrics = await asyncio.to_thread(server.get, "/metrics")
            assert status == 200 and "tc_server_ready 0.0" in metrics.decode().splitlines(), metrics
            # And which version waits (a rolling upgrade's progress).
            (build,) = [line for line in metrics.decode().splitlines() if line.startswith("tc_server_build_info{")]
            assert f'version="{__version__}"' in build, build
        finally:
            await asyncio.to_thread(server.stop)


async def test_the_waiting_admin_port_asks_for_credentials_where_the_running_one_does(tmp_path) -> None:
    # --authenticate-metrics-endpoint, and authentication on: while the start waited for Oxia, the admin port
    # served /metrics to anyone (it was built without the authentication service).
    admin_port = free_port()
    settings = Settings(listen="127.0.0.1:0", admin_listen=f"127.0.0.1:{admin_port}", store="oxia",
                        oxia_address=f"127.0.0.1:{free_port()}",  # nothing listens there: the start waits
                        coordinators=4, data_dir=str(tmp_path), authentication_providers="token",
                        token_secret_key=data_url(b"k" * 32), superuser_roles="admin",
                        authenticate_metrics_endpoint=True).validate()
    starting = asyncio.create_task(start_app(settings))

    async def status_of(path: str) -> int | None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", admin_port)
        except OSError:  # not listening yet
            return None
        writer.write(f"GET {path} HTTP/1.1\r\nHost: tc\r\nConnection: close\r\n\r\n".encode())
        status = int((await reader.read()).split(b" ", 2)[1])
        writer.close()
        return status

    async def answers() -> bool:
        return await status_of("/healthz") == 200

    try:
        await async_wait_for(answers, "the waiting admin port")
        assert await status_of("/metrics") == 401
        assert await status_of("/admin/v3/transactions/coordinatorStats") == 401
    finally:
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
