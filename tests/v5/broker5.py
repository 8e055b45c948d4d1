"""A real Pulsar 5 (5.0.0-M1) standalone broker whose metadata store is an Oxia (the project's stand-in).

The jars come from Maven Central through ``make pulsar-broker5`` (mk/broker5.mk, tests/v5/pom.xml). It is
the 4.2.4 launcher (tc_server/bench/pulsar_broker.py) with what 5.x changes: Java 21+, no
``--bookkeeper-port`` (the bookie takes an ephemeral loopback port, which BookKeeper refuses unless
``allowLoopback``), and ``--metadata-url oxia://HOST:PORT/NAMESPACE`` instead of RocksDB, so that the
broker's v5 coordinator and participants share their records with tc-server. The v5 coordinator runs
with 16 partitions of its own (``/txn/tc/parallelism``), so the legacy coordinator is not scaled.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from tc_server.bench.pulsar_broker import (
    ADD_OPENS,
    QUICK_START_JVM,
    START_TIMEOUT_S,
    BrokerStartError,
    PulsarBroker,
    broker_jars,
)

BROKER5_LIB, BROKER5_STAMP = broker_jars("pulsar-broker5")
MAKE_COMMAND = "make pulsar-broker5"
JDK_ROOT = Path("/usr/lib/jvm")
# Pulsar 5 is compiled for class version 65.
MIN_JAVA = 21
# What the 5.x broker reflects into beyond what 4.2.4 needs (its load manager reads the container limits).
ADD_OPENS_5 = [*ADD_OPENS, "java.base/java.nio", "java.base/sun.nio.ch", "java.base/jdk.internal.platform"]


def java_major(java: str) -> int | None:
    """The feature version of the ``java`` binary (``java.specification.version``), None if it does not run."""
    try:
        out = subprocess.run([java, "-XshowSettings:properties", "-version"], capture_output=True, text=True,
                             timeout=60, check=False).stderr
    except OSError:
        return None
    for line in out.splitlines():
        name, _, value = line.strip().partition(" = ")
        if name == "java.specification.version" and value.split(".")[0].isdigit():
            return int(value.split(".")[0])
    return None


def find_java21() -> str:
    """``$TC_SERVER_JAVA21``, else the newest JDK under /usr/lib/jvm that is 21+. Raises BrokerStartError
    naming what was found otherwise (the machine's default java may well be 17)."""
    named = os.environ.get("TC_SERVER_JAVA21")
    candidates = [named] if named else [str(p) for p in sorted(JDK_ROOT.glob("*/bin/java"))]
    found = {java: java_major(java) for java in candidates}
    usable = [(major, java) for java, major in found.items() if major is not None and major >= MIN_JAVA]
    if not usable:
        raise BrokerStartError(
            f"no Java {MIN_JAVA}+ found (Pulsar 5 needs it): {found or 'no JDK under ' + str(JDK_ROOT)}; "
            f"install one (e.g. Temurin 21) or set TC_SERVER_JAVA21 to its java binary")
    return max(usable)[1]


class Pulsar5Broker(PulsarBroker):
    """One standalone Pulsar 5 broker under ``workdir`` on the Oxia at ``oxia_address`` (namespace default)."""

    LIB = BROKER5_LIB
    OPENS = tuple(ADD_OPENS_5)
    # A 5.0.0-M1 standalone's stop logs neither the bookie's shutdown hook nor PulsarService's "Closed": its
    # last line is the broker service's, and the JVM then stayed until the SIGKILL at STOP_TIMEOUT_S, every
    # time (measured: 30 s of the end-to-end test's restart). Its bookie is not closed either way: the next
    # start finds "Unclean shutdown detected" and waits out the registration (test_v5_sdk_e2e.py).
    STOPPED_LINES = (re.compile(r"BrokerService@\d+\] - Broker service completely shut down"),)

    def __init__(self, workdir: Path, oxia_address: str, extra_config: Mapping[str, str] | None = None) -> None:
        super().__init__(workdir, extra_config, jvm_options=QUICK_START_JVM)
        self.oxia_address = oxia_address

    @property
    def metadata_url(self) -> str:
        return f"oxia://{self.oxia_address}/default"

    def config(self) -> dict[str, str]:
        settings = super().config()
        del settings["metadataStoreUrl"]  # given on the command line
        settings["allowLoopback"] = "true"  # the embedded bookie listens on 127.0.0.1
        return settings

    def storage_args(self) -> list[str]:
        """The Oxia for the metadata; the bookie picks its own port."""
        return ["--metadata-url", self.metadata_url, "--bookkeeper-dir", str(self.workdir / "bookkeeper")]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Pulsar5Broker:
        """Start it (again: same ports, same data) and wait until its admin API serves ``public/default``.
        Raises BrokerStartError with the reason and the log tail."""
        if self.running():
            raise RuntimeError(f"the broker on port {self.port} is already running")
        java = find_java21()
        if not BROKER5_STAMP.exists():
            raise BrokerStartError(f"the Pulsar 5 broker jars are missing ({BROKER5_LIB}): run `{MAKE_COMMAND}`")
        self._launch(java)
        self._wait_serving(time.monotonic() + timeout_s)
        return self
