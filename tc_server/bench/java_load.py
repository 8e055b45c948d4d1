"""The Java load both coordinator benchmarks share (tc_server.bench.vs_pulsar, tc_server.bench.txn_java).

A private copy of the interop harness jar (``make interop-java``), one run of a harness scenario (spawn
it, parse its JSON lines, read the servers' and the client's CPU at the ``measure-start`` and
``measure-end`` marks, a watchdog bounding the run, the result checked), the runs alternated between the
targets round by round, and the broker and tc-server started or the benchmark ended with the reason.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tc_server.bench.process import ServerStartError, TcServerProcess, cpu_seconds_of, keep_or_remove
from tc_server.bench.pulsar_broker import REPO, BrokerStartError, PulsarBroker

HARNESS_JAR = REPO / "tests" / "interop" / "java" / "target" / "tc-interop.jar"
HARNESS_MAKE = "make interop-java"
BROKER_MAKE = "make pulsar-broker"
# Beyond warm-up + duration: the client's start, its 16 coordinator handlers, and draining the last pairs.
RUN_SLACK_S = 120.0

# A target: the service URL the load dials and how to read that server's CPU seconds.
Target = tuple[str, Callable[[], float]]
R = TypeVar("R")


@dataclass
class Run:
    """One counted window of the Java load against one server (each benchmark adds its own fields)."""

    server: str
    concurrency: int
    pairs_per_s: float
    pair_p50_ms: float
    pair_p99_ms: float
    server_cpu_us_per_pair: float
    errors: int


@dataclass
class HarnessResult:
    """A harness run's ``result`` event and the CPU per pair across its counted window (us)."""

    result: dict[str, Any]
    server_cpu_us_per_pair: float
    client_cpu_us_per_pair: float


def private_harness(workdir: Path) -> Path:
    """A copy of the harness jar and its lib/ (the manifest's Class-Path) in ``workdir``: a `make
    interop-java` run by anyone during the benchmark replaces the jar under the running JVM, which then
    fails to load its own classes (NoClassDefFoundError) and hangs on the client's non-daemon threads."""
    dest = workdir / "harness"
    shutil.copytree(HARNESS_JAR.parent / "lib", dest / "lib")
    shutil.copy2(HARNESS_JAR, dest / HARNESS_JAR.name)
    return dest / HARNESS_JAR.name


