"""The supervisor of ``--workers N`` (tc_server/supervisor.py) run in this process over stand-in workers:
real processes and real signals, each a few lines of Python that answer ``/readyz`` on the worker's
admin port, so that restarts and stops can be driven without a tc-server start per worker.
tests/server/test_workers.py runs the real thing."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import json
import os
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
import structlog

from tc_server import supervisor as supervisor_module
from tc_server.auth.certificates import server_tls_context
from tc_server.bench.process import free_ports_in_a_row
from tc_server.cli import build_parser
from tc_server.config import Settings
from tc_server.logs import LinesOrNothing
from tc_server.supervisor import MAX_START_FAILURES, RESTART_INITIAL_S, Supervisor
from tests.security.pki import TestCa
from tests.support.proc_state import alive

# Bound on a stand-in process's run and on waiting for what the supervisor does (interpreter starts on a
# loaded machine); it only keeps a test that fails from hanging.
PROCESS_BOUND_S = 60.0

# A stand-in worker: answers GET (the supervisor's /readyz probe) with 200 on the port argv[1]; argv[2] says
# how it behaves: "serve" runs until a signal ends it, "crash" exits 1 a second after its first answer (a
# crash soon after it got ready), "ignore-sigterm" serves on through SIGTERM, "frozen-child:PATH" too, with a
# child process stopped by SIGSTOP (an embedded store's writer on a stalled disk) whose pid it writes to PATH,
# and "frozen-child-crash:PATH" crashes as "crash" does, leaving such a child behind. "split-lines" and
# "lines" write lines to stderr: the first each in two writes a while apart, the second whole and often;
# "lines-crash" writes three lines, then crashes as "crash" does. "killed-at-start" is SIGKILLed before it
# answers anything (the OOM killer during a start). "escaped-child-crash:PATH" crashes as "crash" does, leaving a
# child in a session of its own (out of reach of the kill of the worker's process group, as a writer stuck in
# the kernel on a dead disk is out of reach of any kill) that holds the worker's stderr; it appends its pid to
# PATH. "escaped-child-refusal:PATH" leaves such a child too, then says why it cannot start and exits 2 before
# it answers anything (a start that fails for good).
STAND_IN_WORKER = """
import os, signal, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer

port, behaviour = int(sys.argv[1]), sys.argv[2]
answered = threading.Event()

