"""What the tests of ``tc-server run --workers N`` share (real processes): the server, a client load on every
coordinator, and the check that no acknowledged commit was lost."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from tc_server.bench.process import TcServerProcess
from tc_server.client import connect
from tc_server.client.connection import Endpoint
from tc_server.server.discovery import ASSIGN_TOPIC, PARTITION_SUFFIX
from tests.support.server_process import started
from tests.support.waiting import async_wait_for

COORDINATORS = 4
WORKERS = 2
BOUND_S = 60.0


def workers_server(base: Path, *extra: str, workers: int = WORKERS, coordinators: int = COORDINATORS,
                   store: str = "embedded") -> TcServerProcess:
    return TcServerProcess(base / "data", "--workers", str(workers), "--coordinators", str(coordinators), *extra,
                           store=store, log_path=base / "server.log")


def worker_pids(server: TcServerProcess) -> list[int]:
    """The workers' pids, as the supervisor's /readyz lists them."""
    _, ready = server.get_json("/readyz")
    return [worker["pid"] for worker in ready["workers"]]


def header_status(server: TcServerProcess, most: int, least: int, workers: int = WORKERS) -> str | None:
    code, body = server.get_json(f"/admin/v3/transactions/transactionMetadata/{most}/{least}", timeout_s=10,
                                 worker=most % workers)
    return body.get("status") if code == 200 else None


def scrape(server: TcServerProcess, worker: int | None = None) -> dict[str, float]:
    """One scrape of the supervisor's /metrics (``worker`` None) or a worker's: series (name{labels}) -> value."""
    code, body = server.get("/metrics", worker=worker)
    assert code == 200, (code, body[:200])
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in body.decode().splitlines() if line and not line.startswith("#")}


@dataclass
class Load:
    """A loop per coordinator: find its worker as a client does (LOOKUP at the service port), then
    NEW_TXN + END_TXN(commit) over and over; every acknowledged commit is recorded with its time. Any
    failure (refused, closed, timed out, an error answer) makes it look the coordinator up again."""

    port: int
    coordinators: int = COORDINATORS
    request_timeout_s: float = 5.0
    committed: dict[int, list[tuple[int, int, float]]] = field(default_factory=dict)
    failures: dict[int, list[str]] = field(default_factory=dict)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        for tc_id in range(self.coordinators):
            self.committed[tc_id] = []
            self.failures[tc_id] = []
            self._tasks.append(asyncio.create_task(self._run(tc_id)))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def since(self, tc_id: int, t: float) -> int:
        return sum(1 for _, _, at in self.committed[tc_id] if at >= t)

    def all_committed(self) -> list[tuple[int, int]]:
        return [(most, least) for each in self.committed.values() for most, least, _ in each]

    async def _run(self, tc_id: int) -> None:
        timeout = self.request_timeout_s
        while not self._stop.is_set():
            client = None
            try:
                service = await asyncio.wait_for(connect("127.0.0.1", self.port), timeout)
                try:
                    answer = await asyncio.wait_for(
                        service.lookup(f"{ASSIGN_TOPIC}{PARTITION_SUFFIX}{tc_id}", authoritative=True), timeout)
                finally:
                    service.close()
                assert answer.error is None and answer.broker_service_url is not None, answer
                endpoint = Endpoint.parse(answer.broker_service_url)
                client = await asyncio.wait_for(connect(endpoint.host, endpoint.port), timeout)
                connected = await asyncio.wait_for(client.tc_client_connect(tc_id), timeout)
                assert connected.error is None, connected
                while not self._stop.is_set():
                    opened = await asyncio.wait_for(client.new_txn(tc_id=tc_id, ttl_ms=600_000), timeout)
                    assert opened.error is None, opened
                    ended = await asyncio.wait_for(client.end_txn(opened.most, opened.least, commit=True), timeout)
                    assert ended.error is None, ended
                    self.committed[tc_id].append((opened.most, opened.least, time.monotonic()))
            except (Exception, AssertionError) as exc:  # noqa: BLE001 - any failure: look it up again
                self.failures[tc_id].append(repr(exc)[:200])
                await asyncio.sleep(0.1)
            finally:
                if client is not None:
                    with contextlib.suppress(Exception):
                        client.close()


def sample_of(load: Load, last: int = 30, spread: int = 30) -> list[tuple[int, int]]:
    """The last ``last`` acknowledged commits of each coordinator (those nearest a kill or a stop) and
    ``spread`` spread over the rest: what is checked after the fact, each one an admin request."""
    picked: list[tuple[int, int]] = []
    for each in load.committed.values():
        ids = [(most, least) for most, least, _ in each]
        step = max(1, len(ids) // spread)
        picked.extend(ids[-last:])
        picked.extend(ids[:-last:step])
    return picked


def not_committed(server: TcServerProcess, ids: list[tuple[int, int]]) -> list[tuple[int, int, str | None]]:
    found = []
    for most, least in ids:
        status = header_status(server, most, least)
        if status != "COMMITTED":
            found.append((most, least, status))
    return found


@contextlib.asynccontextmanager
async def workers_under_load(base: Path, *, commits_first: int,
                             request_timeout_s: float = 5.0) -> AsyncIterator[tuple[TcServerProcess, Load]]:
    """A ``--workers`` server on ``base`` (id blocks of 10: a kill lands inside one) and a Load on every
    coordinator, ``commits_first`` commits each before the block runs. After a block that passed, the load
    stops and every sampled acknowledged commit must be COMMITTED (the server started again if the block
    stopped it); after any block the server is stopped, so no process outlives a failed test."""
    server = started(workers_server(base, "--id-block-size", "10"))
    load = Load(server.port, request_timeout_s=request_timeout_s)
    try:
        load.start()
        try:
            await async_wait_for(lambda: all(len(load.committed[i]) >= commits_first for i in range(COORDINATORS)),
                                 "commits on every coordinator")
            yield server, load
        finally:
            await load.stop()
        if not server.running():
            started(server)
        lost = await asyncio.to_thread(not_committed, server, sample_of(load))
        assert not lost, f"acknowledged commits not COMMITTED: {lost[:10]}"
    finally:
        server.stop()
