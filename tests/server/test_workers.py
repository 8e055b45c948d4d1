"""``tc-server run --workers 2`` as an operator runs it: a real supervisor process and its two worker
processes (tc_server/bench/process.py, tc_server/supervisor.py), real sockets, real SQLite; clients are
the project's wire client, which finds coordinators as Pulsar's clients do (LOOKUP at the service URL).

Coordinator i is led by worker i mod 2 (tc_server/workers.py), on its own port (--listen's + 1 + i mod 2);
both workers share --listen's port.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tc_server.admin.routes import PREFIX
from tc_server.bench.process import TcServerProcess, descendants_of, free_port, free_ports_in_a_row
from tc_server.client import connect
from tc_server.server.discovery import ASSIGN_TOPIC, PARTITION_SUFFIX
from tc_server.wire import ServerError
from tests.support.oxia_standin import standin_oxia_process
from tests.support.proc_state import alive, parent, state
from tests.support.routed_txns import txns_on_coordinators
from tests.support.server_process import TC_SERVER, started
from tests.workers.helpers import COORDINATORS, WORKERS, header_status, workers_server

pytestmark = pytest.mark.slow

# Bound on waiting for a restarted worker (a cold interpreter start on a loaded 2-core machine).
RESTART_BOUND_S = 60.0


def worker_url(server: TcServerProcess, tc_id: int) -> str:
    return f"pulsar://127.0.0.1:{server.port + 1 + tc_id % WORKERS}"


async def commit_on_every_coordinator(server: TcServerProcess, per_coordinator: int) -> list[tuple[int, int]]:
    tc_ids = [tc_id for tc_id in range(COORDINATORS) for _ in range(per_coordinator)]
    return await txns_on_coordinators(server.port, COORDINATORS, tc_ids)


def killed_and_back(server: TcServerProcess, index: int, pid: int) -> dict[str, Any]:
    """SIGKILL worker ``index`` (process ``pid``) and wait, bounded, until the supervisor's /readyz answers 200
    with another process of it; that answer."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + RESTART_BOUND_S
    while True:
        code, ready = server.get_json("/readyz")
        if code == 200 and ready["workers"][index]["pid"] != pid:
            return cast(dict[str, Any], ready)
        if time.monotonic() > deadline:
            pytest.fail(f"worker {index} not back within {RESTART_BOUND_S:.0f} s: {ready}\n{server.log_tail()}")
        time.sleep(0.2)


async def assert_kept_and_served(server: TcServerProcess, committed: list[tuple[int, int]]) -> None:
    """Every txn of ``committed`` still COMMITTED, and new ids on every coordinator above each it handed out."""
    for most, least in committed:
        assert header_status(server, most, least) == "COMMITTED", (most, least)
    newest = await commit_on_every_coordinator(server, per_coordinator=1)
    for most, least in newest:
        assert least > max(old_least for old_most, old_least in committed if old_most == most)