class Ready(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
        answered.set()

    def log_message(self, *args):
        pass

if behaviour == "ignore-sigterm" or behaviour.startswith("frozen-child"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if behaviour.startswith("frozen-child"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    os.kill(child.pid, signal.SIGSTOP)
    with open(behaviour.split(":", 1)[1], "w") as pid_file:
        pid_file.write(str(child.pid))
if behaviour.startswith(("escaped-child-crash:", "escaped-child-refusal:")):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    with open(behaviour.split(":", 1)[1], "a") as pid_file:
        pid_file.write(f"{child.pid}\\n")
if behaviour.startswith("escaped-child-refusal:"):
    os.write(2, b"tc-server: cannot start: the stand-in refuses\\n")
    sys.exit(2)
HTTPServer.allow_reuse_address = True
server = HTTPServer(("127.0.0.1", port), Ready)
threading.Thread(target=server.serve_forever, daemon=True).start()
if behaviour == "killed-at-start":
    os.kill(os.getpid(), signal.SIGKILL)
if behaviour == "lines-crash":
    for n in range(3):
        os.write(2, b'{"from": "crashing", "n": ' + str(n).encode() + b"}\\n")
if behaviour in ("crash", "lines-crash") or behaviour.startswith(("frozen-child-crash:", "escaped-child-crash:")):
    answered.wait()
    time.sleep(1)
    sys.exit(1)
if behaviour == "split-lines":
    for n in range(5):
        os.write(2, b'{"from": "split", "n": ')
        time.sleep(0.2)
        os.write(2, str(n).encode() + b"}\\n")
if behaviour == "lines":
    for n in range(50):
        os.write(2, b'{"from": "whole", "n": ' + str(n).encode() + b"}\\n")
        time.sleep(0.03)
while True:
    signal.pause()
"""


class StandInSupervisor(Supervisor):
    """The supervisor, starting the stand-in above as worker k on k's admin port, behaving as
    ``behaviours[k]``."""

    def __init__(self, behaviours: list[str], **settings_given: Any) -> None:
        settings = replace(Settings(), store="memory", workers=len(behaviours),
                           listen=f"127.0.0.1:{free_ports_in_a_row(1 + len(behaviours))}",
                           admin_listen=f"127.0.0.1:{free_ports_in_a_row(1 + len(behaviours))}", **settings_given)
        super().__init__(settings, [])
        self.behaviours = behaviours

    def _command(self, index: int) -> list[str]:
        port = self.workers[index].admin_url.rsplit(":", 1)[1]
        return [sys.executable, "-c", STAND_IN_WORKER, port, self.behaviours[index]]


@pytest.fixture
def logged() -> Iterator[list[dict[str, Any]]]:
    """Every event logged during the test (structlog's capture)."""
    with structlog.testing.capture_logs() as captured:
        yield cast(list[dict[str, Any]], captured)


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait until ``condition()`` holds; a bound that keeps a failing test from hanging, not a timing check."""
    for _ in range(int(PROCESS_BOUND_S / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {PROCESS_BOUND_S:.0f} s: {what}")


async def run_until_stopped(supervisor: Any, condition: Callable[[], bool], what: str) -> int:
    """Run ``supervisor`` until ``condition`` holds (or it ends by itself), then stop it: its exit code."""
    running = asyncio.create_task(supervisor.run())
    try:
        await until(lambda: condition() or running.done(), what)
    finally:
        supervisor.stop()
        code: int = await asyncio.wait_for(running, PROCESS_BOUND_S)
    return code


HELD_STDERR = "a process the worker left holds its stderr open after the worker exited; closing the pipe and going on"


def ignores_sigterm(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGTERM (its SigIgn mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    return bool(ignored & (1 << (signal.SIGTERM - 1)))


def events(logged: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [event for event in logged if event["event"] == name]


def test_a_worker_follows_the_supervisor_that_started_it_whatever_its_pid() -> None:
    """The worker's check of its parent, with the supervisor's pid given as the supervisor gives it.

    The case that failed, a supervisor that is PID 1 (the Docker image's entrypoint), needs a PID
    namespace (``unshare --pid``), which takes privileges CI may not have; so the check is tested here
    with the pid injected: a worker whose given supervisor is its parent keeps running, whatever that pid
    is (it was compared with 1, so under a PID 1 supervisor every worker exited at once), and a worker
    whose given supervisor is not its parent (gone: the worker was left to init or to a subreaper) exits.
    """
    follow = "import sys; from tc_server.supervisor import follow_supervisor; " \
             "follow_supervisor(int(sys.argv[1])); print('following')"
    under_its_supervisor = subprocess.run([sys.executable, "-c", follow, str(os.getpid())],
                                          capture_output=True, text=True, timeout=PROCESS_BOUND_S, check=False)
    assert (under_its_supervisor.returncode, under_its_supervisor.stdout) == (0, "following\n"), \
        under_its_supervisor.stderr
    # This test's own parent: alive, but not the parent of the process started here.
    supervisor_gone = subprocess.run([sys.executable, "-c", follow, str(os.getppid())],
                                     capture_output=True, text=True, timeout=PROCESS_BOUND_S, check=False)
    assert (supervisor_gone.returncode, supervisor_gone.stdout) == (1, ""), supervisor_gone.stderr


async def test_a_worker_whose_process_cannot_be_started_is_tried_again(
        logged: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The first fork fails (EAGAIN: too many processes; ENOMEM, EMFILE alike). Injected: a failing fork
    cannot be had on cue without starving this test process too (RLIMIT_NPROC does not bind root)."""
    start_process = asyncio.create_subprocess_exec
    forks = []

    async def first_fork_fails(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        forks.append(args)
        if len(forks) == 1:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return await start_process(*args, **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", first_fork_fails)
    supervisor = StandInSupervisor(["serve", "serve"])
    assert await run_until_stopped(supervisor, lambda: all(worker.ready for worker in supervisor.workers),
                                   "both workers ready") == 0
    assert [(event["worker"], event["error"]) for event in events(logged, "cannot start a worker process; retrying")] \
        == [(0, "BlockingIOError(11, 'Resource temporarily unavailable')")]


async def test_a_worker_that_crashes_soon_after_it_got_ready_is_restarted_ever_more_slowly(
        logged: list[dict[str, Any]]) -> None:
    supervisor = StandInSupervisor(["crash", "serve"])

    def restarts() -> list[dict[str, Any]]:
        return [event for event in events(logged, "worker exited; restarting") if event["worker"] == 0]

    assert await run_until_stopped(supervisor, lambda: len(restarts()) >= 3, "worker 0 restarted three times") == 0
    assert [event["failed_starts_in_a_row"] for event in restarts()[:3]] == [0, 0, 0]  # it was ready each time
    # The backoff doubles from RESTART_INITIAL_S (each delay cut by up to half at random), as it does for a
    # worker that never gets ready: the third delay is at least twice the first's longest.
    assert restarts()[2]["restart_in_s"] > RESTART_INITIAL_S, restarts()


async def test_workers_that_ignore_sigterm_are_killed_together_after_one_bound(
        logged: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    # One bound for all: waited for one after another, N workers that ignore SIGTERM took N bounds.
    monkeypatch.setattr(supervisor_module, "WORKER_STOP_S", 1.0)
    supervisor = StandInSupervisor(["ignore-sigterm", "ignore-sigterm"])
    assert await run_until_stopped(supervisor, lambda: all(worker.ready for worker in supervisor.workers),
                                   "both workers ready") == 0
    procs = [worker.proc for worker in supervisor.workers]
    assert [proc.returncode if proc else None for proc in procs] == [-signal.SIGKILL] * 2
    assert [event["pids"] for event in events(logged, "workers not stopped within the bound; killing them")] == [
        sorted(proc.pid for proc in procs if proc)]


async def test_a_worker_sigkill_does_not_end_is_given_up_on_within_a_bound(
        logged: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    # After the SIGKILL at the stop's bound the supervisor waited for the worker's exit without one: a worker
    # stuck in the kernel (a thread on a disk that stopped answering) held its exit for as long (a review).
    # SIGKILL that does not end a process is stood in for by a kill that is not sent.
    monkeypatch.setattr(supervisor_module, "WORKER_STOP_S", 1.0)
    monkeypatch.setattr(supervisor_module, "KILLED_EXIT_S", 1.0)
    monkeypatch.setattr(supervisor_module, "kill_worker", lambda proc: None)
    supervisor = StandInSupervisor(["ignore-sigterm"])
    try:
        assert await run_until_stopped(supervisor, lambda: supervisor.workers[0].ready, "the worker ready") == 0
        proc = supervisor.workers[0].proc
        assert proc is not None and proc.returncode is None  # still running: not waited for
        assert [event["pids"] for event in events(logged, "workers still running after SIGKILL (stuck in the kernel, "
                                                  "e.g. on a disk that stopped answering); stopping without them")] \
            == [[proc.pid]]
    finally:
        for worker in supervisor.workers:
            if worker.proc is not None and worker.proc.returncode is None:
                os.killpg(worker.proc.pid, signal.SIGKILL)
                await worker.proc.wait()


def pipes_open() -> int:
    """How many of this process's descriptors are pipes."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the directory's own descriptor, gone once listed
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    return count


async def test_a_restarted_workers_stderr_pipe_is_closed(logged: list[dict[str, Any]]) -> None:
    # uvloop keeps a read pipe's transport open after the end of its data: each restart left the read end of
    # the worker's stderr open until a full garbage collection (a review: 84 restarts, 84 descriptors more).
    # The collector is off for the test, so that only a close frees them.
    before = pipes_open()
    supervisor = StandInSupervisor(["crash"])
    gc.disable()
    try:
        assert await run_until_stopped(
            supervisor, lambda: len(events(logged, "worker exited; restarting")) >= 3, "three restarts") == 0
        assert pipes_open() <= before
    finally:
        gc.enable()


async def test_a_worker_killed_at_the_bound_takes_its_frozen_writer_with_it(
        logged: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Killed alone, the worker left its stopped child (the embedded store's writer) holding the store
    # file's lock: every restart of that worker waited for it.
    monkeypatch.setattr(supervisor_module, "WORKER_STOP_S", 1.0)
    pid_file = tmp_path / "child.pid"
    supervisor = StandInSupervisor([f"frozen-child:{pid_file}"])
    assert await run_until_stopped(supervisor, lambda: pid_file.exists() and supervisor.workers[0].ready,
                                   "the worker ready with its frozen child") == 0
    child = int(pid_file.read_text())
    await until(lambda: not alive(child), f"the worker's frozen child {child} killed")


async def test_a_worker_that_crashed_leaving_a_frozen_writer_is_restarted(logged: list[dict[str, Any]],
                                                                           tmp_path: Path) -> None:
    # The supervisor waited for the crashed worker's stderr to end, which its stopped child held open:
    # no restart, and no stop, until that child ran again.
    pid_file = tmp_path / "child.pid"
    supervisor = StandInSupervisor([f"frozen-child-crash:{pid_file}"])
    running = asyncio.create_task(supervisor.run())
    try:
        await until(pid_file.exists, "the first worker's frozen child started")
        first_child = int(pid_file.read_text())
        await until(lambda: bool(events(logged, "worker exited; restarting")), "the crashed worker restarted")
        await until(lambda: not alive(first_child), f"its frozen child {first_child} killed")
    finally:
        supervisor.stop()
        supervisor.stop()  # the restarted worker ignores SIGTERM
        assert await asyncio.wait_for(running, PROCESS_BOUND_S) == 0
    assert not alive(int(pid_file.read_text()))


@pytest.fixture
def escaped_pids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The file where the "escaped-child-*" stand-ins list their escaped children, which are killed after the
    test; a held stderr is given up 1 s after the worker's exit."""
    monkeypatch.setattr(supervisor_module, "STDERR_AFTER_EXIT_S", 1.0)
    pid_file = tmp_path / "escaped.pids"
    yield pid_file
    for pid in pid_file.read_text().split() if pid_file.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


async def test_a_worker_whose_stderr_a_process_it_left_holds_open_is_restarted_and_stopped(
        logged: list[dict[str, Any]], escaped_pids: Path) -> None:
    # The supervisor read the crashed worker's stderr to its end before restarting it: a process the kill of
    # its group did not end (here one in its own session) held that end, and with it the restart and the stop.
    supervisor = StandInSupervisor([f"escaped-child-crash:{escaped_pids}"])
    assert await run_until_stopped(
        supervisor, lambda: len(events(logged, "worker started")) >= 2, "the crashed worker started again") == 0
    held = events(logged, HELD_STDERR)
    assert held and held[0]["worker"] == 0, held


async def test_a_stop_while_a_process_a_worker_left_holds_its_stderr_ends_within_the_stop_bound(
        logged: list[dict[str, Any]], escaped_pids: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The stop came while the crashed worker's stderr was waited for: that wait's own bound (far above the
    # stop's here) held the stop.
    monkeypatch.setattr(supervisor_module, "STDERR_AFTER_EXIT_S", PROCESS_BOUND_S * 10)
    monkeypatch.setattr(supervisor_module, "WORKER_STOP_S", 1.0)
    supervisor = StandInSupervisor([f"escaped-child-crash:{escaped_pids}"])
    running = asyncio.create_task(supervisor.run())
    await until(lambda: (proc := supervisor.workers[0].proc) is not None and proc.returncode is not None,
                "the worker crashed, its stderr held")
    supervisor.stop()
    assert await asyncio.wait_for(running, PROCESS_BOUND_S) == 0
    assert len(events(logged, HELD_STDERR)) == 1


async def test_a_start_failing_after_one_that_left_a_process_holding_its_stderr_says_so(
        logged: list[dict[str, Any]], escaped_pids: Path) -> None:
    # The failure names the start's own error line, read before the pipe was given up, and the process the
    # starts before it left: what likely holds the store's lock the next start found taken.
    supervisor = StandInSupervisor([f"escaped-child-refusal:{escaped_pids}"])
    code = await asyncio.wait_for(supervisor.run(), PROCESS_BOUND_S)
    assert supervisor.failure is not None and code == 2
    message = supervisor.failure[1]
    assert message.startswith(f"tc-server: worker 0 of 1 failed to start {MAX_START_FAILURES} times in a row: "
                              "cannot start: the stand-in refuses (the start before it left a process"), message
    assert len(events(logged, HELD_STDERR)) == MAX_START_FAILURES


async def test_a_second_stop_kills_a_worker_whose_start_was_under_way(
        logged: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    # Both signals came while its process was being started: the kill of the second went to the workers
    # running then, and the one started next waited out the whole bound.
    monkeypatch.setattr(supervisor_module, "WORKER_STOP_S", PROCESS_BOUND_S * 10)
    start_process = asyncio.create_subprocess_exec
    supervisor = StandInSupervisor(["ignore-sigterm"])

    async def start_after_two_stops(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        await until(lambda: supervisor._kill_asked, "the second stop")
        proc = await start_process(*args, **kwargs)
        await until(lambda: ignores_sigterm(proc.pid), "the stand-in worker ignoring SIGTERM")
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", start_after_two_stops)
    running = asyncio.create_task(supervisor.run())
    await until(lambda: supervisor._spawning > 0, "a start under way")
    supervisor.stop()
    supervisor.stop()
    assert await asyncio.wait_for(running, PROCESS_BOUND_S) == 0
    proc = supervisor.workers[0].proc
    assert proc is not None and proc.returncode == -signal.SIGKILL


async def test_a_worker_started_while_the_supervisor_stops_is_stopped_within_the_bound(
        logged: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    # The stop's SIGTERMs go to the workers running when it begins; one whose start was under way then was
    # sent SIGTERM once started and waited for without a bound: one that ignored it held the supervisor for good.
    monkeypatch.setattr(supervisor_module, "WORKER_STOP_S", 1.0)
    start_process = asyncio.create_subprocess_exec
    supervisor = StandInSupervisor(["ignore-sigterm"])

    async def start_once_stopping(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        await supervisor._stopping.wait()
        proc = await start_process(*args, **kwargs)
        # Started once it ignores SIGTERM (before, the signal ends a Python still starting).
        await until(lambda: ignores_sigterm(proc.pid), "the stand-in worker ignoring SIGTERM")
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", start_once_stopping)
    assert await run_until_stopped(supervisor, lambda: supervisor._spawning > 0, "a start under way") == 0
    proc = supervisor.workers[0].proc
    assert proc is not None and proc.returncode == -signal.SIGKILL
    assert [event["pids"] for event in events(logged, "workers not stopped within the bound; killing them")] == [
        [proc.pid]]


async def test_a_second_stop_kills_the_workers_still_stopping_without_waiting_out_the_bound(
        logged: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    # A second Ctrl-C: the operator does not want to wait for workers whose stop hangs.
    monkeypatch.setattr(supervisor_module, "WORKER_STOP_S", PROCESS_BOUND_S * 10)
    supervisor = StandInSupervisor(["ignore-sigterm", "ignore-sigterm"])
    running = asyncio.create_task(supervisor.run())
    await until(lambda: all(worker.ready for worker in supervisor.workers), "both workers ready")
    supervisor.stop()
    await asyncio.sleep(0.2)  # the SIGTERMs are sent, and ignored
    assert not running.done()
    supervisor.stop()
    assert await asyncio.wait_for(running, PROCESS_BOUND_S) == 0
    procs = [worker.proc for worker in supervisor.workers]
    assert [proc.returncode if proc else None for proc in procs] == [-signal.SIGKILL] * 2
    assert [event["pids"] for event in events(logged, "second stop signal: killing the workers")] == [
        sorted(proc.pid for proc in procs if proc)]


async def test_lines_of_workers_writing_at_once_are_passed_on_whole(capfd: pytest.CaptureFixture[str]) -> None:
    # Worker 0 writes each line in two writes 0.2 s apart, worker 1 whole lines every 30 ms meanwhile.
    supervisor = StandInSupervisor(["split-lines", "lines"])
    passed_on: list[str] = []

    def collect() -> bool:
        passed_on.extend(line for line in capfd.readouterr().err.splitlines() if '"from"' in line)
        return sum('"split"' in line for line in passed_on) >= 5

    assert await run_until_stopped(supervisor, collect, "five split lines passed on") == 0
    assert all(json.loads(line)["from"] in ("split", "whole") for line in passed_on), passed_on
    assert sum('"whole"' in line for line in passed_on) > 5  # they did write in between


async def test_supervision_goes_on_when_its_stderr_breaks(logged: list[dict[str, Any]],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The reader of the supervisor's stderr went away (a log shipper restarted, "| head"): passing a
    # worker's lines on raised BrokenPipeError, which ended that worker's keeper. A worker that crashed
    # was then never restarted, and one whose pipe filled up blocked on its next log line, while the
    # supervisor answered /healthz 200.
    read_end, write_end = os.pipe()
    os.close(read_end)
    broken = os.fdopen(write_end, "w")
    monkeypatch.setattr(sys, "stderr", broken)
    supervisor = StandInSupervisor(["lines-crash", "lines"])

    def restarts() -> list[dict[str, Any]]:
        return [event for event in events(logged, "worker exited; restarting") if event["worker"] == 0]

    try:
        assert await run_until_stopped(supervisor, lambda: len(restarts()) >= 2, "worker 0 restarted twice") == 0
    finally:
        monkeypatch.undo()
        with contextlib.suppress(OSError):
            broken.close()


def test_a_log_line_that_cannot_be_written_is_dropped() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    broken = os.fdopen(write_end, "w")
    stream = LinesOrNothing(broken)
    stream.write("a line nobody reads\n")
    stream.flush()  # dropped, where the stream itself raises:
    with pytest.raises(BrokenPipeError):
        broken.flush()
    with contextlib.suppress(OSError):  # closing flushes what the pipe did not take
        broken.close()


async def test_a_worker_killed_before_it_was_ready_is_not_a_failed_start(logged: list[dict[str, Any]]) -> None:
    # A start fails for good when the worker says why and exits (a port taken, a bad store): three in a row
    # stop the supervisor. A worker killed by a signal (the OOM killer) said nothing: counted alike, three
    # such kills took the healthy workers down too.
    supervisor = StandInSupervisor(["killed-at-start", "serve"])

    def restarts() -> list[dict[str, Any]]:
        return [event for event in events(logged, "worker exited; restarting") if event["worker"] == 0]

    assert await run_until_stopped(supervisor, lambda: len(restarts()) >= 4, "worker 0 restarted 4 times") == 0
    assert supervisor.failure is None
    assert {event["failed_starts_in_a_row"] for event in restarts()} == {0}


async def test_a_supervisor_task_that_fails_stops_the_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    supervisor = StandInSupervisor(["serve"])

    async def failing() -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(supervisor, "_reap_forever", failing)
    assert await asyncio.wait_for(supervisor.run(), PROCESS_BOUND_S) == 1
    assert supervisor.failure is not None and "reaper task ended: RuntimeError('a bug')" in supervisor.failure[1]


def test_the_workers_hidden_option_leaves_superuser_roles_abbreviable() -> None:
    # argparse takes unambiguous abbreviations: the supervisor's pid option, named --supervisor-pid, made
    # "--super admin" ambiguous where it had meant --superuser-roles.

    assert build_parser().parse_args(["run", "--super", "admin"]).superuser_roles == "admin"


async def test_a_worker_whose_admin_port_stopped_answering_is_killed_and_restarted(
        logged: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker hung (a blocked event loop, here SIGSTOP) kept its share of the service port, where the kernel
    # went on handing it new connections that nobody accepted, and nothing restarted it: the supervisor's
    # own /healthz, which liveness probes ask, said 200.
    monkeypatch.setattr(supervisor_module, "WORKER_HUNG_S", 4.0)  # above a poll round (the probe timeout)
    supervisor = StandInSupervisor(["serve", "serve"])
    running = asyncio.create_task(supervisor.run())
    try:
        await until(lambda: all(worker.ready for worker in supervisor.workers), "both workers ready")
        hung = supervisor.workers[1].proc
        assert hung is not None
        os.kill(hung.pid, signal.SIGSTOP)
        await until(lambda: supervisor.workers[1].proc is not hung and supervisor.workers[1].ready,
                    "the hung worker replaced by a ready one")
        assert hung.returncode == -signal.SIGKILL
        assert [event["worker"] for event in events(logged, "worker not answering; killing it")] == [1]
        assert supervisor.workers[0].proc is not None and supervisor.workers[0].proc.returncode is None
    finally:
        supervisor.stop()
        assert await asyncio.wait_for(running, PROCESS_BOUND_S) == 0


def test_the_workers_are_probed_with_the_certificate_of_the_last_reload(tmp_path: Path) -> None:
    # With --admin-tls and --tls-require-trusted-client-cert the supervisor presents the server's own
    # certificate to the workers' admin ports. The context was made once at start: after a rotation (a new
    # CA, or the first certificate expiring) the workers refused every probe, and the supervisor stayed
    # unready for good.
    ca = TestCa(tmp_path)
    issued = ca.issue("localhost", "server", server=True)
    settings = replace(Settings(), admin_tls=True, tls_cert_file=str(issued.cert_file),
                       tls_key_file=str(issued.key_file), tls_trust_certs_file=str(ca.cert_file),
                       tls_require_trusted_client_cert=True)
    supervisor = Supervisor(settings, [])
    supervisor._tls = server_tls_context(settings)
    assert supervisor._tls is not None
    first = supervisor._probe_ssl()
    assert first is not None and supervisor._probe_ssl() is first
    ca.issue("localhost", "server", server=True)  # the same files, a new certificate and key
    assert supervisor._tls.reload_if_changed()
    assert supervisor._probe_ssl() is not first


async def test_the_supervisor_exports_the_expiry_of_the_certificate_its_admin_port_serves(tmp_path: Path) -> None:
    # With --admin-tls the supervisor's admin port serves the workers' certificate, and Prometheus scrapes it as
    # it scrapes a worker's: TlsCertificateExpiringSoon must be able to fire from it too. It exported nothing.
    ca = TestCa(tmp_path)
    issued = ca.issue("localhost", "server", server=True, valid_days=30)
    supervisor = StandInSupervisor(["serve"], admin_tls=True, tls_cert_file=str(issued.cert_file),
                                   tls_key_file=str(issued.key_file))
    running = asyncio.create_task(supervisor.run())
    try:
        context = ssl.create_default_context(cafile=str(ca.cert_file))
        url = f"https://localhost:{supervisor.settings.admin_listen.rsplit(':', 1)[1]}/metrics"
        async with aiohttp.ClientSession() as http:
            for _ in range(int(PROCESS_BOUND_S / 0.05)):  # until the admin port listens
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with http.get(url, ssl=context) as response:
                        exposition = await response.text()
                        break
                await asyncio.sleep(0.05)
        (value,) = [line.split()[1] for line in exposition.splitlines()
                    if line.startswith("tc_server_tls_certificate_expiry_timestamp_seconds ")]
        assert float(value) == issued.certificate.not_valid_after_utc.timestamp()
    finally:
        supervisor.stop()
        await asyncio.wait_for(running, PROCESS_BOUND_S)
