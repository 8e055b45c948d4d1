"""A randomized chaos soak for exactly-once consume-transform-produce through tc-server (`make soak`: not
part of `make test`, see tests/soak/conftest.py).

A stock Java client application (tests/soak/ChaosCtp.java, 2 threads, Shared subscription) uses
tc-server as its one service URL in front of the session's real Pulsar 4.2.4 broker: per txn it reads 1..8
inputs, sends ``out:<input>|<txn>`` and acks each input in the txn, commits (10 % aborted deliberately).
Meanwhile a chaos driver, on a schedule drawn from a fixed seed (``CHAOS_SEED``, printed with the schedule),
kills tc-server with SIGKILL and restarts it on the same data dir and ports, SIGSTOPs it (the whole process
tree or one process) for 1-8 s and sometimes past the txn timeout, and kills it while decisions are being
delivered (caught by polling ``undelivered``, or held by SIGSTOPping the broker for a few seconds). The
``--workers 2`` variant also kills and stops single workers.

Afterwards: the inputs are drained (input backlog 0), tc-server's ``undelivered`` empties,
``pulsar_txn_active_count`` sums to 0, the broker holds no open txn, the output read at read_committed
(from the broker, not through tc-server) holds every input's transform exactly once, nothing of a txn
whose abort was confirmed (or whose commit was refused) is visible, every committed txn is visible whole,
and ``tc-server export`` + ``tc-audit`` report no violation.

A stall of the broker's (docs/client-behaviour.md, *A Shared subscription that stops reading after
reconnections*): under CHAOS_PROFILE=harsh with ``--workers 2`` (seeds 4242 through the relay, and 777 with
CHAOS_LOOKUP=direct) the INPUT subscription stopped after the chaos: hundreds of input messages stayed in the
backlog while the app sat idle in receive(), with msgInReplay 0, unackedMessages 0, no txn open or undelivered
anywhere, and the cursor's read position at the end of the ledger. Read in the 4.2.4 broker (decompiled): when
every consumer of a Shared subscription leaves (the app resubscribes after each failed txn; a relayed connection
also ends with its tc-server) and one is added back while a replay read of aborted acks is in flight, the
cursor's rewind waits for the next *normal* read, which waits at the tail. Confirmed 2026-11-30 11:24 UTC (seed
4242, ``--workers 2``): every stalled partition showed ``waitingReadOp`` and ``subscriptionHavePendingRead`` true
with no replay read, and one message sent to each drained all of them (3, 63, 288 and 768) within 30 s. Pulsar's
own coordinator meets the same broker paths when its timeouts abort while consumers resubscribe;
apache/pulsar#23802 fixed that window for Key_Shared (4.0.2), #23803 is open. So the drain, on a stall whose
every partition shows exactly that (:func:`parked_at_the_tail`), sends one more input to each (up to
MAX_NUDGES times; an input like the others, checked exactly once), logs it and reports the nudges in the
SUMMARY line; a stall of any other kind fails with ``input backlog stuck`` and the broker's view (STALL_S). The
feeder does the same during the chaos after CHAOS_STALL_S without a commit, so that the chaos meets a working app.

Run: ``make soak`` (the defaults: ~12 min for both parametrizations), or ``make soak CHAOS_SEED=N CHAOS_SECONDS=S
CHAOS_PROFILE=harsh CHAOS_LOOKUP=direct`` (each variable is optional).

Measured 2026-11-30 (2-core machine): seeds 20261130 (default), 4242 (harsh) and 777 (harsh, direct), each with
--workers 1 and 2: ~98,000 committed txns, ~10,000 deliberate aborts, 65 kill -9s (28 during deliveries) and 47
stops; every check held but the broker's stall above (2 of the 3 harsh --workers 2 runs). Again with the
embedded store's records in a rowid table (``make soak``, 08:27-08:39 UTC on 45ee565): 49,753 committed txns over
223,000 inputs, 5,535 deliberate aborts, 23 kill -9s (11 during deliveries) and 14 stops; every check held, no
stall. With the nudge (11:28-11:50 UTC, harsh): seed 4242 with ``--workers 2`` and 777 (direct) with ``--workers
2`` did not stall; seed 4242 with ``--workers 1`` stalled on all four partitions (1,880 inputs, the broker's
signature), one nudge drained them in 6 s, and every check held (55,504 inputs, 12,371 committed txns, 1,370
deliberate aborts, audit clean). A new seed, ``make soak CHAOS_SEED=20261201 CHAOS_PROFILE=harsh`` (15:51-16:02 UTC
on aab272c): --workers 1 64,500 inputs, 14,260 committed txns, 1,591 deliberate aborts, 16 kill -9s (7 during
deliveries) and 10 stops; --workers 2 72,500 inputs, 16,212 committed txns, 1,910 deliberate aborts, 12 kill -9s
(5 during deliveries), 2 worker kills, 7 stops and 3 worker stops; every check held, no stall, audit clean. And
``make soak CHAOS_SEED=31337`` (16:53-17:05 UTC on b814a90): --workers 1 100,500 inputs, 22,166 committed txns,
2,450 deliberate aborts, 12 kill -9s (8 during deliveries), 6 stops; --workers 2 104,500 inputs, 23,080 committed
txns, 2,562 deliberate aborts, 7 kill -9s (4 during deliveries), 4 worker kills, 5 stops and 2 worker stops; every
check held, no stall, audit clean.

On 899801f (2026-12-04), with the writer process's one-thread SQLite and marshal channel: ``make soak
CHAOS_SEED=20261204 CHAOS_PROFILE=harsh`` (16:06-16:21 UTC): --workers 1 40,500 inputs, 9,008 committed txns, 1,002
deliberate aborts, 10 kill -9s, 8 more during deliveries, 6 stops; --workers 2 49,501 inputs, 10,923 committed txns,
1,237 deliberate aborts, 5 kill -9s, 4 during deliveries, 6 worker kills, 7 stops, 4 worker stops and one stall
nudged in the drain. ``make soak CHAOS_SEED=4204 CHAOS_PROFILE=harsh CHAOS_LOOKUP=direct`` (16:24-16:42 UTC):
--workers 1 43,502 inputs, 9,650 committed txns, 998 deliberate aborts, 11 kill -9s, 6 during deliveries, one stall
nudged; --workers 2 stalled ~40 s into its chaos and the app sat idle through the other 22 events (6,504 inputs,
1,450 committed txns): every check held after the drain's nudge, but the chaos had met an idle app, hence
CHAOS_STALL_S. That run again with it (16:45-16:54 UTC) did not stall during the chaos: 51,501 inputs, 11,357
committed txns, one stall nudged in the drain. Every check held and every audit was clean.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pulsar
import pytest

from tc_server.bench.process import TcServerProcess, descendants_of
from tests.e2e.txn_support import new_topic, wait_no_open_txns
from tests.support.pulsar_broker import PulsarBroker, split_topic

pytestmark = [pytest.mark.java, pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "tests" / "interop" / "java" / "target" / "lib"
SOURCE = Path(__file__).with_name("ChaosCtp.java")
SEED = int(os.environ.get("CHAOS_SEED") or "20261130")
CHAOS_SECONDS = float(os.environ.get("CHAOS_SECONDS") or "330")
# CHAOS_LOOKUP=direct: clients connect to the broker directly (--lookup-connections direct), on a namespace
# WITHOUT broker deduplication: README says exactly-once needs deduplication only for tc-server's relay.
DIRECT = os.environ.get("CHAOS_LOOKUP", "") == "direct"
NAMESPACE = "public/chaos-direct" if DIRECT else "public/chaos"
# CHAOS_CONTROL=broker: the control run: the same worker with the broker itself as its service URL (Pulsar's own
# coordinator), no chaos, for CHAOS_SECONDS; tells the broker's and client's behaviour from tc-server's.
CONTROL = os.environ.get("CHAOS_CONTROL", "") == "broker"
PARTITIONS = 4
SUBSCRIPTION = "chaos"
INITIAL_INPUTS = 1500
LOW_BACKLOG = 1500
TOP_UP = 1000
# CHAOS_PROFILE=harsh: events twice as often, a long stop (past the txn timeout) one time in three, and
# 10 s txns, so that sweeps abort txns whose clients are committing at the same moment.
HARSH = os.environ.get("CHAOS_PROFILE", "") == "harsh"
TXN_TIMEOUT_MS = 10_000 if HARSH else 20_000
ABORT_PERCENT = 10
THREADS = 2
DRAIN_TIMEOUT_S = 600.0
# The input backlog not moving for this long, with inputs left and the worker idle, is a stall.
STALL_S = 150.0
# Stalls of the 4.2.4 broker's kind (module text) the drain releases with one more input before it fails.
MAX_NUDGES = 3
# During the chaos: no commit for this long (past the longest stop, 16 s, plus a txn timeout and a restart) and
# every partition with a backlog parked at its tail, the feeder nudges too. Seed 4204 (harsh, direct, --workers
# 2) stalled so ~40 s into its chaos on 2026-12-04, and the app sat idle through the other 22 events.
CHAOS_STALL_S = 45.0


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S', time.gmtime())}] {msg}", flush=True)


@pytest.fixture(scope="module")
def java_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("chaos-classes")
    subprocess.run(["javac", "-nowarn", "-d", str(out), "-cp", f"{LIB}/*", str(SOURCE)], check=True,
                   capture_output=True)
    return out


def java_cmd(classes: Path, tmp: Path, *args: str) -> list[str]:
    return ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx384m", f"-Djava.io.tmpdir={tmp}",
            "-cp", f"{classes}:{LIB}/*", "ChaosCtp", *args]


# ---- the schedule --------------------------------------------------------------------------------------


def schedule(seed: int, workers: int, seconds: float) -> list[dict[str, Any]]:
    """The chaos events, in order: each waits ``gap`` seconds after the previous one ended."""
    rng = random.Random(seed * 10 + workers)
    kinds = ["kill", "stop", "kill_in_delivery"] + (["kill_worker", "stop_worker"] if workers > 1 else [])
    weights = [3, 3, 3] + ([2, 2] if workers > 1 else [])
    events: list[dict[str, Any]] = []
    total = 0.0
    while total < seconds:
        gap = round(rng.uniform(3, 10) if HARSH else rng.uniform(6, 20), 2)
        kind = rng.choices(kinds, weights)[0]
        event: dict[str, Any] = {"gap": gap, "kind": kind}
        if kind == "kill":
            event["down_s"] = round(rng.uniform(0, 3), 2)
            if HARSH and rng.random() < 0.5:
                event["scope"] = "main"  # SIGKILL of the main process only, as the OOM killer does
            total += event["down_s"] + 5
        elif kind in ("stop", "stop_worker"):
            long_stop = rng.random() < (0.35 if HARSH else 0.12)
            event["stop_s"] = round((rng.uniform(11, 16) if HARSH else rng.uniform(22, 28)) if long_stop
                                    else rng.uniform(1, 8), 2)
            event["scope"] = "tree" if kind == "stop" and rng.random() < 0.6 else "one"
            if HARSH and kind == "stop" and event["scope"] == "one" and rng.random() < 0.5:
                event["scope"] = "below"  # the processes under the main one only (the store's writer)
            total += event["stop_s"]
        elif kind == "kill_in_delivery":
            event["how"] = rng.choice(["poll", "broker_stop"])
            event["down_s"] = round(rng.uniform(0, 2), 2)
            total += 8
        elif kind == "kill_worker":
            event["index"] = rng.randrange(workers)
        total += gap
        events.append(event)
    return events


# ---- processes -------------------------------------------------------------------------------------------


def tree(server: TcServerProcess) -> list[int]:
    assert server.proc is not None
    return [server.proc.pid, *descendants_of(server.proc.pid)]


def children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found.extend(int(c) for c in (task / "children").read_text().split())
    except OSError:
        pass
    return found


def signal_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_tree(server: TcServerProcess) -> None:
    """SIGKILL tc-server and every process under it (what a container's OOM kill does), by pid."""
    if server.proc is None or server.proc.poll() is not None:
        return
    pids = tree(server)
    signal_pids(pids, signal.SIGKILL)
    server.proc.wait(10)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in pids[1:]):
        assert time.monotonic() < deadline, f"processes {pids} outlived SIGKILL"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def undelivered(server: TcServerProcess) -> list[Any] | None:
    try:
        code, body = server.get_json("/admin/v3/transactions/undelivered", timeout_s=3.0)
    except OSError:
        return None
    if code != 200:
        return None
    return list(body) if isinstance(body, list) else list((body or {}).get("transactions", []))


