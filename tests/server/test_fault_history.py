"""Jepsen-style history check (docs/architecture.md §10): clients record every operation as ok, failed (with its
error) or unknown (the connection died first) while tc-server is killed with SIGKILL and restarted
again and again on the same embedded store, or while only its store's writer process is killed (tc-server
lives on and starts another). Afterwards the store must agree with the history:

- no txn id was handed out twice, and after each restart every coordinator's new ids are greater;
- every acknowledged commit is COMMITTED and every acknowledged abort ABORTED;
- a commit refused as TransactionNotFound ("aborted", as Pulsar answers it) ended ABORTED (it had timed out);
- every txn whose END_TXN outcome is unknown, or that was left open, ends in one terminal state,
  and stays in it;
- nothing is left OPEN once every deadline has passed.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from dataclasses import dataclass, field

import pytest

from tc_server.bench.process import descendants_of
from tc_server.client import TcClient, connect
from tc_server.wire import ServerError
from tests.support.server_process import ServerProcess
from tests.support.waiting import async_wait_for

pytestmark = pytest.mark.slow

WORKERS = 8
KILLS = 3
MAX_TTL_MS = 3000


@dataclass
class Txn:
    most: int
    least: int
    epoch: int  # how many kills had happened when the id was handed out
    end: str | None = None  # "commit" / "abort" asked, or None (left open)
    outcome: str = "none"  # "ok", "unknown", or the ServerError name


@dataclass
class History:
    txns: list[Txn] = field(default_factory=list)
    unknown_creates: int = 0
    failed_creates: int = 0  # answered TransactionCoordinatorNotFound: the outcome of the write is unknown
    epoch: int = 0


async def worker(port: int, history: History, stop: asyncio.Event, rng: random.Random) -> None:
    client: TcClient | None = None
    while not stop.is_set():
        try:
            if client is None or client.closed.done():
                client = await connect("127.0.0.1", port)
            epoch = history.epoch
            created = await client.new_txn(tc_id=rng.randrange(4), ttl_ms=rng.randrange(300, MAX_TTL_MS))
        except (ConnectionError, OSError):
            history.unknown_creates += 1
            client = None
            await asyncio.sleep(0.05)
            continue
        if created.error is not None:
            assert created.error is ServerError.TransactionCoordinatorNotFound, created
            history.failed_creates += 1
            continue
        txn = Txn(created.most, created.least, epoch)
        history.txns.append(txn)
        txn.end = rng.choice(["commit", "abort", None])
        if txn.end is None:
            continue
        await asyncio.sleep(rng.random() * 0.05)
        try:
            ended = await client.end_txn(txn.most, txn.least, commit=txn.end == "commit")
        except (ConnectionError, OSError):
            txn.outcome = "unknown"
            client = None
            continue
        txn.outcome = "ok" if ended.error is None else ended.error.name
        assert (ended.most, ended.least) == (txn.most, txn.least)
    if client is not None:
        client.close()


async def final_state(server: ServerProcess, txn: Txn) -> str:
    status, doc = server.get_json(f"/admin/v3/transactions/transactionMetadata/{txn.most}/{txn.least}")
    assert status == 200, (txn, doc)
    return str(doc["status"])


async def kill_the_server(server: ServerProcess, history: History) -> None:
    await asyncio.to_thread(server.kill)
    history.epoch += 1
    await asyncio.to_thread(server.start)


async def kill_the_store_writer(server: ServerProcess, history: History) -> None:
    """SIGKILL the embedded store's writer process (tc_server/store/sqlite_writer.py) with writes in flight:
    stopped first, it answers none of the clients' writes made meanwhile. tc-server itself keeps running and
    its next write starts another writer."""
    assert server.proc is not None
    writers = descendants_of(server.proc.pid)
    assert len(writers) == 1, writers
    os.kill(writers[0], signal.SIGSTOP)
    await asyncio.sleep(0.2)  # the workers' next requests reach the stopped writer
    os.kill(writers[0], signal.SIGKILL)
    history.epoch += 1


@pytest.mark.parametrize("kill", [kill_the_server, kill_the_store_writer])
async def test_history_survives_repeated_sigkill(tmp_path, kill):
    server = ServerProcess(tmp_path / "data", "--id-block-size", "20").start()
    history = History()
    stop = asyncio.Event()
    rng = random.Random(20261121)
    workers = [asyncio.create_task(worker(server.port, history, stop, random.Random(rng.random())))
               for _ in range(WORKERS)]
    try:
        for _ in range(KILLS + 1):
            # A second of load, and at least one txn served in this epoch (polled: after a kill, a restart or a new
            # writer process takes seconds on a loaded machine), before the next kill or the end.
            await asyncio.sleep(1.0)
            await async_wait_for(lambda: any(t.epoch == history.epoch for t in history.txns),
                                 f"a txn served after kill {history.epoch}", 60, 0.05)
            if history.epoch < KILLS:
                await kill(server, history)
        stop.set()
        await asyncio.gather(*workers)
        if kill is kill_the_store_writer:
            assert server.running(), "tc-server died with its store's writer"
            status, body = server.get("/metrics")
            assert status == 200
            assert f"tc_server_store_writer_lost_total {float(KILLS)}" in body.decode(), "each kill is counted"

        ids = [(t.most, t.least) for t in history.txns]
        assert len(ids) == len(set(ids)), "a txn id was handed out twice"
        assert len({t.epoch for t in history.txns}) == KILLS + 1, "it served after every kill"
        # A restart is a barrier for every id; a writer killed under a running tc-server is none (a
        # NEW_TXN sent just before the kill may be served after one sent just after it).
        for most in range(4) if kill is kill_the_server else ():
            by_epoch: dict[int, list[int]] = {}
            for t in history.txns:
                if t.most == most:
                    by_epoch.setdefault(t.epoch, []).append(t.least)
            epochs = sorted(by_epoch)
            for earlier, later in zip(epochs, epochs[1:], strict=False):
                assert min(by_epoch[later]) > max(by_epoch[earlier]), (most, earlier, later)

        # Wait until every deadline has passed (plus the abort promptness), then read every txn.
        await asyncio.sleep(MAX_TTL_MS / 1000)
        first: dict[tuple[int, int], str] = {}
        for t in history.txns:
            state = await final_state(server, t)
            # The sweep's aborts of the last deadlines are written after them: polled, not a fixed margin.
            for _ in range(150):
                if state in ("COMMITTED", "ABORTED"):
                    break
                await asyncio.sleep(0.2)
                state = await final_state(server, t)
            first[(t.most, t.least)] = state
            assert state in ("COMMITTED", "ABORTED"), (t, state)
            if t.outcome == "ok":
                assert state == ("COMMITTED" if t.end == "commit" else "ABORTED"), (t, state)
            elif t.outcome == ServerError.TransactionNotFound.name:
                assert t.end == "commit" and state == "ABORTED", (t, state)
            elif t.outcome not in ("unknown", "none"):
                # Only the store being down during a restart may answer otherwise.
                assert t.outcome == ServerError.TransactionCoordinatorNotFound.name, t
        # An unknown outcome may be either, but one, forever: read again after another restart.
        await asyncio.to_thread(server.kill)
        await asyncio.to_thread(server.start)
        for t in history.txns:
            assert await final_state(server, t) == first[(t.most, t.least)], t
        outcomes = {o: sum(t.outcome == o for t in history.txns) for o in {t.outcome for t in history.txns}}
        print(f"{len(history.txns)} txns, outcomes {outcomes}, unknown creates {history.unknown_creates}, "
              f"failed creates {history.failed_creates}")
        assert outcomes.get("ok", 0) > 0
        # The kills hit operations: ones whose answer never came, or (writer killed) came as an unknown outcome.
        assert (outcomes.get("unknown", 0) + history.unknown_creates
                + outcomes.get(ServerError.TransactionCoordinatorNotFound.name, 0) + history.failed_creates) > 0
    finally:
        stop.set()
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        server.stop()