def load_parser(prog: str, description: str | None, warmup_help: str) -> argparse.ArgumentParser:
    """The flags both benchmarks take: the load's shape, its rounds, tc-server's extra flags, the workdir."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, action="append", help="transactions in flight (repeatable)")
    parser.add_argument("--duration-s", type=float, default=20.0, help="counted window of each run")
    parser.add_argument("--warmup-s", type=float, default=5.0, help=warmup_help)
    parser.add_argument("--prime-s", type=float, default=10.0, help="uncounted first run per server (0: none)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per server and concurrency, alternated")
    parser.add_argument("--server-arg", action="append", default=[], help="extra tc-server run flag")
    parser.add_argument("--keep-workdir", action="store_true", help="keep logs and data (printed path)")
    return parser


def check_harness() -> None:
    if not HARNESS_JAR.exists():
        raise SystemExit(f"the Java load harness is missing ({HARNESS_JAR}): run `{HARNESS_MAKE}`")


def run_harness(jar: Path, scenario: Sequence[str], bound_s: float, server_cpu: Callable[[], float],
                server: str) -> HarnessResult:
    """One run of the harness ``jar`` with ``scenario`` (its name and flags); ``server_cpu`` and the JVM's
    own CPU are read when the harness opens and closes its counted window. A run that outlives ``bound_s``
    + RUN_SLACK_S is killed; one without a result ends the benchmark."""
    java = shutil.which("java")
    if java is None:
        raise SystemExit("java not found on PATH: the benchmark's load is the Java client (Java 17+)")
    # The client unpacks a native checksum library into java.io.tmpdir at every start and leaves it there.
    tmp = tempfile.TemporaryDirectory(prefix="tc-java-load-")
    proc = subprocess.Popen([java, f"-Djava.io.tmpdir={tmp.name}", "-jar", str(jar), *scenario],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    marks: dict[str, tuple[float, float]] = {}
    result: dict[str, Any] | None = None
    # Reading stdout blocks until the JVM exits; the watchdog bounds that.
    watchdog = threading.Timer(bound_s + RUN_SLACK_S, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            kind = event.get("event")
            if kind in ("measure-start", "measure-end"):
                marks[kind] = (server_cpu(), cpu_seconds_of(proc.pid))
            elif kind in ("result", "fatal"):
                result = event
        proc.wait(timeout=RUN_SLACK_S)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        tmp.cleanup()
    stderr = proc.stderr.read() if proc.stderr is not None else ""
    if result is None or result.get("event") != "result" or len(marks) != 2:
        raise SystemExit(f"the Java load against {server} gave no result (exit {proc.returncode}): "
                         f"{result}\n{stderr[-3000:]}")
    pairs = max(1, int(result["pairs"]))
    (server_0, client_0), (server_1, client_1) = marks["measure-start"], marks["measure-end"]
    return HarnessResult(result, server_cpu_us_per_pair=(server_1 - server_0) / pairs * 1e6,
                         client_cpu_us_per_pair=(client_1 - client_0) / pairs * 1e6)


def start_broker(broker: PulsarBroker) -> None:
    try:
        broker.start()
    except BrokerStartError as exc:
        raise SystemExit(f"the Pulsar broker did not start (to install it: `{BROKER_MAKE}`): {exc}") from None


def start_server(server: TcServerProcess) -> TcServerProcess:
    try:
        server.start()
    except ServerStartError as exc:
        raise SystemExit(str(exc)) from None
    return server


def alternated(targets: dict[str, Target], order: Sequence[str], concurrencies: Iterable[int], rounds: int,
               prime_s: float, run: Callable[[str, Target, int, bool], R], show: Callable[[R], None]) -> list[R]:
    """With ``prime_s``, one uncounted run per target first (``run(name, target, max concurrency, True)``:
    the broker's JIT and the servers' caches warm up on real load, so the first counted run of either is
    not its cold start); then per concurrency ``rounds`` rounds of one counted run per target, in
    ``order`` (those of it in ``targets``), reversed every other round, so a slow phase of the shared
    machine hits every target. Each counted run is shown as it ends."""
    concurrencies = list(concurrencies)
    if prime_s > 0:
        for name, target in targets.items():
            run(name, target, max(concurrencies), True)
    runs: list[R] = []
    for concurrency in concurrencies:
        for round_no in range(rounds):
            names = [name for name in order if name in targets]
            if round_no % 2 == 1:
                names.reverse()
            for name in names:
                counted = run(name, targets[name], concurrency, False)
                runs.append(counted)
                show(counted)
    return runs


def ratios_by_round(runs: Iterable[Any], server: str, baseline: str, concurrency: int, field: str) -> list[float]:
    """``server``'s ``field`` over ``baseline``'s at ``concurrency``, one ratio per round. In
    :func:`alternated` the k-th counted run of every target at a concurrency is in round k, and a round's
    runs follow each other, so each ratio compares two runs that met the same phase of the shared machine
    (its speed moved by ~45 % within minutes on this project's machine kind, issue 13); a ratio of medians
    can pair a fast run with a slow one."""
    runs = list(runs)
    ours = [getattr(r, field) for r in runs if r.server == server and r.concurrency == concurrency]
    theirs = [getattr(r, field) for r in runs if r.server == baseline and r.concurrency == concurrency]
    return [mine / other if other else float("nan") for mine, other in zip(ours, theirs, strict=True)]


def round_ratios_text(runs: Iterable[Any], server: str, baseline: str, concurrency: int,
                      fields: dict[str, str]) -> str:
    """One line for under a summary table: per round, ``server`` / ``baseline`` for each of ``fields``
    (attribute -> label), e.g. ``pairs/s 0.95x 1.02x; server CPU/pair 0.97x 0.93x``."""
    parts = [label + " " + " ".join(f"{ratio:.2f}x" for ratio in ratios_by_round(runs, server, baseline,
                                                                                  concurrency, field))
             for field, label in fields.items()]
    return f"{server} / {baseline} at {concurrency} in flight, round by round: " + "; ".join(parts)


def medians_of(runs: Iterable[Any], server: str, concurrency: int, fields: Sequence[str]) -> tuple[int, list[float]]:
    """How many runs of ``server`` at ``concurrency`` there are, and the median of each of ``fields``."""
    mine = [r for r in runs if r.server == server and r.concurrency == concurrency]
    if not mine:
        return 0, []
    return len(mine), [statistics.median(getattr(r, field) for r in mine) for field in fields]


def stop_all(servers: Iterable[TcServerProcess | None], broker: PulsarBroker, workdir: Path, keep: bool) -> None:
    """Stop the servers and the broker, then keep (and name) or remove ``workdir``."""
    for server in servers:
        if server is not None:
            server.stop(timeout_s=30)
    broker.stop()
    keep_or_remove(workdir, keep)
