"""Start, stop, kill and restart one ``tc-server run`` process on free loopback ports.

The one launcher the benchmarks, the tests and ``deploy/smoke.py`` share. The process is started as an
operator starts it (the console script, flags only), in its own session, with its output in a log
file; ``restart()`` brings it back on the same ports and data directory, which is what clients
reconnecting after a crash see. The standard library and tc_server's own runtime only:
``deploy/smoke.py`` imports it inside the image's virtualenv, where nothing but the runtime
dependencies is installed.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tc_server.config import Settings, ephemeral_port_range
from tc_server.healthcheck import admin_probe_tls_context

# Binding, opening the store and leading every coordinator takes about a second; a cold interpreter
# start with grpc and protobuf imports on a loaded 2-core machine takes several.
READY_TIMEOUT_S = 30.0
# The graceful stop finishes requests in flight (bounded by --request-timeout-s, default 10 s).
STOP_TIMEOUT_S = 15.0
# free_port()'s ports: outside the kernel's ephemeral range (see there), at least PORT_FLOOR; the ports it
# handed out, so that two picks made before either process binds never collide.
PORT_FLOOR = 10000
_handed_out: set[int] = set()
_random = random.Random()
# Where the next pick starts, shared by every process of the machine that picks ports (a test run's xdist
# workers, a benchmark beside them): each process's picks follow the last one of any of them. Picked at
# random per process, a port checked free by one process while another's server was still starting (a
# --workers 2 worker binds its port seconds after the pick) went to both; CI saw the worker fail to start.
_CURSOR_FILE = Path("/tmp/tc-server-free-port.cursor")


def free_port(count: int = 1) -> int:
    """A TCP port nothing listens on right now at 127.0.0.1 (with ``count``, the first of that many in a
    row that may be free: free_ports_in_a_row checks the others), not handed out before by this process.

    Outside the kernel's ephemeral range (``ip_local_port_range``), unlike the kernel's pick for port 0:
    a port in that range, released while its process restarts, can meanwhile become the local port of any
    outgoing connection (a client reconnecting), and the restart then fails with "address already in
    use". Seen in CI: a ``--workers 2`` worker killed under a Java client could not bind its admin port
    again. Below the range, else above it; a host whose range leaves neither gets the kernel's pick."""
    low, high = ephemeral_port_range()
    spans = [(first, last) for first, last in ((PORT_FLOOR, low - count), (high + 1, 65536 - count)) if first < last]
    for _ in range(1000):
        if spans:
            port = _next_candidate(*max(spans, key=lambda span: span[1] - span[0]), count)
        else:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
        if any(p in _handed_out for p in range(port, port + count)):
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.update(range(port, port + count))
        return port
    raise RuntimeError(f"no free port found outside the ephemeral range {low}-{high}")


def _next_candidate(first: int, last: int, count: int) -> int:
    """The next ``count`` ports in ``[first, last)`` after the machine's shared cursor (_CURSOR_FILE), which moves
    past them; a random one where the file cannot be used."""
    try:
        with open(_CURSOR_FILE, "a+b") as cursor_file:
            fcntl.flock(cursor_file, fcntl.LOCK_EX)  # released when the file closes
            cursor_file.seek(0)
            text = cursor_file.read().decode("ascii", "replace").strip()
            port = int(text) if text.isdigit() and first <= int(text) < last else _random.randrange(first, last)
            cursor_file.seek(0)
            cursor_file.truncate()
            cursor_file.write(str(port + count).encode())
            return port
    except OSError:
        return _random.randrange(first, last)