@pytest.fixture(scope="module")
def oxia_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The STAND-IN Oxia server in its own process (the real one cannot be installed here)."""
    with standin_oxia_process(tmp_path_factory.mktemp("oxia") / "standin.log") as address:
        yield address


@pytest.mark.parametrize("store", ["embedded", "oxia-standin"])
async def test_every_coordinator_is_served_through_the_one_service_url(
        store: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if store == "oxia-standin":
        server = workers_server(tmp_path, "--oxia-address", request.getfixturevalue("oxia_address"), store="oxia")
    else:
        server = workers_server(tmp_path)
    started(server)
    try:
        # The supervisor's /readyz: every worker ready, each leading its own coordinators.
        code, ready = server.get_json("/readyz")
        assert code == 200 and ready["ready"], ready
        assert [w["readyz"]["led"] for w in ready["workers"]] == [[0, 2], [1, 3]]
        assert [w["url"] for w in ready["workers"]] == [worker_url(server, 0), worker_url(server, 1)]

        # Discovery at the service port, whichever worker the kernel handed each connection to.
        for _ in range(6):
            client = await connect("127.0.0.1", server.port)
            assert (await client.partitioned_metadata(ASSIGN_TOPIC)).partitions == COORDINATORS
            for tc_id in range(COORDINATORS):
                answer = await client.lookup(f"{ASSIGN_TOPIC}{PARTITION_SUFFIX}{tc_id}")
                assert answer.error is None and answer.broker_service_url == worker_url(server, tc_id), answer
            watched = await client.watch_assignments(7)
            assert watched.snapshot is not None, watched
            assert {a.tc_id: a.broker_service_url for a in watched.snapshot.assignments} == {
                tc_id: worker_url(server, tc_id) for tc_id in range(COORDINATORS)}
            client.close()

        # Transactions on every coordinator, each at its worker.
        committed = await commit_on_every_coordinator(server, per_coordinator=3)
        assert {most for most, _ in committed} == set(range(COORDINATORS))
        for most, least in committed:
            assert header_status(server, most, least) == "COMMITTED"

        # A worker answers TC_CLIENT_CONNECT only for its own coordinators, naming the other's worker.
        other = await connect("127.0.0.1", server.port + 1 + 1)
        refused = await other.tc_client_connect(0)
        assert refused.error is ServerError.TransactionCoordinatorNotFound
        assert worker_url(server, 0) in (refused.message or "")
        other.close()
    finally:
        assert server.stop() == 0


async def test_the_supervisors_admin_port_serves_every_workers_transactions(tmp_path: Path) -> None:
    """The admin URL an operator configures (--admin-listen, the supervisor's) answered "no such endpoint" to
    every /admin/v3/transactions call. It now forwards a call about one coordinator to the worker that leads
    it, and merges the listings over all coordinators: one page at a time, in txn id order."""
    server = started(workers_server(tmp_path))
    try:
        opened = await txns_on_coordinators(server.port, COORDINATORS, [i % COORDINATORS for i in range(10)],
                                            commit=None)
        code, stats = server.get_json(f"{PREFIX}/coordinatorStats")
        assert code == 200 and list(stats) == ["0", "1", "2", "3"], stats
        assert {tc: (value["state"], value["ongoingTxnSize"]) for tc, value in stats.items()} == {
            "0": ("Ready", 3), "1": ("Ready", 3), "2": ("Ready", 2), "3": ("Ready", 2)}
        for most, least in opened:
            code, meta = server.get_json(f"{PREFIX}/transactionMetadata/{most}/{least}")
            assert code == 200 and meta["status"] == "OPEN", meta

        # slowTransactions over both workers, three a page, following X-Next-After to the end.
        pages: list[list[str]] = []
        after: str | None = None
        while True:
            query = "?limit=3" + (f"&after={urllib.parse.quote(after)}" if after else "")
            with urllib.request.urlopen(f"{server.admin_url}{PREFIX}/slowTransactions/0{query}",  # noqa: S310
                                        timeout=10) as answer:
                pages.append(list(json.load(answer)))
                after = answer.headers.get("X-Next-After")
            if after is None:
                break
        assert [txn for page in pages for txn in page] == [f"({most},{least})" for most, least in sorted(opened)]
        assert [len(page) for page in pages] == [3, 3, 3, 1]

        most, least = next(txn for txn in opened if txn[0] == 3)
        aborting = urllib.request.Request(f"{server.admin_url}{PREFIX}/abortTransaction/{most}/{least}",
                                          data=b"", method="POST")
        with urllib.request.urlopen(aborting, timeout=10) as answer:  # noqa: S310
            assert answer.status == 204
        assert server.get_json(f"{PREFIX}/transactionMetadata/{most}/{least}")[1]["status"] == "ABORTED"

        # A worker's answers pass through as it gives them, errors included.
        code, missing = server.get_json(f"{PREFIX}/transactionMetadata/1/424242")
        assert code == 404 and "(1,424242)" in missing["reason"], missing
        assert server.get_json(f"{PREFIX}/coordinatorStats?coordinatorId=9")[0] == 404
        assert server.get_json(f"{PREFIX}/undelivered") == (200, [])
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("store", ["embedded", "oxia-standin"])
async def test_a_killed_worker_is_restarted_and_its_decisions_stay(store: str, tmp_path: Path,
                                                                   request: pytest.FixtureRequest) -> None:
    if store == "oxia-standin":
        # The killed worker's leader records stay until its Oxia session expires: a short one.
        server = started(workers_server(tmp_path, "--id-block-size", "10", "--oxia-session-timeout-ms", "2000",
                                        "--oxia-address", request.getfixturevalue("oxia_address"), store="oxia"))
    else:
        server = started(workers_server(tmp_path, "--id-block-size", "10"))
    try:
        committed = await commit_on_every_coordinator(server, per_coordinator=5)
        _, ready = server.get_json("/readyz")
        pids = [w["pid"] for w in ready["workers"]]

        ready = killed_and_back(server, 1, pids[1])
        deadline = time.monotonic() + RESTART_BOUND_S
        assert server.running(), "the supervisor itself must survive a worker's kill -9"
        assert ready["workers"][0]["pid"] == pids[0], "the other worker keeps running"
        _, metrics = server.get("/metrics")
        assert 'tc_server_worker_restarts_total{worker="1"} 1.0' in metrics.decode()
        # tc_server_ready (the alert rules read it) follows the supervisor's next poll of the workers.
        while "tc_server_ready 1.0" not in server.get("/metrics")[1].decode().splitlines():
            if time.monotonic() > deadline:
                pytest.fail(f"the supervisor's tc_server_ready not 1 within {RESTART_BOUND_S:.0f} s")
            time.sleep(0.2)
        await assert_kept_and_served(server, committed)
    finally:
        assert server.stop() == 0
    assert not any(alive(pid) for pid in pids), "SIGTERM to the supervisor stops every worker"


async def test_a_killed_supervisor_takes_its_workers_along_and_starts_again(tmp_path: Path) -> None:
    server = started(workers_server(tmp_path))
    try:
        committed = await commit_on_every_coordinator(server, per_coordinator=2)
        _, ready = server.get_json("/readyz")
        pids = [w["pid"] for w in ready["workers"]]
        # SIGKILL to the supervisor, then at once a new one on the same ports and data directory: the
        # kernel killed the old workers with it, so nothing holds the ports or the stores' locks.
        server.restart()
        assert not any(alive(pid) for pid in pids)
        for most, least in committed:
            assert header_status(server, most, least) == "COMMITTED", (most, least)
        assert len(await commit_on_every_coordinator(server, per_coordinator=1)) == COORDINATORS
    finally:
        assert server.stop() == 0


async def test_a_stop_signalled_to_every_process_at_once_is_still_graceful(tmp_path: Path) -> None:
    # systemd's default KillMode=control-group (or a pkill) sends SIGTERM to the supervisor and to each
    # worker; the supervisor then sends its own. A worker takes that second SIGTERM as part of the same
    # stop (the supervisor escalates, not the worker): each still stops gracefully.
    server = started(workers_server(tmp_path))
    assert server.proc is not None
    try:
        committed = await commit_on_every_coordinator(server, per_coordinator=1)
        _, ready = server.get_json("/readyz")
        for pid in [server.proc.pid, *(w["pid"] for w in ready["workers"])]:
            os.kill(pid, signal.SIGTERM)
        assert server.proc.wait(RESTART_BOUND_S) == 0, server.log_tail()
        log = server.log_path.read_text()
        assert "second stop signal" not in log, server.log_tail()
        assert log.count('"event": "stopped"') == WORKERS + 1, server.log_tail()  # each worker, the supervisor
        server.start()
        for most, least in committed:
            assert header_status(server, most, least) == "COMMITTED", (most, least)
    finally:
        assert server.stop() == 0


def test_signals_repeated_until_the_supervisor_has_exited_leave_exit_code_0(tmp_path: Path) -> None:
    # SIGTERM every 30 ms (a pkill in a loop, a key held down): the first stops, the second kills the
    # workers, and those after the stop's end were the default action's, which killed the supervisor by
    # SIGTERM (exit status -15) after a clean stop.
    server = started(workers_server(tmp_path))
    assert server.proc is not None
    try:
        deadline = time.monotonic() + RESTART_BOUND_S
        while server.proc.poll() is None and time.monotonic() < deadline:
            os.kill(server.proc.pid, signal.SIGTERM)
            time.sleep(0.03)
        assert server.proc.wait(RESTART_BOUND_S) == 0, server.log_tail()
    finally:
        server.kill()


# Runs the command after it as a child subreaper (prctl PR_SET_CHILD_SUBREAPER, kept across exec): what a
# container's PID 1 is, without the PID namespace that needs privileges. Orphans below it come to it.
SUBREAPER = "import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); os.execv(sys.argv[1], sys.argv[1:])"


def _zombie_children(pid: int) -> list[int]:
    return [child for child in descendants_of(pid) if state(child) == "Z" and parent(child) == pid]


def test_a_supervisor_that_is_a_subreaper_reaps_what_a_killed_worker_leaves(tmp_path: Path) -> None:
    """A worker killed with -9 leaves its store's writer process, which the kernel hands to the nearest
    subreaper: the supervisor where it is PID 1 (the Docker image) or runs under ``systemd --user`` or
    ``tini -s``. It must not pile up as zombies, one per kill."""
    server = started(TcServerProcess(tmp_path / "data", "--workers", str(WORKERS), "--coordinators",
                                     str(COORDINATORS), command=[sys.executable, "-c", SUBREAPER, TC_SERVER],
                                     log_path=tmp_path / "server.log"))
    try:
        assert server.proc is not None
        for _ in range(2):
            _, ready = server.get_json("/readyz")
            killed = ready["workers"][0]["pid"]
            os.kill(killed, signal.SIGKILL)
            deadline = time.monotonic() + RESTART_BOUND_S
            while True:
                code, ready = server.get_json("/readyz")
                if code == 200 and ready["workers"][0]["pid"] != killed:
                    break
                assert time.monotonic() < deadline, f"worker 0 not back: {ready}\n{server.log_tail()}"
                time.sleep(0.2)
        deadline = time.monotonic() + RESTART_BOUND_S
        while zombies := _zombie_children(server.proc.pid):
            assert time.monotonic() < deadline, f"zombies left under the supervisor: {zombies}"
            time.sleep(0.2)
    finally:
        assert server.stop() == 0


def _run(data_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    port, admin = free_ports_in_a_row(4), free_ports_in_a_row(4)
    return subprocess.run([TC_SERVER, "run", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
                           "--data-dir", str(data_dir), "--coordinators", str(COORDINATORS), *flags],
                          capture_output=True, text=True, timeout=60, check=False)


def test_another_worker_count_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    server = started(workers_server(tmp_path))
    assert server.stop() == 0
    assert (tmp_path / "data" / "workers").read_text().strip() == "2"
    for flags in (["--workers", "3"], []):
        run = _run(tmp_path / "data", *flags)
        assert run.returncode == 2, run.stderr
        line = run.stderr.strip()  # not a TTY: a JSON line (logs.say_refusal)
        assert "\n" not in line and json.loads(line)["event"].startswith("tc-server: refusing to start:"), run.stderr
        line = json.loads(line)["event"]
        assert "--workers 2" in line and f"--workers {flags[1] if flags else 1}" in line, line
    # `tc-server export` of the directory itself would find no store: it names the workers' directories.
    export = subprocess.run([TC_SERVER, "export", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "x")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert export.returncode == 2 and "worker-<k>-of-<N>" in export.stderr, export.stderr
    # A single process's data directory is refused to --workers 2 as well (its coordinators would
    # be looked for in the workers' stores).
    single = started(TcServerProcess(tmp_path / "single", "--coordinators", str(COORDINATORS),
                                     log_path=tmp_path / "single.log"))
    assert single.stop() == 0
    run = _run(tmp_path / "single", "--workers", "2")
    assert run.returncode == 2 and "holds the stores of --workers 1" in run.stderr, run.stderr
    # One worker's store (what `tc-server export --data-dir <data-dir>/worker-0-of-2` reads) is refused to a
    # single process: it led every coordinator there, and the txns it opened on coordinators that worker
    # does not lead were never timed out or delivered once the workers were back.
    for flags in ([], ["--workers", "2"]):
        run = _run(tmp_path / "data" / "worker-0-of-2", *flags)
        assert run.returncode == 2, run.stderr
        assert ("is one worker's store of a --workers 2 data directory" in run.stderr
                and f"start with --workers 2 --data-dir {tmp_path / 'data'}" in run.stderr), run.stderr


def test_a_worker_that_cannot_start_stops_the_supervisor_with_its_error(tmp_path: Path) -> None:
    server = workers_server(tmp_path)
    with socket.socket() as taken:  # worker 1's own port is taken by someone else
        taken.bind(("127.0.0.1", server.port + 2))
        taken.listen()
        server.start(wait=False)
        assert server.proc is not None
        code = server.proc.wait(RESTART_BOUND_S)
    assert code == 2, server.log_tail()
    last = server.log_tail(1).splitlines()[-1]  # a JSON line (--log-format json), as every line before it
    want = ("tc-server: worker 1 of 2 failed to start 3 times in a row: cannot start: address already in use: "
            f"127.0.0.1:{server.port + 2} (worker 1: port + 2 of --listen / TC_SERVER_LISTEN)")
    assert json.loads(last)["event"] == want, server.log_tail()


def test_workers_need_fixed_ports(tmp_path: Path) -> None:
    run = subprocess.run([TC_SERVER, "run", "--workers", "2", "--listen", "127.0.0.1:0",
                          "--admin-listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "data")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2 and "listen: must be a fixed port with --workers" in run.stderr, run.stderr


# Long enough for the supervisor's three quick restart attempts (backoff 0.5, 1, 2 s plus the starts).
PORT_HELD_S = 12.0


async def test_a_worker_that_was_ready_and_cannot_restart_for_a_while_does_not_stop_the_others(
        tmp_path: Path) -> None:
    # A worker that served, crashed, and whose restarts found its own port taken for a while (README: a port in
    # the ephemeral range, taken by an outgoing connection): three quick failed restarts (~4 s) stopped the
    # supervisor and every healthy worker. Only a worker never ready since the start may stop them all.
    server = started(workers_server(tmp_path))
    assert server.proc is not None
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the closed clients' TIME_WAIT
    try:
        await commit_on_every_coordinator(server, per_coordinator=1)
        _, ready = server.get_json("/readyz")
        pids = [w["pid"] for w in ready["workers"]]
        os.kill(pids[1], signal.SIGKILL)  # worker 1 crashes after serving
        # Its port is taken by something else meanwhile (e.g. an outgoing connection's local port).
        deadline = time.monotonic() + 5
        while True:
            try:
                holder.bind(("127.0.0.1", server.port + 2))
                break
            except OSError:
                assert time.monotonic() < deadline, "worker 1's port never became free"
                time.sleep(0.01)
        holder.listen()
        deadline = time.monotonic() + PORT_HELD_S
        while time.monotonic() < deadline and server.running():
            time.sleep(0.2)
        assert server.running(), ("one worker's failed restarts stopped the supervisor and every worker:\n"
                                  + server.log_tail(3))
        assert alive(pids[0]), "healthy worker 0 was stopped"
        holder.close()  # the port is free again: worker 1 comes back
        deadline = time.monotonic() + RESTART_BOUND_S
        while server.status("/readyz") != 200:
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.2)
        assert len(await commit_on_every_coordinator(server, per_coordinator=1)) == COORDINATORS
    finally:
        holder.close()
        if server.running():
            assert server.stop() == 0


async def test_a_restarted_worker_keeps_the_settings_the_supervisor_started_with(tmp_path: Path) -> None:
    # Found by a review: a worker read the configuration file again when it was restarted. Edited meanwhile for the
    # next start (workers = 4 instead of 2), the restarted worker 0 opened an empty store of its own
    # (worker-0-of-4), handed out ids again on coordinators worker 1 leads, and left others without a leader,
    # while the supervisor said ready. It now runs with what the supervisor resolved at its start.
    config = tmp_path / "tc-server.toml"
    config.write_text("workers = 2\nid_block_size = 10\n")
    server = started(TcServerProcess(tmp_path / "data", "--config", str(config), "--coordinators", str(COORDINATORS),
                                     log_path=tmp_path / "server.log", port=free_ports_in_a_row(1 + WORKERS),
                                     admin_port=free_ports_in_a_row(1 + WORKERS)))
    try:
        committed = await commit_on_every_coordinator(server, per_coordinator=3)
        _, ready = server.get_json("/readyz")
        pids = [w["pid"] for w in ready["workers"]]
        config.write_text("workers = 4\nid_block_size = 10\n")  # for the next start
        killed_and_back(server, 0, pids[0])
        assert sorted(p.name for p in (tmp_path / "data").iterdir() if p.name.startswith("worker-")) == [
            "worker-0-of-2", "worker-1-of-2"]
        await assert_kept_and_served(server, committed)
    finally:
        assert server.stop() == 0
