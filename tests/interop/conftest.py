"""Real Pulsar clients against tc-server running as a subprocess.

The server is started exactly as an operator would (``tc-server run`` on free ports, embedded store in a
temporary directory), so SIGKILL and restart on the same data directory are real. The Java and Go
harnesses are built by ``make interop-java`` / ``make interop-go``; a missing harness or toolchain fails
the test with the command to run, it never skips (docs/architecture.md §9).
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tc_server.bench.process import (
    READY_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServerStartError,
    ServerStopError,
    TcServerProcess,
    free_port,
)

REPO = Path(__file__).resolve().parents[2]
JAVA_JAR = REPO / "tests" / "interop" / "java" / "target" / "tc-interop.jar"
GO_BIN = REPO / "tests" / "interop" / "go" / "bin" / "tc-interop-go"
# C1 only and the serial collector: each harness run is a short-lived JVM on a 2-core machine, where
# start-up time matters more than peak throughput.
JVM_OPTS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
ASSIGN_TOPIC = "persistent://pulsar/system/transaction_coordinator_assign"
COORDINATORS = 16

__all__ = ["ASSIGN_TOPIC", "COORDINATORS", "Harness", "HarnessRun", "RunningHarness", "TcServer", "free_port",
           "txn_header"]


def txn_header(server: TcServerProcess, most: int, least: int) -> tuple[int, Any]:
    """The header of txn (most, least) as the server's admin API shows it: (HTTP status, JSON body)."""
    return server.get_json(f"/admin/v3/transactions/transactionMetadata/{most}/{least}", timeout_s=10)


class TcServer(TcServerProcess):
    """One ``tc-server run`` subprocess (the shared launcher, tc_server/bench/process.py) with the
    interop tests' defaults: the embedded store, 16 coordinators; ``kill()`` + ``start()`` restarts it
    on the same ports and data. A server that cannot start or stop fails the test with its log tail."""

    def __init__(self, data_dir: Path, log_path: Path, *, store: str = "embedded", extra_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, port: int | None = None) -> None:
        super().__init__(data_dir, "--coordinators", str(COORDINATORS), *extra_args, store=store, env=env,
                         log_path=log_path, port=port)

    def start(self, wait: bool = True, timeout_s: float = READY_TIMEOUT_S) -> TcServer:
        try:
            super().start(wait, timeout_s)
        except ServerStartError as exc:
            pytest.fail(str(exc))
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        try:
            return super().stop(timeout_s)
        except ServerStopError as exc:
            pytest.fail(str(exc))

    def txn(self, most: int, least: int) -> tuple[int, Any]:
        return txn_header(self, most, least)

    def wait_status(self, most: int, least: int, want: str, timeout_s: float = 60.0) -> str | None:
        """Poll the header until it has ``want``; returns the last status seen (None: 404)."""
        deadline = time.monotonic() + timeout_s
        status: str | None = None
        while True:
            code, body = self.txn(most, least)
            status = body.get("status") if code == 200 and body else None
            if status == want or time.monotonic() > deadline:
                return status
            time.sleep(0.2)


@pytest.fixture
def tc_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Make servers (not started) that are torn down after the test; each has its own data dir."""
    servers: list[TcServer] = []

    def make(**kwargs: Any) -> TcServer:
        base = tmp_path_factory.mktemp("tc-server")
        server = TcServer(base / "data", base / "server.log", **kwargs)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def oxia_standin() -> Iterator[str]:
    """The stand-in Oxia server (tests/oxia_standin, 3 shards) in its own process: the Oxia server
    itself cannot be installed here (the Go module proxy refuses github.com/oxia-db/oxia)."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.oxia_standin", "--shards", "3"],
                            stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().split()
    if len(line) != 2 or line[0] != "listening":
        proc.kill()
        pytest.fail(f"the Oxia stand-in did not start: {line}")
    yield line[1]
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module", params=["embedded", "oxia-standin"])
def tc_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TcServer]:
    """One running server shared by the tests of a module that do not need their own, on the
    embedded store and on Oxia (the stand-in)."""
    base = tmp_path_factory.mktemp("tc-server-shared")
    if request.param == "oxia-standin":
        server = TcServer(base / "data", base / "server.log", store="oxia",
                          extra_args=["--oxia-address", request.getfixturevalue("oxia_standin")])
    else:
        server = TcServer(base / "data", base / "server.log")
    server.start()
    yield server
    server.stop()


# ---- harnesses ----------------------------------------------------------------------------------------


@dataclass
class HarnessRun:
    returncode: int
    lines: list[dict[str, Any]]
    stderr: str

    @property
    def result(self) -> dict[str, Any]:
        results = [line for line in self.lines if line.get("event") in ("result", "fatal")]
        assert results, f"harness printed no result line (exit {self.returncode})\n{self.stderr_tail()}"
        assert results[-1]["event"] == "result", f"harness failed: {results[-1]}\n{self.stderr_tail()}"
        return results[-1]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("event") == name]

    def stderr_tail(self, lines: int = 30) -> str:
        return "---- harness stderr (tail) ----\n" + "\n".join(self.stderr.splitlines()[-lines:])


