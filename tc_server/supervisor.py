"""``tc-server run --workers N``: the process started supervises N worker processes of itself.

Each worker is ``tc-server run`` with the same flags and environment plus the hidden ``--worker-index k`` and
``--worker-supervisor-pid`` (follow_supervisor), and runs with the settings the supervisor resolved at its start,
handed over on its stdin (a worker restarted later too, whatever the configuration file says by then); it
serves coordinators i with i mod N = k on its own port and shares the service port with the others
(tc_server/workers.py). The supervisor

* restarts a worker that exits, or whose process could not be started (the fork failed), after a backoff
  (tc_server/backoff.py) that starts again from its shortest only once a worker stayed up STABLE_S, and
  logs it; a worker that exits MAX_START_FAILURES times in a row before it was ever ready stops
  everything: the supervisor ends with that worker's one-line error (logs.say_refusal) and exits non-zero
  (a port taken, a bad store: retrying will not help);
* stops every worker with SIGTERM on SIGTERM/SIGINT/SIGHUP (each drains as a single process does), and
  SIGKILLs those still running WORKER_STOP_S later (and stops without one SIGKILL did not end KILLED_EXIT_S
  after, stuck in the kernel, saying so);
* reaps the exited children it did not start (a killed worker's store writer, handed to the supervisor
  when it is PID 1 or a subreaper);
* serves ``--admin-listen``: ``/healthz`` (the supervisor runs), ``/readyz`` (200 only when every
  worker's own ``/readyz`` said 200 at the last poll: the body lists each worker and its problems) and ``/metrics``
  (the supervisor's own series: worker readiness and restarts), and ``/admin/v3/transactions``, each
  request forwarded to the worker that leads the coordinator it names, a listing over all of them merged
  from every worker's (tc_server/admin/workers_front.py). Each worker's series, and its own transactions
  API over its own coordinators, are on the worker's admin port (``--admin-listen``'s port + 1 + k):
  Prometheus scrapes each, so no series is summed or hidden here.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import ssl
import sys
from collections.abc import Container
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from tc_server.admin.http import AdminServer
from tc_server.admin.routes import READY_PROBE_TIMEOUT_S, metrics_response
from tc_server.admin.workers_front import WorkerCertificates, WorkersAdmin
from tc_server.auth.certificates import ServerTlsContext, server_tls_context
from tc_server.auth.service import AuthenticationService, provider_methods
from tc_server.backoff import Backoff
from tc_server.config import Settings, parse_hostport, settings_to_json
from tc_server.healthcheck import admin_probe_tls_context
from tc_server.logs import REFUSAL_PREFIX, LinesOrNothing, refusal_in, resolved_format, say_refusal
from tc_server.metrics import build_info, process_series, ready_gauge, tls_certificate_expiry
from tc_server.parent_death import die_with_parent, parent_gone
from tc_server.store import STORE_KINDS
from tc_server.workers import worker_admin_url, worker_main_url

log = structlog.get_logger("tc_server.supervisor")

# A worker that exits this many times in a row without ever getting ready stops the supervisor.
MAX_START_FAILURES = 3
# First restart after half a second (a kill -9 is back at once), at most one every 10 s.
RESTART_INITIAL_S = 0.5
RESTART_MAX_S = 10.0
# A worker that stayed up this long after it got ready is restarted after the shortest backoff again. Not
# as soon as it was ready: one that crashes a second later each time would be restarted twice a second.
STABLE_S = 30.0
# How often each worker's /readyz is asked (readiness tracking, the restart-failure count, metrics).
POLL_INTERVAL_S = 0.5
# How often exited children that are not workers are looked for (Supervisor._reap_adopted).
REAP_INTERVAL_S = 1.0
# A worker's /readyz waits up to READY_PROBE_TIMEOUT_S for its store before it answers 503: asked for less than
# that, a worker whose store hangs (a network partition from Oxia) never answered in time, and was killed as
# hung although its admin port answered.
PROBE_TIMEOUT_S = READY_PROBE_TIMEOUT_S + 1.5
# Connections to each worker's admin port at once, each kind from its own pool (more wait for one): the poll's
# probe (one at a time: what readiness and the hung check read) and the forwarded admin requests
# (workers_front.py). Together under the worker's limit per client address (admin/http.py
# MAX_CONNECTIONS_PER_ADDRESS, 32: both come from the loopback address). In one pool, admin requests took
# every connection and the probes were refused, so a healthy worker looked silent and was killed as hung.
FORWARD_CONNECTIONS_PER_WORKER = 16
# A worker that was ready and whose admin port then answered nothing for this long is taken for hung (a
# blocked event loop, a deadlock) and killed, so that it is restarted: it still holds its share of the
# service port, where the kernel keeps handing it connections nobody accepts. A worker that answers
# 503 (its store is down) answers: it is not hung. Well above PROBE_TIMEOUT_S: a poll round lasts as long
# as its slowest probe, so an answering worker's last answer can be that old when it is looked at.
WORKER_HUNG_S = 30.0
# A worker not ready yet whose admin port has answered nothing this long (since it last answered, or since it was
# started) is taken for hung as well (its start blocked: a store file on a disk that stopped answering, a
# deadlock): it stayed unready for good, and the supervisor's /healthz, which says only that the supervisor
# runs, got no container restarted. Longer than WORKER_HUNG_S: on the embedded store the admin port binds only
# once the store is open and the coordinators have recovered (50,000 open txns take about 2 s; a machine
# swapping, many times that). On Oxia the port answers (503) from the start (app.OpenedStore).
WORKER_START_SILENT_S = 60.0
# A worker's stop on SIGTERM waits up to 1 s for its admin port (admin/http.py SHUTDOWN_TIMEOUT_S), then up
# to --request-timeout-s (10 s by default) + 0.5 s for the answers to requests in flight (app.py
# DRAIN_MARGIN_S); the launcher's stop bound is 15 s (tc_server/bench/process.py).
WORKER_STOP_S = 12.0
# A worker still running this long after the SIGKILL at that bound is given up on (a thread of it stuck in the
# kernel, on a disk that stopped answering): the stop goes on without it and says so, where it waited for good.
KILLED_EXIT_S = 5.0
# How often a worker's exit is looked for (exit_code): the delay before a restart begins, or a stop ends.
EXIT_POLL_S = 0.1
# A worker's stderr is passed on in chunks of this size; the last STDERR_TAIL bytes hold its error line.
STDERR_CHUNK = 65536
STDERR_TAIL = 8192
# How long a worker's stderr may stay open after its exit and the kill of its process group before its read end
# is closed and its restart goes on (Supervisor._stderr_ended): longer than a slow disk's fsync, which a killed
# writer finishes before it dies (closed sooner, the restart found the store's lock still held). Lines written
# before the exit are read by then: the pipe holds them. While the supervisor stops: at most until the stop's
# bound (WORKER_STOP_S from its start), or STDERR_AT_STOP_S if that has passed.
STDERR_AFTER_EXIT_S = 10.0
STDERR_AT_STOP_S = 1.0
# What /readyz says of a worker whose process is not running.
NOT_RUNNING = "not running (being restarted)"


def follow_supervisor(supervisor_pid: int | None, log_format: str = "auto") -> None:
    """In a worker: be killed (SIGKILL) when the supervisor dies, by whatever means, so no worker outlives
    it holding the ports and the store locks; exit at once if it is already gone (Linux prctl). SIGKILL,
    not SIGTERM: a supervisor started again at once (systemd, Kubernetes) must find the ports and the
    stores free, not held by workers still draining; a kill loses nothing acknowledged (the embedded store
    fsyncs before it answers), as a single process's kill -9.

    ``supervisor_pid``: the supervisor's own pid (it passes ``--worker-supervisor-pid``). A parent with another pid
    means the supervisor is gone and this process was handed to init or to a subreaper. Compared with that
    pid, not with 1: a supervisor that is a container's first process (the Docker image's entrypoint) is
    PID 1 itself. None (a worker started by hand, without it): init as the parent means the supervisor
    is gone, as before that option; the process says so instead of exiting without a word."""
    die_with_parent()
    if parent_gone(supervisor_pid):
        say_refusal(f"tc-server: worker: its supervisor (pid {supervisor_pid or 'unknown'}) is gone (parent pid "
                    f"{os.getppid()}); exiting", log_format)
        sys.exit(1)


async def exit_code(proc: asyncio.subprocess.Process, given_up: Container[int] = ()) -> int | None:
    """``proc``'s exit code, once it has exited; None once its pid is in ``given_up`` first (a worker SIGKILL
    did not end: Supervisor._stop_processes). Not ``Process.wait()``: on Python 3.11 a wait begun before
    the exit returns only once the process's pipes are closed too, and a process the worker left behind
    (its store's writer, stopped or stalled on a disk) holds its stderr open. ``returncode`` is set at
    the exit itself (the child watcher reaps it): looked at every EXIT_POLL_S."""
    while proc.returncode is None:  # noqa: ASYNC110 - Process offers no event for the exit alone
        if proc.pid in given_up:
            return None
        await asyncio.sleep(EXIT_POLL_S)
    return proc.returncode


def _pass_on(data: bytes) -> None:
    """Write a worker's lines to our stderr; dropped when that fails (logs.LinesOrNothing): the workers'
    pipes are read on regardless, or a worker would block on its next log line."""
    stderr = LinesOrNothing(sys.stderr.buffer)
    stderr.write(data)
    stderr.flush()


def kill_worker(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL to a worker's process group: the worker (if it still runs) and what it started, its embedded
    store's writer among them. Killed alone, a worker left a writer that was stopped (SIGSTOP) or stalled
    on a disk holding the store file's lock and the worker's stderr pipe. The worker leads the group (its
    own session), and Linux does not reuse a pid while a group of that id has members, so this reaches
    nothing else; a group already empty is ESRCH."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def children() -> set[int]:
    """The pids of this process's children (Linux: a child is listed under the thread that is its parent,
    /proc/self/task/<tid>/children)."""
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError, ValueError):  # a thread that ended meanwhile
            found.update(int(pid) for pid in (task / "children").read_text().split())
    return found


@dataclass
class _Worker:
    index: int
    url: str
    admin_url: str
    proc: asyncio.subprocess.Process | None = None
    ready: bool = False  # its /readyz said 200 at the last poll
    readyz: object = "not asked yet"  # what its /readyz answered at the last poll, or why it did not answer
    ready_at: float | None = None  # when its /readyz first said 200 since it was started (loop time)
    answered_at: float | None = None  # when its admin port last answered /readyz at all (loop time)
    started_at: float | None = None  # when its process was started (loop time)
    start_failures: int = 0  # exits in a row before getting ready
    # Ready once since the supervisor started: its settings work, so failed restarts (its port taken for a
    # while, a disk full) are retried for good rather than stopping every worker (MAX_START_FAILURES).
    was_ready: bool = False
    last_error: str = ""  # its last "tc-server: ..." line (logs.say_refusal)
    # An exit since it was last ready left a process that SIGKILL did not end holding its stderr
    # (Supervisor._stderr_ended): the likely holder of its store's lock too, which the failure of a start that
    # follows names.
    left_a_holder: bool = False


@dataclass
class _Stderr:
    """The read end of a worker's stderr pipe, made and owned here (not asyncio's ``PIPE``) so that it can be
    closed while a process the worker left still holds the write end (Supervisor._stderr_ended)."""

    reader: asyncio.StreamReader
    transport: asyncio.ReadTransport
    tail: bytearray  # the last STDERR_TAIL bytes passed on: where its last error line is looked for

    def pass_on(self, lines: bytes) -> None:
        """Write whole ``lines`` of the worker's to our stderr, keeping the tail."""
        _pass_on(lines)
        self.tail += lines
        del self.tail[:-STDERR_TAIL]


