"""A real Apache Pulsar broker (standalone: broker + one bookie + RocksDB metadata) for the tests and
for the side-by-side benchmark (tc_server.bench.vs_pulsar).

The jars come from Maven Central through ``make pulsar-broker`` (mk/broker.mk, tests/broker/pom.xml);
this module starts ``org.apache.pulsar.PulsarStandaloneStarter`` with ``java -cp '<lib>/*'`` on
127.0.0.1 and free ports, with a configuration file of our own that holds only what differs from the
broker's defaults. ``restart()`` brings it back on the same ports and data, which is what a client
(or tc-server in front of it) sees when a broker is restarted.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tc_server.bench.process import (
    LoggedProcess,
    cpu_seconds_of,
    free_port,
    log_tail_of,
    spawn_logged,
    terminate_process,
)

# The jars are a development resource of the source checkout (like the tests), not of an installed package.
REPO = Path(__file__).resolve().parents[2]


def broker_jars(name: str) -> tuple[Path, Path]:
    """The lib/ directory a ``make`` target (mk/broker.mk, mk/broker5.mk) fills under .cache/``name``, and
    the stamp file it writes there only once every jar is in place."""
    return REPO / ".cache" / name / "lib", REPO / ".cache" / name / "lib.stamp"


BROKER_LIB, BROKER_STAMP = broker_jars("pulsar-broker")
MAKE_COMMAND = "make pulsar-broker"
MAIN_CLASS = "org.apache.pulsar.PulsarStandaloneStarter"
CLUSTER = "standalone"
ASSIGN_TOPIC = "persistent://pulsar/system/transaction_coordinator_assign"
# What a cluster gets; standalone creates the assign topic with one partition.
COORDINATORS = 16

# Heap and direct memory bounded: the machine (2 cores, 24 GiB) is shared with the tests and other JVMs.
# An idle standalone holds ~440 MB RSS, 700-850 MB under transaction load.
JVM_MEMORY = ["-Xmx1g", "-XX:MaxDirectMemorySize=1g"]
# What a broker that only has to start and serve a test adds to JVM_MEMORY: the client compiler alone (C1).
# Measured on this machine kind, idle, a standalone's start to serving: 10.9-11.4 s on 12.8-13.3 s of CPU
# against 13.5-15.6 s on 23.8-25.6 s with both compilers. Never for a benchmark: C2's code serves faster.
QUICK_START_JVM = [*JVM_MEMORY, "-XX:TieredStopAtLevel=1"]
# Modules the broker (netty, BookKeeper, the metrics of the JVM) reaches into on Java 17.
ADD_OPENS = [
    "java.base/java.lang", "java.base/java.io", "java.base/java.util", "java.base/sun.net",
    "java.base/jdk.internal.misc", "java.management/sun.management", "jdk.management/com.sun.management.internal",
]
# 5-7 s warm and 9 s cold on an idle 2-core machine; several times that while tests load both cores.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
# How long stop() lets a broker whose log says its stop is through (STOPPED_LINES) exit on its own.
CLOSED_GRACE_S = 1.0
# A new partition's transaction-buffer recovery can wait for its full 30 s timeout when it coincides
# with the broker compacting its snapshot topic; the bound is above that.
PARTITIONS_READY_TIMEOUT_S = 60.0
# States of org.apache.pulsar.broker.transaction.buffer.impl.TopicTransactionBufferState in which the
# buffer has recovered and delivers messages; before that (None, Initializing) every message of the
# partition is held back.
BUFFER_READY_STATES = frozenset({"Ready", "NoSnapshot", "FirstSnapshotting"})


class BrokerStartError(RuntimeError):
    """The broker cannot start or did not become ready; the message holds the reason and its log tail."""


class PulsarBroker(LoggedProcess):
    """One standalone broker under ``workdir`` (config, metadata, bookie data, log).

    ``extra_config`` adds or overrides broker settings (e.g. ``authenticationEnabled``); values are
    written as they are. ``admin_authorization`` is the ``Authorization`` header value the admin
    helpers send (``"Bearer <token>"``) when the broker checks credentials.
    """

    KILL_WAIT_S = 30.0
    # What a standalone logs once its stop is through, each line matched by one of these: the bookie's
    # shutdown hook, and the broker's service (PulsarService.close). After serving traffic the JVM then
    # stays for the rest of STOP_TIMEOUT_S (measured: both lines within ~1 s of SIGTERM, the process gone
    # only by the SIGKILL at 30 s); nothing is left to close, so stop() kills it CLOSED_GRACE_S after.
    STOPPED_LINES: tuple[re.Pattern[str], ...] = (re.compile(r"Closed component bookie-server in shutdown hook"),
                                                  re.compile(r"PulsarService@\d+\] - Closed\s*$"))
    # What ``command`` runs: the jars and the modules the JVM must open (a subclass's broker version).
    LIB = BROKER_LIB
    OPENS: tuple[str, ...] = tuple(ADD_OPENS)

    def __init__(self, workdir: Path, extra_config: Mapping[str, str] | None = None,
                 admin_authorization: str | None = None, jvm_options: Sequence[str] = JVM_MEMORY) -> None:
        self.workdir = workdir
        self.jvm_options = list(jvm_options)
        self.extra_config = dict(extra_config or {})
        self.admin_authorization = admin_authorization
        self.port = free_port()
        self.web_port = free_port()
        self.bookie_port = free_port()
        self.config_path = workdir / "standalone.conf"
        self.log_path = workdir / "broker.log"
        # The JVM's temporary files: each start unpacks RocksDB's native library (~12 MB) there and a
        # killed JVM never deletes it; under workdir it goes with the broker instead of filling /tmp.
        self.tmp_dir = workdir / "tmp"
        self.proc: subprocess.Popen[bytes] | None = None

    # ---- addresses ---------------------------------------------------------------------------------

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    # ---- life cycle --------------------------------------------------------------------------------

    def config(self) -> dict[str, str]:
        settings = {
            "clusterName": CLUSTER,
            "bindAddress": "127.0.0.1",
            "advertisedAddress": "127.0.0.1",
            "brokerServicePort": str(self.port),
            "webServicePort": str(self.web_port),
            # Transactions on: without the buffer a transactional send fails "Transaction buffer disable!".
            "transactionCoordinatorEnabled": "true",
            "systemTopicEnabled": "true",
            "functionsWorkerEnabled": "false",
            "managedLedgerDefaultEnsembleSize": "1",
            "managedLedgerDefaultWriteQuorum": "1",
            "managedLedgerDefaultAckQuorum": "1",
            # The embedded bookie otherwise binds a random port on every interface.
            "listeningInterface": "lo",
            "allowEphemeralPorts": "true",
            # Empty: standalone keeps its metadata in RocksDB under --metadata-dir, no ZooKeeper process.
            "metadataStoreUrl": "",
        }
        settings.update(self.extra_config)
        return settings

    def command(self, java: str) -> list[str]:
        opens = [arg for module in self.OPENS for arg in ("--add-opens", f"{module}=ALL-UNNAMED")]
        return [java, *self.jvm_options, "-Djava.net.preferIPv4Stack=true", f"-Djava.io.tmpdir={self.tmp_dir}", *opens,
                "-cp", f"{self.LIB}/*", MAIN_CLASS,
                "--config", str(self.config_path), "--no-functions-worker", "--no-stream-storage",
                *self.storage_args(), "--advertised-address", "127.0.0.1"]

    def storage_args(self) -> list[str]:
        """Where the metadata and the bookie's data go: RocksDB and a bookie port of our own."""
        return ["--metadata-dir", str(self.workdir / "metadata"), "--bookkeeper-dir", str(self.workdir / "bookkeeper"),
                "--bookkeeper-port", str(self.bookie_port)]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> PulsarBroker:
        """Start it (again: same ports and data) and wait until it serves with 16 coordinators.

        Raises BrokerStartError (with the log tail) when java or the jars are missing, the JVM exits, or
        it is not ready within ``timeout_s``.
        """
        if self.running():
            raise RuntimeError(f"the broker on port {self.port} is already running")
        java = shutil.which("java")
        if java is None:
            raise BrokerStartError("java not found on PATH: the broker needs a Java 17+ JDK")
        if not BROKER_STAMP.exists():
            raise BrokerStartError(f"the Pulsar broker jars are missing ({BROKER_LIB}): run `{MAKE_COMMAND}`")
        self._launch(java)
        deadline = time.monotonic() + timeout_s
        self._wait_serving(deadline)
        self._scale_coordinators(deadline)
        return self

    def _launch(self, java: str) -> None:
        """Write the configuration file and spawn the JVM (its output in ``log_path``); no waiting."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("".join(f"{key}={value}\n" for key, value in self.config().items()))
        self.proc = spawn_logged(self.command(java), self.log_path, stdin=subprocess.DEVNULL)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (the broker unloads its topics and closes the bookie); SIGKILL once the log says both
        are closed (STOPPED_LINES) and the JVM has not exited CLOSED_GRACE_S later, or after ``timeout_s``."""
        if self.proc is None:
            return
        logged_before = self.log_path.stat().st_size if self.log_path.exists() else 0
        terminate_process(self.proc, timeout_s, self.KILL_WAIT_S,
                          stopped=functools.partial(self._logged_stopped, logged_before), grace_s=CLOSED_GRACE_S)

    def _logged_stopped(self, offset: int) -> bool:
        """Whether the log, from ``offset`` on, has a line for each of STOPPED_LINES."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                lines = log.read().decode(errors="replace").splitlines()
        except OSError:
            return False
        return all(any(pattern.search(line) for line in lines) for pattern in self.STOPPED_LINES)

    def restart(self, timeout_s: float = START_TIMEOUT_S) -> PulsarBroker:
        """Stop it gracefully and start it again on the same ports and data."""
        self.stop()
        return self.start(timeout_s)

    def _check_alive(self, what: str) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise BrokerStartError(f"the broker exited with {code} while {what}\n{self.log_tail()}")

    def _wait_serving(self, deadline: float) -> None:
        """Until the admin API lists our cluster and the namespace clients use by default exists: the web
        server answers (with an empty cluster list) before standalone has created either."""
        last = "no answer"
        while time.monotonic() < deadline:
            self._check_alive("starting")
            try:
                code, clusters = self.get_json("/admin/v2/clusters")
                if code == 200 and CLUSTER in (clusters or []):
                    code, namespaces = self.get_json("/admin/v2/namespaces/public")
                    if code == 200 and "public/default" in (namespaces or []):
                        return
                last = f"HTTP {code}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.5)
        raise BrokerStartError(f"the broker's admin API was not ready in time (last: {last})\n{self.log_tail()}")

    def _scale_coordinators(self, deadline: float) -> None:
        """16 coordinators, as a cluster has. Right after start this fails until standalone has created
        the pulsar/system namespace, so it is retried; on a restart the topic already has 16."""
        last = ""
        while time.monotonic() < deadline:
            self._check_alive("scaling the transaction coordinators")
            try:
                code, body = self.get_json(self._topic_path(ASSIGN_TOPIC) + "/partitions")
                if code == 200 and isinstance(body, dict) and body.get("partitions", 0) >= COORDINATORS:
                    return
                code, body = self.post_json("/admin/v3/transactions/transactionCoordinator/replicas", COORDINATORS)
                last = f"HTTP {code}: {body}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.5)
        raise BrokerStartError(f"could not scale the coordinators to {COORDINATORS} (last: {last})\n"
                               f"{self.log_tail()}")

    # ---- admin REST --------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, timeout_s: float = 30.0) -> tuple[int, Any]:
        """One admin call; (status, parsed JSON body or None, or the raw text if it is not JSON).
        Raises OSError when nothing answers."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.admin_authorization is not None:
            headers["Authorization"] = self.admin_authorization
        req = urllib.request.Request(self.admin_url + path, data=data, method=method,  # noqa: S310 - loopback
                                     headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - loopback http
                return int(resp.status), _parse(resp.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), _parse(exc.read())

    def get_json(self, path: str) -> tuple[int, Any]:
        return self.request("GET", path)

    def put_json(self, path: str, body: Any = None) -> tuple[int, Any]:
        return self.request("PUT", path, body)

    def post_json(self, path: str, body: Any = None) -> tuple[int, Any]:
        return self.request("POST", path, body)

    @staticmethod
    def _topic_path(topic: str) -> str:
        """``persistent://tenant/ns/name`` -> ``/admin/v2/persistent/tenant/ns/name`` (name URL-quoted)."""
        tenant, namespace, local = split_topic(topic)
        return f"/admin/v2/persistent/{tenant}/{namespace}/{urllib.parse.quote(local, safe='')}"

    def create_namespace(self, namespace: str, policies: Mapping[str, Any]) -> None:
        """Create ``tenant/namespace`` with ``policies`` (the admin API's Policies fields, e.g.
        ``{"deduplicationEnabled": True}``), so every topic made in it afterwards starts with them. An
        existing namespace is left as it is. Raises AssertionError with the broker's answer when it
        refuses."""
        code, body = self.put_json(f"/admin/v2/namespaces/{namespace}", dict(policies))
        assert code in (200, 204, 409), f"creating namespace {namespace}: HTTP {code} {body}"

    def create_topic(self, topic: str, partitions: int = 0) -> None:
        """Create a persistent topic, partitioned when ``partitions`` > 0. Raises AssertionError with
        the broker's answer when it refuses."""
        path = self._topic_path(topic)
        if partitions > 0:
            code, body = self.put_json(path + "/partitions", partitions)
        else:
            code, body = self.put_json(path)
        assert code in (200, 204), f"creating {topic} ({partitions} partitions): HTTP {code} {body}"

    def wait_partitions_ready(self, topic: str, partitions: int,
                              timeout_s: float = PARTITIONS_READY_TIMEOUT_S) -> None:
        """Wait until the transaction buffer of every partition (of the topic itself when ``partitions``
        is 0) has recovered: until then the broker holds back every message on it.

        A partition is loaded lazily, so its topic stats are read first, which loads it; then
        ``/admin/v3/transactions/transactionBufferStats`` is polled for a ready state. Raises
        AssertionError with the last answer when the bound passes.
        """
        names = [topic] if partitions == 0 else [f"{topic}-partition-{i}" for i in range(partitions)]
        deadline = time.monotonic() + timeout_s
        for name in names:
            tenant, namespace, local = split_topic(name)
            stats_path = f"/admin/v3/transactions/transactionBufferStats/{tenant}/{namespace}/{local}"
            last: tuple[int, Any] = (0, None)
            while True:
                self.get_json(self._topic_path(name) + "/stats")
                last = self.get_json(stats_path)
                if last[0] == 200 and isinstance(last[1], dict) and last[1].get("state") in BUFFER_READY_STATES:
                    break
                assert time.monotonic() < deadline, (f"transaction buffer of {name} not ready within "
                                                     f"{timeout_s:.0f}s: {last}\n{self.log_tail()}")
                time.sleep(0.2)

    # ---- observation -------------------------------------------------------------------------------

    def cpu_seconds(self) -> float:
        """CPU time of the broker's JVM so far (broker, bookie and metadata store: standalone runs all
        three in this one process); NaN when it is not running."""
        if self.proc is None:
            return float("nan")
        return cpu_seconds_of(self.proc.pid)

    def log_tail(self, lines: int = 60) -> str:
        return log_tail_of(self.log_path, lines, "broker log")


def split_topic(topic: str) -> tuple[str, str, str]:
    """``persistent://tenant/ns/name`` -> (tenant, ns, name). Raises ValueError for another form."""
    rest = topic.removeprefix("persistent://")
    parts = rest.split("/", 2)
    if rest == topic or len(parts) != 3 or not all(parts):
        raise ValueError(f"not a persistent://tenant/namespace/name topic: {topic!r}")
    return parts[0], parts[1], parts[2]


def _parse(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