def _parse_lines(stdout: str) -> list[dict[str, Any]]:
    out = []
    for raw in stdout.splitlines():
        raw = raw.strip()
        if raw.startswith("{"):
            out.append(json.loads(raw))
    return out


@dataclass
class Harness:
    """One of the built harnesses; ``run`` waits for it, ``spawn`` leaves it running (commit-loop)."""

    name: str
    argv: list[str]
    # The Java harness takes --key value, the Go one -key value.
    flag_prefix: str

    def command(self, scenario: str, **options: Any) -> list[str]:
        cmd = [*self.argv, scenario]
        for key, value in options.items():
            cmd += [self.flag_prefix + key.replace("_", "-"), str(value)]
        return cmd

    def run(self, scenario: str, timeout_s: float = 90, **options: Any) -> HarnessRun:
        try:
            proc = subprocess.run(self.command(scenario, **options), capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as e:
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            pytest.fail(f"{self.name} {scenario} did not finish in {timeout_s}s\n{stderr[-3000:]}")
        run = HarnessRun(proc.returncode, _parse_lines(proc.stdout), proc.stderr)
        sys.stderr.write(run.stderr_tail(15) + "\n")
        return run

    def spawn(self, scenario: str, **options: Any) -> RunningHarness:
        proc = subprocess.Popen(self.command(scenario, **options), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        return RunningHarness(proc)


class RunningHarness:
    """A harness whose stdout lines are collected by a thread while the test does other things."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self._new: queue.Queue[dict[str, Any]] = queue.Queue()
        self._stderr: list[str] = []
        self._out_thread = threading.Thread(target=self._read_stdout, daemon=True)
        self._err_thread = threading.Thread(target=self._read_stderr, daemon=True)
        self._out_thread.start()
        self._err_thread.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if raw.startswith("{"):
                line = json.loads(raw)
                self.lines.append(line)
                self._new.put(line)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self._stderr.append(raw.rstrip("\n"))

    def wait_for(self, event: str, count: int, timeout_s: float, after: int = 0) -> list[dict[str, Any]]:
        """Wait until ``count`` lines of ``event`` have arrived at or after index ``after`` of ``lines``."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = [line for line in self.lines[after:] if line.get("event") == event]
            if len(got) >= count:
                return got
            if self.proc.poll() is not None and self._new.empty():
                self._out_thread.join(5)
                got = [line for line in self.lines[after:] if line.get("event") == event]
                if len(got) >= count:
                    return got
                pytest.fail(f"harness exited ({self.proc.returncode}) after {len(got)}/{count} {event} lines"
                            f"\n{self.stderr_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"only {len(got)}/{count} {event} lines in {timeout_s}s\n{self.lines_tail()}"
                            f"\n{self.stderr_tail()}")
            try:
                self._new.get(timeout=0.2)
            except queue.Empty:
                pass

    def lines_tail(self, n: int = 12) -> str:
        """The harness's last event lines: what it was doing when a wait ran out (failures name their error)."""
        return "---- harness events (tail) ----\n" + "\n".join(json.dumps(line) for line in self.lines[-n:])

    def finish(self, timeout_s: float = 30) -> int:
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.terminate()
            pytest.fail(f"harness did not stop within {timeout_s}s\n{self.stderr_tail()}")
        self._out_thread.join(5)
        self._err_thread.join(5)
        return code

    def save(self, stem: Path) -> None:
        """Write the event lines (``stem``.jsonl) and stderr (``stem``.stderr) collected so far."""
        stem.with_suffix(".jsonl").write_text("".join(json.dumps(line) + "\n" for line in self.lines))
        stem.with_suffix(".stderr").write_text("\n".join(self._stderr) + "\n")

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stderr_tail(self, lines: int = 30) -> str:
        return "---- harness stderr (tail) ----\n" + "\n".join(self._stderr[-lines:])


@pytest.fixture(scope="session")
def java_harness(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    java = shutil.which("java")
    if java is None:
        pytest.fail("java not found on PATH: the interop tests need a Java 17+ JDK (see mk/interop.mk)")
    if not JAVA_JAR.exists() or not (JAVA_JAR.parent / "lib").is_dir():
        pytest.fail(f"{JAVA_JAR.relative_to(REPO)} is missing: run `make interop-java`")
    # The client unpacks a native checksum library into java.io.tmpdir at every start and leaves it there.
    tmp = tmp_path_factory.mktemp("java-tmp")
    return Harness("java", [java, *JVM_OPTS, f"-Djava.io.tmpdir={tmp}", "-jar", str(JAVA_JAR)], "--")


@pytest.fixture(scope="session")
def go_harness() -> Harness:
    if not GO_BIN.exists():
        pytest.fail(f"{GO_BIN.relative_to(REPO)} is missing: run `make interop-go`")
    return Harness("go", [str(GO_BIN)], "-")


@pytest.fixture
def harness_process() -> Iterator[list[RunningHarness]]:
    """Spawned harnesses registered here are killed when the test ends, pass or fail."""
    running: list[RunningHarness] = []
    yield running
    for r in running:
        r.terminate()