def free_ports_in_a_row(count: int, attempts: int = 100) -> int:
    """The first of ``count`` consecutive TCP ports nothing listens on at 127.0.0.1 right now: ``--workers
    N`` takes ``--listen``'s and ``--admin-listen``'s ports + 1 .. N too (tc_server/workers.py)."""
    for _ in range(attempts):
        first = free_port(count)
        held: list[socket.socket] = []
        try:
            for port in range(first + 1, first + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports found in {attempts} attempts")


def workers_in(args: Sequence[str]) -> int:
    """The ``--workers`` value among tc-server flags (``--workers N`` or ``--workers=N``; the last wins), 1
    when absent or unreadable (tc-server itself then says what is wrong)."""
    found = "1"
    for i, arg in enumerate(args):
        if arg == "--workers" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--workers="):
            found = arg.split("=", 1)[1]
    return int(found) if found.isascii() and found.isdigit() and 0 < int(found) <= 256 else 1


def baseline_src(text: str) -> Path:
    """The argparse type of the benchmarks' ``--baseline-src DIR``: a directory holding another ``tc_server/``
    package (e.g. ``git archive <commit> tc_server | tar -x -C DIR``), measured beside this tree in one
    sitting; its tc-server runs with it first on its PYTHONPATH (:func:`baseline_env`)."""
    path = Path(text)
    if not (path / "tc_server" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{text}: no tc_server/__init__.py there")
    return path.resolve()


def baseline_env(src: Path) -> dict[str, str]:
    """The environment a tc-server of the tree ``src`` (:func:`baseline_src`) is started with."""
    return {"PYTHONPATH": str(src)}


def admin_tls_in(args: Sequence[str]) -> bool:
    """Whether tc-server flags turn ``--admin-tls`` on (the last of ``--admin-tls`` / ``--no-admin-tls``)."""
    flags = [arg for arg in args if arg in ("--admin-tls", "--no-admin-tls")]
    return bool(flags) and flags[-1] == "--admin-tls"


def descendants_of(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc/<pid>/task/<tid>/children): a supervisor's workers."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(child) for child in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            found.extend(children)
            pending.extend(children)
    return found


def cpu_seconds_of(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux /proc/<pid>/stat, every thread included);
    NaN where /proc cannot tell."""
    try:
        # Fields after the command name, which is in parentheses and may itself hold spaces.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid`` and every process below it (a supervisor's workers, the embedded store's
    writer process): what a server costs, whichever of its processes does the work."""
    return sum(cpu_seconds_of(each) for each in (pid, *descendants_of(pid)))


def rss_bytes_of(pid: int, field: str = "VmRSS") -> int:
    """Resident set size of process ``pid`` (Linux /proc/<pid>/status VmRSS; ``field="VmHWM"``: its peak so
    far); 0 where /proc cannot tell."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def spawn_logged(argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
                 stdin: int | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (a terminal's Ctrl-C reaches the caller, which then stops it in
    order) with stdout and stderr appended to ``log_path``, after a ``---- start <argv>`` line."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"---- start {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen(list(argv), stdout=log, stderr=log, stdin=stdin,
                                env=None if env is None else dict(env), start_new_session=True)


def kill_process(proc: subprocess.Popen[bytes] | None, wait_s: float) -> None:
    """SIGKILL ``proc`` if it is running, and reap it (within ``wait_s``)."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(wait_s)


def terminate_process(proc: subprocess.Popen[bytes], timeout_s: float, kill_wait_s: float, *,
                      stopped: Callable[[], bool] | None = None, grace_s: float = 0.0) -> bool:
    """SIGTERM ``proc`` if it is running and wait up to ``timeout_s``; False (after a SIGKILL, reaped within
    ``kill_wait_s``) when it was still running then, True otherwise. ``stopped``, polled meanwhile, says
    when it has done all its stop does (e.g. from its log): the wait then ends ``grace_s`` later at most,
    for a process whose stop is through but that does not exit (a standalone Pulsar broker's JVM)."""
    if proc.poll() is not None:
        return True
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    if stopped is not None:
        while proc.poll() is None and time.monotonic() < deadline and not stopped():
            time.sleep(0.2)
        deadline = min(deadline, time.monotonic() + grace_s)
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill_process(proc, kill_wait_s)
        return False
    return True


def log_tail_of(log_path: Path, lines: int, what: str = "log") -> str:
    """The last ``lines`` lines of ``log_path`` under a header; ``(no <what> at <path>)`` when unreadable."""
    try:
        text = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no {what} at {log_path})"
    return f"---- {log_path} (last {lines} lines) ----\n" + "\n".join(text[-lines:])


def keep_or_remove(workdir: Path, keep: bool, what: str = "logs and data") -> None:
    """A benchmark's end: keep ``workdir`` and say where (``--keep-workdir``), or remove it."""
    if keep:
        print(f"({what} kept in {workdir})")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def default_command() -> list[str]:
    """The ``tc-server`` console script next to this interpreter; the module entry point otherwise."""
    script = Path(sys.executable).with_name("tc-server")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from tc_server.cli import main; sys.exit(main())"]


class ServerStartError(RuntimeError):
    """The process exited, or did not answer ``/readyz`` with 200 in time; the message holds its log tail."""


class ServerStopError(RuntimeError):
    """The process ignored SIGTERM for the whole bound and was killed."""


class LoggedProcess:
    """What the launchers share: a child on 127.0.0.1 whose client port is ``port``, with its output in
    ``log_path`` (spawn_logged), killed and reaped within ``KILL_WAIT_S``."""

    KILL_WAIT_S = 10.0
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (what a crash or an OOM kill does)."""
        kill_process(self.proc, self.KILL_WAIT_S)


class TcServerProcess(LoggedProcess):
    """One ``tc-server run`` on 127.0.0.1 with its own ports, data directory and log file.

    ``extra_args`` go after the launcher's own flags, so a later flag (``--coordinators 8``) wins.
    ``env`` is added to ``base_env`` (default: this process's environment) for the child.
    """

    def __init__(self, data_dir: Path, *extra_args: str, store: str = "embedded",
                 env: Mapping[str, str] | None = None, base_env: Mapping[str, str] | None = None,
                 command: Sequence[str] | None = None, log_path: Path | None = None,
                 port: int | None = None, admin_port: int | None = None) -> None:
        self.data_dir = data_dir
        self.extra_args = list(extra_args)
        self.store = store
        self.env = dict(env or {})
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.command = list(command) if command is not None else default_command()
        # --workers N: worker k also takes the client and admin ports + 1 + k.
        self.workers = workers_in(self.extra_args)
        self.port = port if port is not None else free_ports_in_a_row(1 + self.workers)
        self.admin_port = admin_port if admin_port is not None else free_ports_in_a_row(1 + self.workers)
        # --admin-tls: the admin port speaks HTTPS, asked as `tc-server healthcheck` asks it.
        self.admin_scheme = "https" if admin_tls_in(self.extra_args) else "http"
        self._admin_ssl = admin_probe_tls_context(Settings(admin_tls=self.admin_scheme == "https"))
        self.log_path = log_path if log_path is not None else data_dir.parent / f"tc-server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    # ---- addresses ---------------------------------------------------------------------------------

    @property
    def admin_url(self) -> str:
        return f"{self.admin_scheme}://127.0.0.1:{self.admin_port}"

    @property
    def argv(self) -> list[str]:
        return [*self.command, "run",
                "--listen", f"127.0.0.1:{self.port}", "--admin-listen", f"127.0.0.1:{self.admin_port}",
                "--advertised-url", self.url, "--store", self.store, "--data-dir", str(self.data_dir),
                "--log-format", "json", *self.extra_args]

    # ---- life cycle --------------------------------------------------------------------------------

    def start(self, wait: bool = True, timeout_s: float = READY_TIMEOUT_S) -> TcServerProcess:
        """Start it (again: same ports, same data); with ``wait``, return once ``/readyz`` says 200.

        Raises ServerStartError when it exits or is not ready in time, RuntimeError if it is running.
        """
        if self.running():
            raise RuntimeError(f"tc-server on port {self.port} is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = spawn_logged(self.argv, self.log_path, env={**self.base_env, **self.env})
        if wait:
            self.wait_ready(timeout_s)
        return self

    def restart(self, wait: bool = True, timeout_s: float = READY_TIMEOUT_S) -> TcServerProcess:
        """SIGKILL if still running, then start on the same ports and data directory."""
        self.kill()
        return self.start(wait, timeout_s)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Poll ``/readyz`` (the store answers and every coordinator has a leader) until it says 200."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise ServerStartError(f"tc-server exited with {code} before it was ready\n{self.log_tail()}")
            code = self.status("/readyz")
            if code == 200:
                return
            last = f"HTTP {code}" if code else "no answer"
            time.sleep(0.1)
        raise ServerStartError(f"tc-server not ready within {timeout_s:.0f}s (last: {last})\n{self.log_tail()}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, the graceful stop, and wait; returns the exit code (0 if it never started).

        Raises ServerStopError (after a SIGKILL) when it is still running after ``timeout_s``.
        """
        if self.proc is None:
            return 0
        if not terminate_process(self.proc, timeout_s, self.KILL_WAIT_S):
            raise ServerStopError(f"tc-server ignored SIGTERM for {timeout_s:.0f}s\n{self.log_tail()}")
        return self.proc.returncode

    # ---- observation -------------------------------------------------------------------------------

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far (Linux /proc), so the cost per request can be
        read even when other processes share the cores; NaN where /proc cannot tell."""
        if self.proc is None:
            return float("nan")
        # With --workers N: the supervisor and every worker (a worker restarted meanwhile starts at 0); the
        # embedded store's writer processes too.
        return tree_cpu_seconds(self.proc.pid)

    def rss_bytes(self) -> int:
        """Resident set size of the process (and its workers) now; 0 when it is not running."""
        if self.proc is None:
            return 0
        return sum(rss_bytes_of(pid) for pid in (self.proc.pid, *descendants_of(self.proc.pid)))

    def log_tail(self, lines: int = 40) -> str:
        return log_tail_of(self.log_path, lines)

    def worker_admin_url(self, worker: int) -> str:
        """Worker ``worker``'s own admin port under ``--workers N`` (``--admin-listen``'s port + 1 + worker)."""
        return f"{self.admin_scheme}://127.0.0.1:{self.admin_port + 1 + worker}"

    def get(self, path: str, timeout_s: float = 5.0, worker: int | None = None) -> tuple[int, bytes]:
        """GET an admin path (of worker ``worker``'s own admin port under ``--workers N``); (status, body).
        Raises OSError when nothing answers."""
        base = self.admin_url if worker is None else self.worker_admin_url(worker)
        try:
            with urllib.request.urlopen(base + path, timeout=timeout_s,  # noqa: S310 - loopback
                                        context=self._admin_ssl) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), bytes(exc.read())

    def get_json(self, path: str, timeout_s: float = 5.0, worker: int | None = None) -> tuple[int, Any]:
        """GET an admin path (of worker ``worker`` as in :meth:`get`); (status, parsed JSON body, None if the
        body is not JSON). Raises OSError when nothing answers."""
        code, body = self.get(path, timeout_s, worker)
        try:
            return code, json.loads(body or b"null")
        except ValueError:
            return code, None

    def status(self, path: str) -> int:
        """The HTTP status of an admin path; 0 when nothing answers."""
        try:
            return self.get(path, timeout_s=2.0)[0]
        except OSError:
            return 0
