"""The embedded store's disk filling up or going read-only under a running tc-server (a real tmpfs, a real
read-only bind mount; tests/support/disk.py): requests get a Pulsar error rather than hang, /readyz says so
for as long as it lasts, the service comes back once the disk does, and nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tc_server import health
from tc_server.app import App, start_app
from tc_server.client import connect
from tc_server.config import Settings
from tc_server.store import embedded
from tc_server.wire import ServerError
from tests.support.disk import bind_mounted, fill, remount, tmpfs, writer_pid
from tests.support.proc_state import alive
from tests.support.server_process import ServerProcess

# Small enough to fill at once, large enough for the store's files.
DISK = "6m"
# Where the load goes on once the filler is gone: room to spare then.
ROOMY = "64m"
# The request's bound: a full disk is answered within it.
REQUEST_TIMEOUT_S = "2"


async def load(port: int, seconds: float) -> list[ServerError | None]:
    """NEW_TXN then END_TXN(commit) in a loop for ``seconds``: each request's error (None: success)."""
    errors: list[ServerError | None] = []
    client = await connect("127.0.0.1", port)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    try:
        while loop.time() < deadline:
            created = await asyncio.wait_for(client.new_txn(tc_id=0), 15)  # an answer, not a hang
            errors.append(created.error)
            if created.error is None:
                ended = await asyncio.wait_for(client.end_txn(created.most, created.least, commit=True), 15)
                errors.append(ended.error)
            else:
                await asyncio.sleep(0.05)
    finally:
        client.close()
    return errors


async def readyz(app: App) -> tuple[int, Any]:
    def get() -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{app.admin.port}/readyz", timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    return await asyncio.to_thread(get)


def start(data: Path, log: Path) -> ServerProcess:
    return ServerProcess(data, "--coordinators", "2", "--request-timeout-s", REQUEST_TIMEOUT_S, log_path=log).start()


def kill_writer(server: ServerProcess) -> None:
    assert server.proc is not None
    os.kill(writer_pid(server.proc.pid), signal.SIGKILL)


async def test_a_full_disk_is_answered_and_said_until_space_is_freed(tmp_path: Path) -> None:
    # ROOMY: on DISK, the space the filler gave back was at times taken again by the store's WAL under the
    # load (one run in two), and the disk was full again.
    with tmpfs(tmp_path / "mnt", ROOMY) as mnt:
        server = start(mnt / "data", tmp_path / "tc.log")
        try:
            assert set(await load(server.port, 1.0)) == {None}
            filler = fill(mnt)
            assert set(await load(server.port, 3.0)) <= {None, ServerError.TransactionCoordinatorNotFound}
            code, doc = server.get_json("/readyz")
            assert code == 503 and "disk is full" in str(doc), doc
            filler.unlink()
            assert None in (await load(server.port, 3.0))[-10:]
            # Ready again once a NEW_TXN succeeds after the last failed request (health.py), which the
            # load's last requests may not have been: a few more, until it says so.
            for _ in range(20):
                if server.status("/readyz") == 200:
                    break
                await load(server.port, 0.3)
            assert server.get_json("/readyz")[0] == 200, server.get_json("/readyz")
        finally:
            server.kill()