class Supervisor:
    def __init__(self, settings: Settings, run_argv: list[str]) -> None:
        self.settings = settings
        self._argv = run_argv
        # What every worker runs with, restarted ones too (tc_server/cli.py _start): these settings, whatever
        # the configuration file says by then.
        self._settings_json = settings_to_json(replace(settings, log_format=resolved_format(settings.log_format)))
        self.workers = [_Worker(k, worker_main_url(settings, k), worker_admin_url(settings, k))
                        for k in range(settings.workers)]
        self._stopping = asyncio.Event()
        self._spawning = 0  # worker processes being started: forked, maybe not in self.workers yet
        self.failure: tuple[int, str] | None = None  # (exit code, message) that stopped everything
        self._stop_asked = False  # stop() was called (a signal): a second call kills the workers
        self._kill_asked = False  # that second call came: a worker started from now on is killed at once
        self._stop_deadline: float | None = None  # loop time by which every worker has stopped or is killed
        self._given_up: set[int] = set()  # pids of workers still running KILLED_EXIT_S after their SIGKILL
        self._registry = CollectorRegistry()
        self._up = Gauge("tc_server_worker_ready", "1 when the worker's /readyz said 200 at the last check",
                         ["worker"], registry=self._registry)
        self._restarts = Counter("tc_server_worker_restarts", "worker processes restarted after they exited",
                                 ["worker"], registry=self._registry)
        for worker in self.workers:
            self._up.labels(str(worker.index)).set(0)
            self._restarts.labels(str(worker.index))
        # As a single process's: /readyz's answer, here every worker ready at the last poll (set at scrape).
        self._ready = ready_gauge(self._registry)
        build_info(self._registry)
        process_series(self._registry)
        self._certificate_expiry = tls_certificate_expiry(self._registry)  # read once --admin-tls has its files
        # The connection pools to the workers' admin ports (FORWARD_CONNECTIONS_PER_WORKER), made by run().
        self._polling: aiohttp.ClientSession | None = None
        self._forwarding: aiohttp.ClientSession | None = None
        # --admin-tls: the server's certificate files (reloaded when they change), and the context the
        # workers' /readyz is asked with, made again after each reload (with a required client
        # certificate it presents the server's own, which a rotation replaces before it expires).
        self._tls: ServerTlsContext | None = None
        self._probe_context: tuple[int, ssl.SSLContext | None] | None = None
        # /admin/v3/transactions on the supervisor's admin port, forwarded to the workers (workers_front.py).
        self._transactions = WorkersAdmin([worker.admin_url for worker in self.workers], settings.coordinators,
                                          self._session, WorkerCertificates(settings) if settings.admin_tls else None,
                                          credentials_checked=bool(provider_methods(settings.authentication_providers)),
                                          shared_store=STORE_KINDS[settings.store].needs_server)

    def _begin_stop(self) -> None:
        """Stop everything (once): the workers are stopped within WORKER_STOP_S from now (_stop_processes)."""
        if not self._stopping.is_set():
            self._stop_deadline = asyncio.get_running_loop().time() + WORKER_STOP_S
            self._stopping.set()

    def stop(self, sig: signal.Signals | None = None) -> None:
        """The first call (SIGTERM, SIGINT, SIGHUP) stops the workers gracefully; a second one, while they
        still stop, kills them (what a second Ctrl-C means; a kill loses nothing acknowledged), and the
        supervisor ends as soon as they are gone. Not a second SIGHUP: a closing terminal sends its
        foreground job two (the shell passes its own on, and the kernel hangs up the process group)."""
        if not self._stop_asked:
            self._stop_asked = True
            log.info("stopping", signal=sig.name if sig is not None else None)
            self._begin_stop()
            return
        if sig is signal.SIGHUP:
            log.info("hang-up while stopping: the stop goes on")
            return
        self._kill_asked = True
        running = [w.proc for w in self.workers if w.proc is not None and w.proc.returncode is None]
        if running:
            log.warning("second stop signal: killing the workers", pids=sorted(proc.pid for proc in running))
        for proc in running:
            kill_worker(proc)

    # -- workers ------------------------------------------------------------------------------------

    def _command(self, index: int) -> list[str]:
        # The log format the supervisor resolved: a worker's stderr is a pipe, where "auto" means JSON,
        # and its lines came out as JSON among the supervisor's console lines on a terminal.
        return [sys.executable, "-m", "tc_server.cli", *self._argv, "--log-format",
                resolved_format(self.settings.log_format), "--worker-index", str(index),
                "--worker-supervisor-pid", str(os.getpid()), "--worker-settings-on-stdin"]

    @staticmethod
    async def _forward_stderr(pipe: _Stderr) -> None:
        """Pass a worker's output on to our stderr as it comes, whole lines at a time: a line that
        arrives in pieces is held until its end, so that another worker's line cannot land inside it
        (two JSON log lines glued into one, seen at a stop when every worker logs at once). A line
        longer than STDERR_CHUNK passes in pieces. The pipe is closed when this ends: uvloop keeps a pipe's
        transport open after the end of the data (StreamReaderProtocol asks it to), and each restart left a
        descriptor open until a full garbage collection (a review: 84 restarts, 84 descriptors more)."""
        held = b""
        try:
            while chunk := await pipe.reader.read(STDERR_CHUNK):
                data = held + chunk
                end = data.rfind(b"\n") + 1 or (len(data) if len(data) >= STDERR_CHUNK else 0)
                held = data[end:]
                if end:
                    pipe.pass_on(data[:end])
        finally:
            pipe.transport.close()
            # Its last line, without an end: a worker killed as it wrote, or the pipe given up (_stderr_ended).
            if held:
                pipe.pass_on(held + b"\n")

    async def _start_process(self, worker: _Worker) -> _Stderr:
        """Start ``worker``'s process (``worker.proc``, from then on) and return the read end of its stderr.
        Raises OSError when it cannot be started (fork or exec failed, no file descriptor left for the pipe)."""
        read_end, write_end = os.pipe()
        # Counted until the process is worker.proc: the reaper (_reap_adopted) takes any other child for one
        # the kernel handed it, and would take the exit status of a worker that died at once.
        self._spawning += 1
        try:
            try:
                # Its own session: a terminal's Ctrl-C reaches the supervisor only, which stops the workers
                # in order (a worker that stopped on its own would look like one to restart).
                proc = await asyncio.create_subprocess_exec(
                    *self._command(worker.index), stdin=asyncio.subprocess.PIPE, stderr=write_end,
                    start_new_session=True)
            except BaseException:
                os.close(read_end)
                raise
            finally:
                os.close(write_end)  # the worker's now, and what it starts inherits it
            worker.proc, worker.started_at = proc, asyncio.get_running_loop().time()
        finally:
            self._spawning -= 1
        try:
            reader = asyncio.StreamReader(limit=STDERR_CHUNK)
            transport, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_end, "rb", buffering=0))
        except BaseException:
            # Its stderr cannot be read (the read end is closed by now): a worker nobody hears is not kept.
            kill_worker(proc)
            raise
        assert proc.stdin is not None
        # A few KB: the pipe takes them at once, and the worker reads them before anything else.
        try:
            proc.stdin.write(self._settings_json)
        except OSError:
            pass  # it died at once: its exit is seen as any other's
        finally:
            proc.stdin.close()
        return _Stderr(reader, transport, bytearray())

    async def _keep_running(self, worker: _Worker) -> None:
        backoff = Backoff(RESTART_INITIAL_S, RESTART_MAX_S)
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            worker.ready, worker.ready_at, worker.answered_at = False, None, None
            worker.last_error = ""  # this start's, not an earlier one's
            try:
                pipe = await self._start_process(worker)
            except OSError as exc:
                # fork or exec failed (EAGAIN, ENOMEM, EMFILE: the machine, not the worker): no worker ran,
                # so no start failure is counted, and a later try may work.
                delay = backoff.next_delay()
                log.warning("cannot start a worker process; retrying", worker=worker.index, error=repr(exc),
                            retry_in_s=round(delay, 2))
                await self._pause(delay)
                continue
            assert worker.proc is not None
            log.info("worker started", worker=worker.index, pid=worker.proc.pid, url=worker.url)
            forwarding = asyncio.create_task(self._forward_stderr(pipe))
            if self._kill_asked:  # a second stop signal came while it was being started
                kill_worker(worker.proc)
            elif self._stopping.is_set():
                # Stopped while it was being started: _stop_workers did not see it, so it gets the same
                # bounded stop here (unbounded, a worker stuck in its start held the supervisor's exit).
                await self._stop_processes([worker.proc])
            code = await exit_code(worker.proc, self._given_up)
            if code is None:  # SIGKILL did not end it (_stop_processes, which said so): the stop goes on
                forwarding.cancel()
                await asyncio.wait({forwarding})  # its held line passed on and the pipe closed (_forward_stderr)
                return
            # What the worker started and left behind goes with it: a writer that was stopped or stalls
            # on a disk would hold the stderr pipe and the store's lock for the restart. A kill loses
            # nothing acknowledged: the writer answered only what it had committed.
            kill_worker(worker.proc)
            held_before = worker.left_a_holder
            if not await self._stderr_ended(worker, forwarding, pipe):
                worker.left_a_holder = True
            errors = [text for line in bytes(pipe.tail).splitlines() if (text := refusal_in(line)) is not None]
            if errors:
                worker.last_error = errors[-1]
            worker.ready, worker.readyz = False, "not asked yet since its restart"
            self._up.labels(str(worker.index)).set(0)
            if self._stopping.is_set():
                return
            if worker.ready_at is None:
                # Ended by itself (an error line and exit code 2 for a setting, a bug): a start that
                # retrying will not mend. Killed by a signal (the OOM killer, an operator) it was not, unless
                # the signal was ours for a start that stayed silent: repeated, that start loops for good, each
                # kill undoing its work (an embedded store's open taking longer than WORKER_START_SILENT_S), and
                # said nothing but the kills (a review). _kill_if_hung marks its kill by started_at None.
                if code >= 0 or worker.started_at is None:
                    worker.start_failures += 1
            else:
                worker.start_failures = 0
                if loop.time() - worker.ready_at >= STABLE_S:
                    backoff.reset()
            if worker.start_failures >= MAX_START_FAILURES and not worker.was_ready:
                error = worker.last_error.removeprefix(REFUSAL_PREFIX) or f"exit code {code}"
                if held_before:
                    error += (" (the start before it left a process that SIGKILL did not end, stuck in the kernel "
                              "on a disk that stopped answering or out of the worker's process group: it held the "
                              "worker's stderr, and may hold its store's lock)")
                self.failure = (code if code > 0 else 1,
                                f"tc-server: worker {worker.index} of {len(self.workers)} failed to start "
                                f"{worker.start_failures} times in a row: {error}")
                self._begin_stop()
                return
            delay = backoff.next_delay()
            log.warning("worker exited; restarting", worker=worker.index, exit_code=code, pid=worker.proc.pid,
                        restart_in_s=round(delay, 2), failed_starts_in_a_row=worker.start_failures)
            self._restarts.labels(str(worker.index)).inc()
            await self._pause(delay)

    async def _pause(self, delay_s: float) -> None:
        """Wait ``delay_s`` before the next start, or until the supervisor stops."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay_s)

    async def _stderr_ended(self, worker: _Worker, forwarding: asyncio.Task[None], pipe: _Stderr) -> bool:
        """Wait for the end of a worker's stderr after its exit and the kill of its process group; whether it
        ended. A process the kill did not end (stuck in the kernel on a disk that stopped answering; one that
        left the group) holds the pipe open: waited for without a bound, it held the worker's restart, and the
        supervisor's stop, for as long. So after STDERR_AFTER_EXIT_S (once the supervisor stops: by the stop's
        bound, or STDERR_AT_STOP_S if that has passed) the read end is closed (that process's next write to it
        fails) and the restart goes on."""
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + STDERR_AFTER_EXIT_S
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({forwarding, stopping}, timeout=STDERR_AFTER_EXIT_S,
                               return_when=asyncio.FIRST_COMPLETED)
            if not forwarding.done() and self._stop_deadline is not None:
                now = loop.time()
                ends_at = min(ends_at, max(self._stop_deadline, now + STDERR_AT_STOP_S))
                await asyncio.wait({forwarding}, timeout=max(0.0, ends_at - now))
        finally:
            stopping.cancel()
        if forwarding.done():
            forwarding.result()  # a failure to pass lines on is the supervisor's own: raised, as before
            return True
        log.warning("a process the worker left holds its stderr open after the worker exited; closing the "
                    "pipe and going on", worker=worker.index, pid=worker.proc.pid if worker.proc else None)
        forwarding.cancel()
        pipe.transport.close()
        await asyncio.wait({forwarding})  # its held line passed on (_forward_stderr); not a cancel of ours
        return False

    async def _stop_workers(self) -> None:
        """SIGTERM to every worker; those still running WORKER_STOP_S later are killed."""
        await self._stop_processes([w.proc for w in self.workers if w.proc is not None])

    async def _stop_processes(self, procs: list[asyncio.subprocess.Process]) -> None:
        """SIGTERM to those of ``procs`` still running; those still running WORKER_STOP_S later are killed.
        One bound for all, waited for together: a bound per worker, one after the other, added up past any
        stop timeout."""
        # One bound from the stop's start (_begin_stop), for a worker whose start was under way then as well;
        # from now if nothing began it (run() cancelled).
        loop = asyncio.get_running_loop()
        if self._stop_deadline is None:
            self._stop_deadline = loop.time() + WORKER_STOP_S
        running = [proc for proc in procs if proc.returncode is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        if not running:
            return
        exits = {asyncio.create_task(exit_code(proc)): proc for proc in running}
        _, late = await asyncio.wait(exits, timeout=max(0.0, self._stop_deadline - loop.time()))
        if late:
            log.warning("workers not stopped within the bound; killing them",
                        pids=sorted(exits[task].pid for task in late), waited_s=WORKER_STOP_S)
            for task in late:
                kill_worker(exits[task])
            _, stuck = await asyncio.wait(late, timeout=KILLED_EXIT_S)
            if stuck:
                self._given_up.update(exits[task].pid for task in stuck)
                for task in stuck:
                    task.cancel()
                log.error("workers still running after SIGKILL (stuck in the kernel, e.g. on a disk that stopped "
                          "answering); stopping without them", pids=sorted(exits[task].pid for task in stuck),
                          waited_s=KILLED_EXIT_S)

    def _reap_adopted(self) -> None:
        """Reap the exited children this process did not start. Where the supervisor is PID 1 (a container's
        first process) or a subreaper, the kernel hands it the processes of a worker that died before them
        (the embedded store's writer of a worker killed with -9); asyncio waits for the workers only, so
        each would stay a zombie. A running child is left alone (WNOHANG)."""
        if self._spawning:
            return  # a worker forked just now may not be in self.workers yet: its exit status is asyncio's
        workers = {worker.proc.pid for worker in self.workers if worker.proc is not None}
        for pid in children() - workers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)

    async def _reap_forever(self) -> None:
        while True:
            self._reap_adopted()
            await asyncio.sleep(REAP_INTERVAL_S)

    # -- readiness ----------------------------------------------------------------------------------

    async def _probe(self, worker: _Worker) -> tuple[bool, object]:
        """(ready, the worker's /readyz body or why it did not answer)."""
        assert self._polling is not None
        proc = worker.proc
        if proc is None or proc.returncode is not None:
            return False, NOT_RUNNING
        try:
            async with self._polling.get(worker.admin_url + "/readyz", ssl=self._probe_ssl() or True,
                                      timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as resp:
                if worker.proc is proc:  # not the answer of a process since replaced, for its successor
                    worker.answered_at = asyncio.get_running_loop().time()
                body = await resp.json(content_type=None)
                ready = resp.status == 200
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as exc:
            # OSError: also a certificate file that cannot be read while a rotation replaces it.
            if _closed_by_the_worker(exc) and worker.proc is proc:
                # Taken and closed at once: its event loop runs, so it is not hung, whatever else it is (its admin
                # port's budget full of other local clients' connections; counted as silence, a healthy worker
                # was killed as hung and again after each restart: a review).
                worker.answered_at = asyncio.get_running_loop().time()
            return False, f"its admin port {worker.admin_url} did not answer: {exc!r}"
        if ready and worker.ready_at is None and worker.proc is proc:
            # Seen by the probe rather than once the poll round is over: a worker that died just after its
            # /readyz had said it was ready did not fail to start.
            log.info("worker ready", worker=worker.index, pid=proc.pid)
            worker.ready_at = asyncio.get_running_loop().time()
            worker.was_ready = True
            worker.left_a_holder = False
        return ready, body

    def _probe_ssl(self) -> ssl.SSLContext | None:
        """The TLS context the workers' /readyz is asked with (None: plain HTTP), as of the last reload of the
        certificate files."""
        reloads = self._tls.reloads if self._tls is not None else 0
        if self._probe_context is None or self._probe_context[0] != reloads:
            self._probe_context = (reloads, admin_probe_tls_context(self.settings))
        return self._probe_context[1]

    def _session(self) -> aiohttp.ClientSession:
        assert self._forwarding is not None, "the admin port serves once run() made the session"
        return self._forwarding

    def _kill_if_hung(self, worker: _Worker) -> None:
        """Kill a worker whose admin port has been silent for WORKER_HUNG_S since it last answered once it was
        ready, or, not ready yet, for WORKER_START_SILENT_S since it last answered or was started: its
        restart follows."""
        proc, answered_at, started_at = worker.proc, worker.answered_at, worker.started_at
        if self._stopping.is_set() or proc is None or proc.returncode is not None or started_at is None:
            return
        now = asyncio.get_running_loop().time()
        if worker.ready_at is not None and answered_at is not None:
            silent_s, bound_s = now - answered_at, WORKER_HUNG_S
        else:
            silent_s, bound_s = now - (answered_at if answered_at is not None else started_at), WORKER_START_SILENT_S
        if silent_s >= bound_s:
            log.error("worker not answering; killing it", worker=worker.index, pid=proc.pid,
                      silent_s=round(silent_s, 1), answered_since_start=answered_at is not None,
                      was_ready=worker.ready_at is not None)
            if worker.ready_at is None:
                worker.last_error = (f"its admin port answered nothing for {bound_s:.0f} s while it started (a store "
                                     "that takes longer to open: on the embedded store, `tc-server upgrade-store` or "
                                     "one start with --workers 1 does that work once)")
            worker.started_at = None  # once: its exit is awaited by _keep_running, which starts the next
            kill_worker(proc)

    async def _poll(self) -> None:
        while True:
            asked = [worker.proc for worker in self.workers]
            results = await asyncio.gather(*(self._probe(worker) for worker in self.workers))
            for worker, proc, (ready, body) in zip(self.workers, asked, results, strict=True):
                if worker.proc is proc:  # not the answer of a process restarted meanwhile
                    worker.ready, worker.readyz = ready, body
                self._up.labels(str(worker.index)).set(1 if worker.ready else 0)
                self._kill_if_hung(worker)
            await asyncio.sleep(POLL_INTERVAL_S)

    # -- admin --------------------------------------------------------------------------------------

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        self._transactions.add_to(app)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "workers": len(self.workers)})

    def stopping(self) -> None:
        """Nothing to do: /readyz and tc_server_ready say "stopping" from the stop's start (self._stopping)."""

    async def readyz(self, request: web.Request) -> web.Response:
        """From the poll's last answers (at most POLL_INTERVAL_S plus a probe old), the processes as they are
        now: answered at once whatever the workers do. Asking every worker per call made it wait out the
        probe's timeout for a hung one (past a kubelet's 1 s), and callers in numbers took the connections
        the poll's probes need."""
        results = [(False, NOT_RUNNING) if worker.proc is None or worker.proc.returncode is not None
                   else (worker.ready, worker.readyz) for worker in self.workers]
        listed = [{"index": worker.index, "pid": worker.proc.pid if worker.proc else None, "url": worker.url,
                   "admin": worker.admin_url, "ready": ready, "readyz": body}
                  for worker, (ready, body) in zip(self.workers, results, strict=True)]
        # Not ready from the stop's start, as a single process says (admin/routes.py): the workers stop taking
        # connections at once, and the last poll's answers said ready for up to a poll and a probe more.
        stopping = self._stopping.is_set()
        ready = not stopping and all(ready for ready, _ in results)
        body: dict[str, object] = {"ready": ready, "workers": listed}
        if stopping:
            body["problems"] = ["stopping: the workers drain their connections and step down"]
        return web.json_response(body, status=200 if ready else 503)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        """A keeper or background task ended: only at a stop, or a keeper that stopped everything. One that
        failed ends the supervisor, non-zero: left alone, it would go on answering /healthz 200 with a
        worker nobody restarts or a readiness nobody polls."""
        if task.cancelled() or self._stopping.is_set():
            return
        error = task.exception()  # a keeper returns only once stopping (a start that failed sets it first)
        self.failure = (1, f"tc-server: the supervisor's {task.get_name()} task ended: {error!r}")
        log.error("supervisor task ended; stopping", task=task.get_name(), error=repr(error))
        self._begin_stop()

    async def metrics(self, request: web.Request) -> web.Response:
        self._ready.set(1 if not self._stopping.is_set() and all(worker.ready for worker in self.workers) else 0)
        return metrics_response(self._registry)

    async def run(self) -> int:
        """Serve the admin port, keep the workers running until stopped; the exit code."""
        from tc_server.app import StopFailed, cannot_bind

        host, port = parse_hostport(self.settings.admin_listen)
        # The admin port's server (request limits, JSON errors): probes and worker readiness, and the
        # transactions API forwarded to the workers (README, "Several cores"). The probes are open; /metrics
        # needs a role with --authenticate-metrics-endpoint, as each worker's does (scrapers are pointed at
        # this port first).
        # HTTPS with --admin-tls, as the workers' (the certificate reloaded as theirs is); a bad file or key
        # stops the start here.
        tls = self._tls = server_tls_context(self.settings) if self.settings.admin_tls else None
        if tls is not None:
            self._certificate_expiry.read = tls.expiry_samples
        admin = AdminServer(self, host, port, tls=tls,
                            authentication=AuthenticationService.from_settings(self.settings),
                            authenticate_metrics=self.settings.authenticate_metrics_endpoint)
        try:
            await admin.start()
        except OSError as exc:
            raise cannot_bind("admin_listen", self.settings.admin_listen, exc) from exc
        self._polling, self._forwarding = (aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit_per_host=limit))
                                           for limit in (1, FORWARD_CONNECTIONS_PER_WORKER))
        log.info("supervising workers", workers=len(self.workers), service=self.settings.listen or None,
                 service_tls=self.settings.tls_listen or None,
                 worker_urls=[worker.url for worker in self.workers])
        keepers = [asyncio.create_task(self._keep_running(worker), name=f"worker-{worker.index}")
                   for worker in self.workers]
        background = [asyncio.create_task(self._poll(), name="worker-readiness"),
                      asyncio.create_task(self._reap_forever(), name="reaper")]
        if tls is not None:
            background.append(asyncio.create_task(tls.run(self.settings.tls_cert_refresh_check_s), name="tls-reload"))
        for task in keepers + background:
            task.add_done_callback(self._task_ended)
        try:
            await self._stopping.wait()
        finally:
            try:
                await self._stop_workers()
                await asyncio.gather(*keepers, return_exceptions=True)
                for task in background:
                    task.cancel()
                await asyncio.gather(*background, return_exceptions=True)
                for pool in (self._polling, self._forwarding):
                    await pool.close()
                await admin.stop()
            except OSError as exc:
                # Said as a stop that did not finish (exit 1), as a single process's is: the caller's "cannot
                # start" (exit 2) would send the operator to the settings and files.
                raise StopFailed.of(exc) from exc
        if self.failure is not None:
            code, message = self.failure
            say_refusal(message, self.settings.log_format)
            return code
        log.info("stopped")
        return 0


def _closed_by_the_worker(exc: BaseException) -> bool:
    """Whether a probe's failure says the worker's admin port took the connection and closed it (reset, or
    closed before answering): what a process whose event loop runs does, not a hung one (its kernel takes the
    connection, and nothing answers or closes it)."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    return isinstance(exc, OSError) and exc.errno in (errno.ECONNRESET, errno.EPIPE)


async def supervise(settings: Settings, argv: list[str]) -> int:
    """Run the supervisor of ``settings.workers`` workers until SIGTERM/SIGINT/SIGHUP; its exit code.
    ``argv``: this process's own arguments (``run …``), which every worker gets too."""
    from tc_server.app import STOP_SIGNALS

    supervisor = Supervisor(settings, argv)
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, supervisor.stop, sig)
    return await supervisor.run()