def active_count(server: TcServerProcess) -> float | None:
    try:
        code, body = server.get("/metrics", timeout_s=5.0)
    except OSError:
        return None
    if code != 200:
        return None
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith("pulsar_txn_active_count{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def input_backlog(broker: PulsarBroker, topic: str) -> int | None:
    tenant, namespace, local = split_topic(topic)
    code, stats = broker.get_json(f"/admin/v2/persistent/{tenant}/{namespace}/{local}/partitioned-stats")
    if code != 200 or not isinstance(stats, dict):
        return None
    sub = stats.get("subscriptions", {}).get(SUBSCRIPTION)
    return None if sub is None else int(sub.get("msgBacklog", -1))


def subscription_view(broker: PulsarBroker, topic: str) -> dict[str, Any]:
    """Per partition: the subscription's backlog, replay and unacked counts, its cursor's positions."""
    tenant, namespace, local = split_topic(topic)
    view: dict[str, Any] = {}
    for i in range(PARTITIONS):
        base = f"/admin/v2/persistent/{tenant}/{namespace}/{local}-partition-{i}"
        _, stats = broker.get_json(base + "/stats")
        _, internal = broker.get_json(base + "/internalStats")
        sub = (stats or {}).get("subscriptions", {}).get(SUBSCRIPTION, {})
        cursor = (internal or {}).get("cursors", {}).get(SUBSCRIPTION, {})
        view[f"partition-{i}"] = {
            "backlog": sub.get("msgBacklog"), "msgInReplay": sub.get("msgInReplay"),
            "unacked": sub.get("unackedMessages"),
            "consumers": [(c.get("consumerName"), c.get("availablePermits"), c.get("unackedMessages"))
                          for c in sub.get("consumers", [])],
            "markDelete": cursor.get("markDeletePosition"), "read": cursor.get("readPosition"),
            "lastConfirmed": (internal or {}).get("lastConfirmedEntry"),
            # What tells the broker's stall (module text: a normal read parked at the tail, its rewind never run)
            # from positions held by a pending ack.
            "waitingReadOp": cursor.get("waitingReadOp"), "pendingReadOps": cursor.get("pendingReadOps"),
            "havePendingRead": cursor.get("subscriptionHavePendingRead"),
            "havePendingReplayRead": cursor.get("subscriptionHavePendingReplayRead"),
            "individuallyDeleted": str(cursor.get("individuallyDeletedMessages"))[:300]}
    return view


def _position(text: Any) -> tuple[int, int]:
    ledger, _, entry = str(text).partition(":")
    return int(ledger), int(entry)


def parked_at_the_tail(view: dict[str, Any]) -> list[int]:
    """The partitions with a backlog, if every one of them shows the 4.2.4 broker's stall (module text): a
    normal read waiting at the end of the ledger, no replay read, nothing in replay and nothing unacked. Empty if
    any stalled partition looks otherwise (then the test fails: not a known hole)."""
    stalled = [int(name.rsplit("-", 1)[1]) for name, p in view.items() if p.get("backlog")]
    for i in stalled:
        p = view[f"partition-{i}"]
        try:
            at_tail = _position(p["read"]) > _position(p["lastConfirmed"])
        except (KeyError, ValueError):
            return []
        if not (at_tail and p.get("waitingReadOp") and p.get("havePendingRead") and not p.get("havePendingReplayRead")
                and p.get("msgInReplay") == 0 and p.get("unacked") == 0):
            return []
    return stalled


def nudge(broker: PulsarBroker, topic: str, partitions: list[int], inputs: list[str]) -> None:
    """One more input to each of ``partitions`` (straight to the partition; an input like any other, so the
    exactly-once checks cover it): a dispatcher parked at the tail reads again once a message arrives."""
    with input_client(broker) as client:
        for i in partitions:
            value = f"in-{len(inputs)}"
            client.create_producer(f"{topic}-partition-{i}", schema=pulsar.schema.StringSchema()).send(value)
            inputs.append(value)


def feed(broker: PulsarBroker, topic: str, inputs: list[str], count: int) -> None:
    more = [f"in-{n}" for n in range(len(inputs), len(inputs) + count)]
    with input_client(broker) as client:
        producer = client.create_producer(topic, schema=pulsar.schema.StringSchema(), batching_enabled=False,
                                          message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
        for value in more:
            producer.send_async(value, lambda res, msg_id: None)
        producer.flush()
    inputs.extend(more)


@contextmanager
def input_client(broker: PulsarBroker) -> Iterator[pulsar.Client]:
    """The client that writes the app's inputs (feed, nudge), straight to the broker; closed on leaving."""
    client = pulsar.Client(broker.url, operation_timeout_seconds=60,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        yield client
    finally:
        client.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    return read_events_text(path.read_text(errors="replace"))


def committed_so_far(path: Path) -> int:
    """How many txns the app at ``path`` has logged as committed."""
    return sum(1 for e in read_events(path) if e.get("ev") == "committed")


# ---- the chaos driver ------------------------------------------------------------------------------------


class Chaos:
    def __init__(self, server: TcServerProcess, broker: PulsarBroker, workers: int) -> None:
        self.server = server
        self.broker = broker
        self.workers = workers
        self.stopped: list[int] = []
        self.counts: Counter[str] = Counter()
        self.notes: list[str] = []

    def cont_all(self) -> None:
        signal_pids(self.stopped, signal.SIGCONT)
        self.stopped = []

    def restart(self) -> None:
        self.server.start(timeout_s=90)

    def run(self, event: dict[str, Any], rng: random.Random) -> None:
        kind = event["kind"]
        try:
            getattr(self, kind)(event, rng)
        finally:
            self.cont_all()
        self.counts[kind] += 1

    def kill(self, event: dict[str, Any], rng: random.Random) -> None:
        if event.get("scope") == "main":
            below = tree(self.server)[1:]
            self.server.kill()  # SIGKILL of its pid, reaped; what is under it ends by itself
            deadline = time.monotonic() + 30
            while any(_state(pid) != "Z" for pid in below) and time.monotonic() < deadline:
                time.sleep(0.05)
            if any(_state(pid) != "Z" for pid in below):
                self.notes.append(f"processes {below} outlived their parent by 30 s")
                signal_pids(below, signal.SIGKILL)
        else:
            kill_tree(self.server)
        time.sleep(event["down_s"])
        self.restart()

    def stop(self, event: dict[str, Any], rng: random.Random) -> None:
        pids = {"tree": tree(self.server)[0:], "below": tree(self.server)[1:]}.get(
            event["scope"], [self.server.proc.pid])  # type: ignore[union-attr]
        self.stopped = pids
        signal_pids(pids, signal.SIGSTOP)
        time.sleep(event["stop_s"])
        self.cont_all()

    def stop_worker(self, event: dict[str, Any], rng: random.Random) -> None:
        workers = children(self.server.proc.pid)  # type: ignore[union-attr]
        if not workers:
            self.notes.append("stop_worker: no worker found")
            return
        pid = rng.choice(workers)
        self.stopped = [pid]
        signal_pids([pid], signal.SIGSTOP)
        time.sleep(event["stop_s"])
        self.cont_all()

    def kill_worker(self, event: dict[str, Any], rng: random.Random) -> None:
        workers = sorted(children(self.server.proc.pid))  # type: ignore[union-attr]
        if not workers:
            self.notes.append("kill_worker: no worker found")
            return
        pid = workers[event["index"] % len(workers)]
        signal_pids([pid, *descendants_of(pid)], signal.SIGKILL)
        # the supervisor restarts it; wait until ready again
        deadline = time.monotonic() + 90
        time.sleep(1.0)
        while self.server.status("/readyz") != 200 and time.monotonic() < deadline:
            time.sleep(0.2)

    def kill_in_delivery(self, event: dict[str, Any], rng: random.Random) -> None:
        held: list[Any] | None = None
        if event["how"] == "poll":
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                held = undelivered(self.server)
                if held:
                    break
                time.sleep(0.01)
            kill_tree(self.server)
        else:
            assert self.broker.proc is not None
            broker_pid = self.broker.proc.pid
            self.stopped = [broker_pid]
            os.kill(broker_pid, signal.SIGSTOP)
            try:
                deadline = time.monotonic() + 8
                while time.monotonic() < deadline:
                    held = undelivered(self.server)
                    if held:
                        break
                    time.sleep(0.05)
                kill_tree(self.server)
            finally:
                self.cont_all()
        if held:
            self.counts["kill_in_delivery_caught"] += 1
            self.notes.append(f"killed with {len(held)} undelivered, first {held[0].get('txnId', held[0])}"
                              if isinstance(held[0], dict) else f"killed with {len(held)} undelivered")
        time.sleep(event["down_s"])
        self.restart()


# ---- the test --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_exactly_once_under_chaos(pulsar_broker: PulsarBroker, java_classes: Path, tmp_path: Path,
                                  workers: int) -> None:
    broker = pulsar_broker
    broker.create_namespace(NAMESPACE, {} if DIRECT else {"deduplicationEnabled": True})
    source = new_topic(broker, f"chaos-in-w{workers}", PARTITIONS, NAMESPACE)
    sink = new_topic(broker, f"chaos-out-w{workers}", PARTITIONS, NAMESPACE)
    events = [] if CONTROL else schedule(SEED, workers, CHAOS_SECONDS)
    log(f"PROFILE={'harsh' if HARSH else 'default'} DIRECT={DIRECT} CONTROL={CONTROL} SEED={SEED} workers={workers} "
        f"CHAOS_SECONDS={CHAOS_SECONDS} source={source} sink={sink}")
    for i, event in enumerate(events):
        log(f"  schedule[{i}] {json.dumps(event)}")
    rng = random.Random(SEED + 7 * workers)

    server = TcServerProcess(tmp_path / "data", "--upstream-url", broker.url, "--coordinators", "16",
                             "--workers", str(workers), *(["--lookup-connections", "direct"] if DIRECT else []),
                             log_path=tmp_path / "tc-server.log")
    server.start(timeout_s=90)
    try:
        run_soak(server, broker, java_classes, tmp_path, workers, source, sink, events, rng)
    finally:
        kill_tree(server)


def run_soak(server: TcServerProcess, broker: PulsarBroker, java_classes: Path, tmp_path: Path, workers: int,
             source: str, sink: str, events: list[dict[str, Any]], rng: random.Random) -> None:
    chaos = Chaos(server, broker, workers)
    inputs: list[str] = []
    feed(broker, source, inputs, INITIAL_INPUTS)
    until = tmp_path / "stop-worker"
    out_path = tmp_path / "worker.out"
    jtmp = tmp_path / "java-tmp"
    jtmp.mkdir()
    worker = subprocess.Popen(
        java_cmd(java_classes, jtmp, "work", broker.url if CONTROL else server.url, source, sink, str(until),
                 str(SEED), str(THREADS), str(ABORT_PERCENT), str(TXN_TIMEOUT_MS)),
        stdout=out_path.open("wb"), stderr=(tmp_path / "worker.err").open("wb"), start_new_session=True)
    t0 = time.monotonic()
    feeding = threading.Event()
    nudges: list[list[int]] = []  # the partitions nudged, per stall of the broker's kind (chaos and drain)

    def feeder() -> None:
        # The only writer of inputs while the chaos runs: feed and nudge number them from len(inputs).
        commits, since = -1, time.monotonic()
        while not feeding.is_set():
            backlog = input_backlog(broker, source)
            if backlog is not None and backlog < LOW_BACKLOG:
                feed(broker, source, inputs, TOP_UP)
            now_commits = committed_so_far(out_path)
            if now_commits != commits:
                commits, since = now_commits, time.monotonic()
            elif time.monotonic() - since > CHAOS_STALL_S:
                view = subscription_view(broker, source)
                if parked := parked_at_the_tail(view):
                    log(f"no commit for {time.monotonic() - since:.0f}s with every stalled partition parked at its "
                        f"tail (the broker's, module text): one more input to partitions {parked}")
                    nudge(broker, source, parked, inputs)
                    nudges.append(parked)
                since = time.monotonic()
            feeding.wait(2.0)

    feeder_thread = threading.Thread(target=feeder, daemon=True)
    try:
        deadline = time.monotonic() + 180
        while not any(e.get("ev") == "ready" for e in read_events(out_path)):
            assert worker.poll() is None, (tmp_path / "worker.err").read_text()[-3000:]
            assert time.monotonic() < deadline, "worker not ready"
            time.sleep(0.5)
        log("worker ready")
        feeder_thread.start()
        for i, event in enumerate(events):
            time.sleep(event["gap"])
            backlog = input_backlog(broker, source)
            so_far = committed_so_far(out_path)
            log(f"event {i} {event['kind']} (committed so far {so_far}, backlog {backlog}, "
                f"inputs {len(inputs)})")
            chaos.run(event, rng)
            assert worker.poll() is None, "worker exited"
        if CONTROL:
            time.sleep(CHAOS_SECONDS)
        feeding.set()
        feeder_thread.join(120)
        assert not feeder_thread.is_alive(), "the feeder is stuck"
        log(f"chaos over after {time.monotonic() - t0:.0f}s: {dict(chaos.counts)}; draining")
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        backlog = input_backlog(broker, source)
        last_change, last_backlog = time.monotonic(), backlog
        drain_nudges = 0
        while backlog != 0:
            assert worker.poll() is None, "worker exited"
            if backlog != last_backlog:
                last_change, last_backlog = time.monotonic(), backlog
            if time.monotonic() > deadline or time.monotonic() - last_change > STALL_S:
                view = subscription_view(broker, source)
                parked = parked_at_the_tail(view) if time.monotonic() <= deadline else []
                if parked and drain_nudges < MAX_NUDGES:
                    log(f"input backlog stuck at {backlog} with every stalled partition parked at its tail (the "
                        f"broker's, module text): one more input to partitions {parked}; view {json.dumps(view)}")
                    nudge(broker, source, parked, inputs)
                    nudges.append(parked)
                    drain_nudges += 1
                    last_change = time.monotonic()
                    continue
                pytest.fail(f"input backlog stuck at {backlog} for {time.monotonic() - last_change:.0f}s with the "
                            f"worker idle in receive() (nudges so far: {nudges}); the broker's view of the "
                            f"subscription:\n{json.dumps(view)}\n{server.log_tail()}")
            time.sleep(2)
            backlog = input_backlog(broker, source)
        log("input drained")
    finally:
        feeding.set()
        chaos.cont_all()
        until.touch()
        try:
            worker.wait(240)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)

    wevents = read_events(out_path)
    fatal = [e for e in wevents if e.get("ev") == "fatal"]
    assert not fatal, fatal

    # tc-server's outbox drains, no txn stays active
    deadline = time.monotonic() + 180
    held = undelivered(server)
    while held != [] and time.monotonic() < deadline:
        time.sleep(1)
        held = undelivered(server)
    active = active_count(server)
    while active != 0 and time.monotonic() < deadline:
        time.sleep(1)
        active = active_count(server)
    broker_open = wait_no_open_txns(broker, [(source, PARTITIONS, SUBSCRIPTION), (sink, PARTITIONS, None)],
                                    timeout_s=120)

    # the committed output, read from the broker at read_committed
    verify_sub = f"verify-{uuid.uuid4().hex[:6]}"
    drained_run = subprocess.run(java_cmd(java_classes, jtmp, "drain", broker.url, sink, verify_sub),
                                 capture_output=True, timeout=600)
    drained = [e for e in read_events_text(drained_run.stdout.decode()) if e.get("ev") == "drained"]
    assert drained, drained_run.stderr.decode()[-3000:]
    values: list[str] = drained[0]["values"]
    markers_missing = drained[0]["markers_missing"]

    # what the app saw, per txn
    by_txn: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in wevents:
        if "txn" in e:
            by_txn[e["txn"]].append(e)
    committed = {e["txn"]: e["inputs"] for e in wevents if e.get("ev") == "committed"}
    confirmed_aborted = {e["txn"]: e for e in wevents
                         if e.get("ev") in ("deliberate", "failure") and e.get("end") == "aborted"}
    refused = {e["txn"]: e for e in wevents if e.get("ev") == "failure" and e.get("end") == "commit-refused"}
    unknown = {e["txn"]: e for e in wevents
               if e.get("ev") == "failure" and e.get("end") not in ("aborted", "commit-refused")}

    pat = re.compile(r"^out:(in-\d+)\|(-?\d+:-?\d+)$")
    visible: dict[str, list[str]] = defaultdict(list)  # txn -> inputs visible
    per_input: Counter[str] = Counter()
    malformed = []
    for v in values:
        m = pat.match(v)
        if not m:
            malformed.append(v)
            continue
        per_input[m.group(1)] += 1
        visible[m.group(2)].append(m.group(1))
    problems: dict[str, Any] = {}
    missing = [i for i in inputs if per_input[i] == 0]
    dup = {i: n for i, n in per_input.items() if n > 1}
    extra = sorted(set(per_input) - set(inputs))
    if missing:
        problems["missing"] = (len(missing), missing[:20])
    if dup:
        dup_txns = {i: [t for t, ins in visible.items() if i in ins] for i in list(dup)[:20]}
        problems["duplicated"] = (len(dup), dup_txns)
    if extra or malformed:
        problems["unexpected"] = (extra[:20], malformed[:20])
    aborted_visible = {t: visible[t] for t in visible if t in confirmed_aborted}
    if aborted_visible:
        problems["visible_from_confirmed_abort"] = {t: (confirmed_aborted[t], visible[t])
                                                    for t in list(aborted_visible)[:10]}
    # A txn the app never asked to commit (aborted deliberately, or failed before its commit) must never be
    # visible, whatever its abort answered.
    never_committed = {e["txn"]: e for e in wevents
                       if e.get("ev") == "deliberate" or (e.get("ev") == "failure" and e.get("stage") != "commit")}
    uncommitted_visible = {t: (never_committed[t], visible[t]) for t in visible if t in never_committed}
    if uncommitted_visible:
        problems["visible_without_commit_request"] = dict(list(uncommitted_visible.items())[:10])
    refused_visible = {t: visible[t] for t in visible if t in refused}
    if refused_visible:
        problems["visible_from_refused_commit"] = {t: (refused[t], visible[t]) for t in list(refused_visible)[:10]}
    partial_commits = {t: (sorted(ins), sorted(visible.get(t, []))) for t, ins in committed.items()
                       if sorted(ins) != sorted(visible.get(t, []))}
    if partial_commits:
        problems["committed_not_visible_whole"] = dict(list(partial_commits.items())[:10])
    partial_unknown = {t: (sorted(e["inputs"]), sorted(visible[t])) for t, e in unknown.items()
                       if t in visible and sorted(e["inputs"]) != sorted(visible[t])}
    if partial_unknown:
        problems["unknown_outcome_partially_visible"] = dict(list(partial_unknown.items())[:10])
    no_record = [t for t in visible if t not in by_txn]
    if no_record:
        problems["visible_txn_unknown_to_app"] = no_record[:10]
    if markers_missing:
        problems["pinned_partitions(markers_missing)"] = markers_missing
    if held != []:
        problems["undelivered_not_drained"] = held[:5] if held else held
    if active != 0:
        problems["pulsar_txn_active_count"] = active
    if broker_open:
        problems["broker_open_txns"] = broker_open

    # the audit, on the store(s) of a stopped server
    server.stop(timeout_s=60)
    audits = run_audit(tmp_path, workers)
    bad_audits = {k: v for k, v in audits.items() if v[0] != 0}
    if bad_audits:
        problems["audit"] = bad_audits

    errors = [e for e in read_events(server.log_path) if e.get("level") in ("error", "critical")]
    failures = Counter((e.get("stage"), e.get("end")) for e in wevents if e.get("ev") == "failure")
    deliberate = Counter(e.get("end") for e in wevents if e.get("ev") == "deliberate")
    log(f"SUMMARY seed={SEED} workers={workers}: inputs={len(inputs)} committed_txns={len(committed)} "
        f"committed_inputs={sum(len(v) for v in committed.values())} deliberate_aborts={dict(deliberate)} "
        f"failures={dict(failures)} commit_retries={sum(1 for e in wevents if e.get('ev') == 'commit-retry')} "
        f"chaos={dict(chaos.counts)} notes={chaos.notes[:10]} broker_stalls_nudged={nudges} "
        f"server_error_lines={len(errors)} "
        f"audit={ {k: v[0] for k, v in audits.items()} }")
    for e in errors[:10]:
        log(f"  server error line: {json.dumps(e)[:400]}")
    assert problems == {}, json.dumps(problems, default=str)[:8000]


def read_events_text(text: str) -> list[dict[str, Any]]:
    out = []
    for raw in text.splitlines():
        if raw.startswith("{"):
            try:
                out.append(json.loads(raw))
            except ValueError:
                pass
    return out


def run_audit(tmp_path: Path, workers: int) -> dict[str, tuple[int, str]]:
    bindir = Path(sys.executable).parent
    data = tmp_path / "data"
    dirs = [data] if workers == 1 else sorted(p for p in data.iterdir() if p.is_dir() and p.name.startswith("worker-"))
    results: dict[str, tuple[int, str]] = {}
    for d in dirs:
        snap = tmp_path / f"snap-{d.name}"
        out = tmp_path / f"audit-{d.name}"
        shutil.rmtree(snap, ignore_errors=True)
        exp = subprocess.run([str(bindir / "tc-server"), "export", "--store", "embedded", "--data-dir", str(d),
                              "--out", str(snap)], capture_output=True, timeout=600)
        if exp.returncode != 0:
            results[d.name] = (100 + exp.returncode, exp.stderr.decode()[-2000:])
            continue
        aud = subprocess.run([str(bindir / "tc-audit"), "--input", str(snap), "--output", str(out)],
                             capture_output=True, timeout=900)
        summary = ""
        try:
            summary = json.dumps(json.loads((out / "summary.json").read_text()).get("violations"))
        except (OSError, ValueError):
            summary = aud.stderr.decode()[-2000:]
        results[d.name] = (aud.returncode, summary)
        log(f"audit {d.name}: exit {aud.returncode} violations {summary}")
    return results
