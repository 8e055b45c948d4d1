"""The graceful stop (App.stop, README "Operations"): the Pulsar ports refuse new clients first, whatever
holds up the rest; the requests in flight are answered; the admin port cannot hold the stop up. Against an
in-process server on real sockets; a SIGTERM during the start, against a real process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from tc_server import app as app_module
from tc_server.app import start_app
from tc_server.bench.process import TcServerProcess, descendants_of, free_ports_in_a_row
from tc_server.client import connect
from tc_server.config import Settings
from tc_server.wire import ServerError
from tests.support.gated_store import GatedStore
from tests.support.proc_state import alive
from tests.support.server_process import TC_SERVER
from tests.support.waiting import async_wait_for

# Keeps a stop that hangs from hanging the test; a stop takes a fraction of it.
STOP_BOUND_S = 60.0


async def test_new_clients_are_refused_first_and_an_admin_client_does_not_hold_up_the_stop(settings: Settings) -> None:
    app = await start_app(settings)
    pulsar_port = app.listeners[0].port
    # An admin client that announces a body and never sends it: aiohttp keeps its connection open.
    reader, writer = await asyncio.open_connection("127.0.0.1", app.admin.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: tc\r\nContent-Length: 60000\r\n\r\n")
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    stopping = asyncio.create_task(app.stop())
    await asyncio.sleep(0)  # the stop runs up to its first wait
    try:
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", pulsar_port)
    finally:
        await asyncio.wait_for(stopping, STOP_BOUND_S)
        writer.close()


async def test_an_end_txn_waiting_for_its_participants_is_answered_by_the_stop(settings: Settings) -> None:
    # A broker that takes connections and never answers: the decision's delivery never completes.
    delivering = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        delivering.set()
        await reader.read()
        writer.close()

    broker = await asyncio.start_server(silent, "127.0.0.1", 0)
    broker_port = broker.sockets[0].getsockname()[1]
    app = await start_app(replace(settings, upstream_url=f"pulsar://127.0.0.1:{broker_port}", participant_wait_s=600))
    client = await connect("127.0.0.1", app.listeners[0].port)
    try:
        opened = await client.new_txn(tc_id=1, ttl_ms=600_000)
        assert (await client.add_partition(1, opened.least, "persistent://public/default/t")).error is None
        ending = asyncio.create_task(client.end_txn(1, opened.least, commit=True))
        await asyncio.wait_for(delivering.wait(), STOP_BOUND_S)  # decided; its delivery is under way
        assert not ending.done()
        await asyncio.wait_for(app.stop(), STOP_BOUND_S)
        ended = await asyncio.wait_for(ending, STOP_BOUND_S)
        assert ended.error is None, ended  # the decision is durable: answered, not cut off
    finally:
        client.close()
        broker.close()


@pytest.mark.parametrize(("request_timeout_s", "drain_max_s"), [(6.0, None), (60.0, 1.0)],
                         ids=["its-own-deadline", "the-drains-bound"])
async def test_a_request_the_store_holds_is_answered_before_the_stop_closes_it(
        settings: Settings, monkeypatch: pytest.MonkeyPatch, request_timeout_s: float,
        drain_max_s: float | None) -> None:
    # A request timeout above the drain's former fixed bound (5 s): the stop waits for the request's own.
    # One past the drain's bound (DRAIN_MAX_S, 8 s; the default --request-timeout-s is 10 s) was closed
    # unanswered (the client saw the connection drop, not an error to retry on): it is answered at the bound.
    if drain_max_s is not None:
        monkeypatch.setattr(app_module, "DRAIN_MAX_S", drain_max_s)
    store = GatedStore()
    app = await start_app(replace(settings, request_timeout_s=request_timeout_s), store=store)
    client = await connect("127.0.0.1", app.listeners[0].port)
    try:
        store.gate.clear()
        stalled = asyncio.create_task(client.new_txn(tc_id=3, ttl_ms=60_000))
        # until the server holds it
        await async_wait_for(lambda: app.context.in_flight, bound_s=STOP_BOUND_S, step_s=0.01)
        assert app.context.in_flight == 1
        await asyncio.wait_for(app.stop(), STOP_BOUND_S)
        answered = await asyncio.wait_for(stalled, STOP_BOUND_S)
        assert answered.error is ServerError.TransactionCoordinatorNotFound, answered
        assert "--request-timeout-s" in (answered.message or "")
    finally:
        client.close()


async def test_requests_received_but_not_started_are_answered_by_the_stop(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # The connection is at its share of requests in flight (4, half of the server's 8 for a connection alone):
    # four more wait unread in the decoder. Before,
    # the stop closed the connection without a word for them (the Java client then waits out its 30 s
    # operation timeout for each); now they are answered at once, retryably.
    monkeypatch.setattr(app_module, "DRAIN_MAX_S", 1.0)
    store = GatedStore()
    app = await start_app(replace(settings, max_requests_in_flight=8), store=store)
    client = await connect("127.0.0.1", app.listeners[0].port)
    try:
        store.gate.clear()
        requests = [asyncio.ensure_future(client.new_txn(tc_id=i % 4, ttl_ms=60_000)) for i in range(8)]
        # until the server holds its four
        await async_wait_for(lambda: app.context.in_flight == 4, bound_s=STOP_BOUND_S, step_s=0.01)
        # Behind them a lookup and a partition-metadata request: those were closed on without an answer.
        lookup = asyncio.ensure_future(client.lookup("persistent://public/default/orders"))
        metadata = asyncio.ensure_future(client.partitioned_metadata("persistent://public/default/orders"))
        await asyncio.sleep(0.1)  # and the others have arrived
        assert app.context.in_flight == 4
        await asyncio.wait_for(app.stop(), STOP_BOUND_S)
        answers = await asyncio.wait_for(asyncio.gather(*requests, return_exceptions=True), STOP_BOUND_S)
        assert all(not isinstance(a, BaseException) and a.error is ServerError.TransactionCoordinatorNotFound
                   for a in answers), answers
        assert sum("stopping" in (a.message or "") for a in answers if not isinstance(a, BaseException)) == 4
        for other in await asyncio.wait_for(asyncio.gather(lookup, metadata), STOP_BOUND_S):
            assert other.error is ServerError.MetadataError and "stopping" in (other.message or ""), other
    finally:
        store.gate.set()
        client.close()


async def test_the_admin_port_answers_through_the_drain_with_readyz_saying_stopping(settings: Settings) -> None:
    # Before, the admin port closed as the stop began: a liveness probe during a drain (up to DRAIN_MAX_S,
    # then the step-down) found nothing listening, and the drain's metrics were never scraped.
    store = GatedStore()
    app = await start_app(settings, store=store)
    client = await connect("127.0.0.1", app.listeners[0].port)
    admin_port = app.admin.port
    base = f"http://127.0.0.1:{admin_port}"
    try:
        store.gate.clear()
        stalled = asyncio.create_task(client.new_txn(tc_id=3, ttl_ms=60_000))
        # until the server holds it: the drain waits for it
        await async_wait_for(lambda: app.context.in_flight, bound_s=STOP_BOUND_S, step_s=0.01)
        stopping = asyncio.create_task(app.stop())
        await asyncio.sleep(0.1)
        assert not stopping.done()
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/healthz") as healthz:
                assert healthz.status == 200
            async with http.get(base + "/readyz") as readyz:
                assert readyz.status == 503
                assert "stopping" in (await readyz.json())["problems"][0]
            async with http.get(base + "/metrics") as metrics:
                assert metrics.status == 200
                # The gauge the alert rules read says what /readyz says (it said 1 through the drain).
                assert "tc_server_ready 0.0" in (await metrics.text()).splitlines()
        store.gate.set()
        await asyncio.wait_for(stopping, STOP_BOUND_S)
        await asyncio.wait_for(stalled, STOP_BOUND_S)
        with pytest.raises(ConnectionRefusedError):  # and closed once the stop is done
            await asyncio.open_connection("127.0.0.1", admin_port)
    finally:
        client.close()


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT, signal.SIGTERM], ids=lambda sig: sig.name)
def test_a_signal_to_the_whole_process_group_stops_gracefully_with_the_store_writer_alive(
        tmp_path: Path, sig: signal.Signals) -> None:
    # A closing terminal (an ssh session ending) sends SIGHUP to the whole foreground process group, Ctrl-C
    # SIGINT: the embedded store's writer process gets it too. SIGHUP killed tc-server with no stop at all
    # (exit code 129, no drain, Oxia's leader records left to expire); then it killed the writer, which
    # ignored SIGINT and SIGTERM only: the stop's own writes failed (the leader records' deletes, any request
    # in flight answered "outcome unknown") and store_writer_lost fired its alert.
    server = TcServerProcess(tmp_path / "data", store="embedded", log_path=tmp_path / "tc-server.log")
    server.start()  # in a session of its own: its process group is a terminal's job
    assert server.proc is not None
    try:
        os.killpg(server.proc.pid, sig)
        code = server.proc.wait(STOP_BOUND_S)
    finally:
        server.kill()
    assert code == 0, server.log_tail()
    events = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
    assert [e.get("signal") for e in events if e["event"] == "stopping"] == [sig.name], server.log_tail()
    assert [e for e in events if e["event"] in ("store_writer_lost", "could not delete leader record")] == []
    assert events[-1]["event"] == "stopped", server.log_tail()
    assert events[-1]["event"] == "stopped", server.log_tail()


def test_sigterm_during_the_start_ends_it_with_exit_code_0(tmp_path: Path) -> None:
    # An Oxia server that takes connections and never answers: the start waits for its shard assignments.
    with socket.socket() as oxia:
        oxia.bind(("127.0.0.1", 0))
        oxia.listen()
        oxia.settimeout(STOP_BOUND_S)
        server = TcServerProcess(tmp_path / "data", "--oxia-address", f"127.0.0.1:{oxia.getsockname()[1]}",
                                 "--request-timeout-s", "60", store="oxia", log_path=tmp_path / "tc-server.log")
        server.start(wait=False)
        assert server.proc is not None
        try:
            held, _ = oxia.accept()  # it is inside the start, connecting to the store
            server.proc.send_signal(signal.SIGTERM)
            code = server.proc.wait(STOP_BOUND_S)
            held.close()
        finally:
            server.kill()
    assert code == 0, server.log_tail()
    events = [json.loads(line)["event"] for line in server.log_path.read_text().splitlines() if line.startswith("{")]
    assert events[-1] == "stopped during the start", server.log_tail()


async def commit_one(port: int) -> int:
    client = await connect("127.0.0.1", port)
    try:
        opened = await client.new_txn(tc_id=1, ttl_ms=600_000)
        assert (await client.end_txn(1, opened.least, commit=True)).error is None
        return opened.least
    finally:
        client.close()


def log_events(server: TcServerProcess) -> list[str]:
    return [json.loads(line)["event"] for line in server.log_path.read_text().splitlines() if line.startswith("{")]


def test_a_stop_whose_store_writer_is_frozen_still_ends_and_loses_nothing(tmp_path: Path) -> None:
    # The embedded store's writer process stopped (SIGSTOP), as a stalled disk holds it: stepping down (the
    # leader records' deletes) and the store's close wait for it only so long, then the writer is killed.
    server = TcServerProcess(tmp_path / "data", "--coordinators", "2", log_path=tmp_path / "tc-server.log").start()
    assert server.proc is not None
    try:
        least = asyncio.run(commit_one(server.port))
        writers = descendants_of(server.proc.pid)
        assert len(writers) == 1, writers
        os.kill(writers[0], signal.SIGSTOP)
        try:
            server.proc.send_signal(signal.SIGTERM)
            code = server.proc.wait(STOP_BOUND_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(writers[0], signal.SIGCONT)
        assert code == 0, server.log_tail()
        events = log_events(server)
        assert "store_writer_stuck" in events and events[-1] == "stopped", server.log_tail()
        server.start()  # the same data: the file's lock went with the killed writer
        status, doc = server.get_json(f"/admin/v3/transactions/transactionMetadata/1/{least}")
        assert status == 200 and doc["status"] == "COMMITTED", (status, doc)
    finally:
        server.kill()


@contextlib.contextmanager
def a_stop_waiting_on_a_frozen_writer(tmp_path: Path, first: signal.Signals,
                                      second: signal.Signals) -> Iterator[tuple[TcServerProcess, int, int]]:
    """tc-server with one txn committed, its writer process frozen (SIGSTOP) so that a stop waits, sent
    ``first`` and, once it says "stopping", ``second``: (the server, its writer's pid, the txn's least bits).
    Both processes are killed at the end (a failed run must not leave a stopped process behind)."""
    server = TcServerProcess(tmp_path / "data", "--coordinators", "2", log_path=tmp_path / "tc-server.log").start()
    assert server.proc is not None
    writers = descendants_of(server.proc.pid)
    try:
        least = asyncio.run(commit_one(server.port))
        (writer,) = writers
        os.kill(writer, signal.SIGSTOP)
        server.proc.send_signal(first)
        deadline = time.monotonic() + STOP_BOUND_S
        while "stopping" not in log_events(server):
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.05)
        server.proc.send_signal(second)
        yield server, writer, least
    finally:
        server.kill()
        for pid in writers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def assert_committed_after_a_start(server: TcServerProcess, least: int) -> None:
    server.start()
    status, doc = server.get_json(f"/admin/v3/transactions/transactionMetadata/1/{least}")
    assert status == 200 and doc["status"] == "COMMITTED", (status, doc)


def test_a_second_signal_during_a_stop_that_waits_exits_at_once_and_loses_nothing(tmp_path: Path) -> None:
    # The stop waits on a frozen writer (above); the operator presses Ctrl-C again: the process exits then,
    # as from kill -9, with the signal's exit code and a last line that says so.
    with a_stop_waiting_on_a_frozen_writer(tmp_path, signal.SIGTERM, signal.SIGINT) as (server, writer, least):
        assert server.proc is not None
        assert server.proc.wait(STOP_BOUND_S) == 128 + signal.SIGINT, server.log_tail()
        events = log_events(server)
        assert events[-1].startswith("second stop signal") and "stopped" not in events, server.log_tail()
        # The kernel killed the stopped writer with its parent (tc_server/parent_death.py): nothing holds
        # the file's lock. It had stayed, stopped, and the restart found the file in use.
        deadline = time.monotonic() + STOP_BOUND_S
        while alive(writer) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(writer)
        assert_committed_after_a_start(server, least)


def test_a_second_hang_up_during_a_stop_that_waits_does_not_cut_it_short(tmp_path: Path) -> None:
    # The closing terminal's second SIGHUP (below) reaching a stop that waits on its frozen writer: the stop
    # goes on, and ends cleanly once the writer runs again. It had been taken for a second Ctrl-C.
    with a_stop_waiting_on_a_frozen_writer(tmp_path, signal.SIGHUP, signal.SIGHUP) as (server, writer, least):
        assert server.proc is not None
        deadline = time.monotonic() + STOP_BOUND_S
        while "hang-up while stopping: the stop goes on" not in log_events(server):
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.05)
        os.kill(writer, signal.SIGCONT)
        assert server.proc.wait(STOP_BOUND_S) == 0, server.log_tail()
        events = log_events(server)
        assert "second stop signal" not in events and events[-1] == "stopped", server.log_tail()
        assert_committed_after_a_start(server, least)

TERMINAL_BOUND_S = 60.0


def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.parametrize("workers", [1, 2])
def test_closing_the_terminal_of_a_foreground_tc_server_stops_it_gracefully(tmp_path: Path, workers: int) -> None:
    # A closing terminal (a window, an ssh session dropping) sends its foreground job SIGHUP twice: the
    # interactive shell passes its hang-up on to its jobs, and the kernel hangs up the terminal's foreground
    # process group when the shell exits. The second was taken for an operator's second Ctrl-C: the
    # supervisor killed its workers, a single process exited at once, both in the middle of the stop.
    port, admin = free_ports_in_a_row(1 + workers), free_ports_in_a_row(1 + workers)
    log_path, pid_file = tmp_path / "server.log", tmp_path / "supervisor.pid"
    command = (f"sh -c 'echo $$ > {pid_file}; exec {TC_SERVER} run --workers {workers} --coordinators 4 "
               f"--listen 127.0.0.1:{port} --admin-listen 127.0.0.1:{admin} --data-dir {tmp_path / 'data'} "
               f"--log-format json' 2>{log_path}\n")
    shell, terminal = pty.fork()
    if shell == 0:  # an interactive shell on its own terminal, as in a terminal window or an ssh session
        os.execvp("bash", ["bash", "--norc", "--noprofile", "-i"])
    supervisor = None
    try:
        time.sleep(0.5)
        os.write(terminal, command.encode())
        deadline = time.monotonic() + TERMINAL_BOUND_S
        while _log(log_path).count('"event": "started"') < workers:  # every worker is serving
            assert time.monotonic() < deadline, _log(log_path)
            time.sleep(0.2)
        supervisor = int(pid_file.read_text())
        os.close(terminal)  # the terminal window closes / the ssh connection drops
        terminal = -1
        os.waitpid(shell, 0)
        while alive(supervisor):
            assert time.monotonic() < deadline, _log(log_path)
            time.sleep(0.2)
        log = _log(log_path)
        # The two hang-ups come microseconds apart: the kernel may merge them into one delivery (a signal
        # already pending is not queued twice), so "hang-up while stopping" is not always logged here; the
        # test above sends the second one into a stop that waits.
        assert "second stop signal" not in log, log[-3000:]
        # Each worker and the supervisor finished their stop.
        assert log.count('"event": "stopped"') == (1 if workers == 1 else 1 + workers), log[-3000:]
    finally:
        if terminal >= 0:
            os.close(terminal)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(shell, 0)
        if supervisor is not None and alive(supervisor):
            os.kill(supervisor, signal.SIGKILL)  # its workers follow it (PR_SET_PDEATHSIG)