async def test_an_idle_instance_on_a_full_disk_stays_unready_until_space_is_freed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its failed requests age out of readiness after FRESH_S (health.py), and the store's idle probe, an empty
    # commit, went through on the full disk (one page fits in the WAL file) while every transaction's write
    # failed: /readyz said 200, the instance went back into its Service, and the next client's writes failed.
    # The writer's last group failing now keeps it 503, and the probe writes a record, so that it succeeds
    # once the disk has room again, with no client writing. In-process, so that the two 30 s intervals can
    # be 1 s (the store, its writer process and the disk are the real ones).
    monkeypatch.setattr(health, "FRESH_S", 1.0)
    monkeypatch.setattr(embedded, "IDLE_PROBE_S", 1.0)
    with tmpfs(tmp_path / "mnt", DISK) as mnt:
        app = await start_app(Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", store="embedded",
                                       data_dir=str(mnt / "data"), coordinators=2,
                                       request_timeout_s=float(REQUEST_TIMEOUT_S), log_format="json"))
        try:
            port = app.listeners[0].port
            assert set(await load(port, 0.5)) == {None}
            filler = fill(mnt)
            assert any(error is not None for error in await load(port, 1.5))
            readiness = []
            for _ in range(4):  # idle, past both intervals, each call sending the probe when it is due
                await asyncio.sleep(1.2)
                readiness.append(await readyz(app))
            assert all(code == 503 and "disk is full" in str(doc) for code, doc in readiness), readiness
            assert (await load(port, 0.3))[0] is not None  # and the disk is still full
            filler.unlink()
            for _ in range(8):
                await asyncio.sleep(1.2)
                if (await readyz(app))[0] == 200:
                    break
            assert await readyz(app) == (200, {"ready": True, "led": [0, 1]})
        finally:
            await app.stop()


async def test_a_writer_killed_on_a_full_disk_is_replaced_once_space_is_freed(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt", ROOMY) as mnt:
        server = start(mnt / "data", tmp_path / "tc.log")
        try:
            assert set(await load(server.port, 0.5)) == {None}
            filler = fill(mnt)
            kill_writer(server)
            await load(server.port, 2.0)
            filler.unlink()
            # Within the writer restarts' backoff (capped at 2 s) a new writer serves; loads of 3 s until one
            # succeeds, not a single one: a loaded machine can spend that long before the restart.
            for _ in range(10):
                if None in await load(server.port, 3.0):
                    break
            else:
                pytest.fail("no write succeeded within 30 s of the disk's space being freed")
        finally:
            server.kill()


async def test_a_writer_restarted_on_a_read_only_directory_is_replaced_once_writable(tmp_path: Path) -> None:
    # The writer died while the volume was read-only for a moment. The next one opened the SQLite file
    # read-only (sqlite3.connect falls back to it without a word) and kept failing every group, and since it
    # answered, it was never replaced: once the directory was writable again every write still failed with
    # "attempt to write a readonly database" until tc-server was restarted.
    with tmpfs(tmp_path / "mnt", ROOMY) as mnt:
        data = mnt / "data"
        server = start(data, tmp_path / "tc.log")
        try:
            assert set(await load(server.port, 0.5)) == {None}
            with bind_mounted(data):
                remount(data, read_only=True)
                kill_writer(server)
                assert set(await load(server.port, 2.0)) == {ServerError.TransactionCoordinatorNotFound}
                assert server.status("/readyz") == 503
                remount(data, read_only=False)
                after = await load(server.port, 10.0)
                assert None in after, (sorted({str(error) for error in after}), server.get_json("/readyz"))
                assert server.status("/readyz") == 200
        finally:
            server.kill()


async def test_a_restart_on_a_full_disk_says_so_and_loses_nothing(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "mnt", DISK) as mnt:
        server = start(mnt / "data", tmp_path / "tc.log")
        try:
            client = await connect("127.0.0.1", server.port)
            opened = await client.new_txn(tc_id=1)
            assert (await client.end_txn(1, opened.least, commit=True)).error is None
            client.close()
            assert server.proc is not None
            writer = writer_pid(server.proc.pid)
            server.kill()
            # The killed server's writer process ends on its own, and its last close checkpoints the WAL and
            # deletes it: space that, given back after the fill, let the restart open the store and run (not
            # ready) instead of exit, once in a while under load. Filled once it is gone.
            deadline = time.monotonic() + 30
            while alive(writer):
                assert time.monotonic() < deadline, "the killed server's writer process did not end"
                await asyncio.sleep(0.05)
            filler = fill(mnt)
            server.start(wait=False)
            assert server.proc is not None
            assert server.proc.wait(30) != 0 and "no space left" in server.log_tail(3), server.log_tail(3)
            filler.unlink()
            server.start()
            status, doc = server.get_json(f"/admin/v3/transactions/transactionMetadata/1/{opened.least}")
            assert status == 200 and doc["status"] == "COMMITTED", doc
        finally:
            server.kill()
