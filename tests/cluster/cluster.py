"""A real two-broker Pulsar 4.2.4 cluster on loopback, from the jars ``make pulsar-broker`` resolves.

Node A is ``PulsarStandaloneStarter`` in its ZooKeeper mode: ZooKeeper, one bookie and broker A in one JVM.
Standalone picks ZooKeeper (instead of RocksDB) when its ``--zookeeper-dir`` already exists
(PulsarStandalone.start), so the launcher creates that directory first; broker A's metadataStoreUrl
becomes ``zk:localhost:<zk port>``, and standalone creates the cluster, public/default and pulsar/system.
Node B is ``org.apache.pulsar.PulsarBrokerStarter`` (a plain broker) with metadataStoreUrl and
configurationMetadataStoreUrl = ``zk:127.0.0.1:<A's zk port>`` and the same clusterName: it finds A's
bookie through ZooKeeper, and the two brokers split namespace bundles. Both have
transactionCoordinatorEnabled (the transaction buffer needs it), lean JVMs (512 MB heap, C1, serial GC),
no load shedding or bundle splitting, and a 10 s metadata session (a killed broker's bundles go to the
other one ~10 s later).

Killing B (SIGKILL) leaves the cluster with A; killing A takes the metadata store and the bookie down too,
so the fault tests kill B.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tc_server.bench.process import free_port
from tc_server.bench.pulsar_broker import PulsarBroker, split_topic

# Two JVMs on a shared 2-core machine: smaller heaps than the project's single broker.
LEAN_JVM = ["-Xmx512m", "-XX:MaxDirectMemorySize=512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]

COMMON = {
    # Keep ownership where the tests put it: no automatic bundle shedding or splitting.
    "loadBalancerSheddingEnabled": "false",
    "loadBalancerAutoBundleSplitEnabled": "false",
    "loadBalancerAutoUnloadSplitBundlesEnabled": "false",
    "brokerDeleteInactiveTopicsEnabled": "false",
    # No __change_events readers: a bundle unloaded to a destinationBroker that holds a namespace's
    # __change_events left its reader looping on "not served by this instance" and every topic load of
    # the namespace waiting for topic policies (admin stats timed out).
    "topicLevelPoliciesEnabled": "false",
    "numIOThreads": "2",
    "numHttpServerThreads": "4",
    # A killed broker's ownership (ephemeral ZooKeeper nodes) goes with its session: 10 s, not 30 s.
    "metadataStoreSessionTimeoutMillis": "10000",
}


class ZkStandaloneBroker(PulsarBroker):
    """Node A: ZooKeeper + bookie + broker A."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, extra_config=COMMON, jvm_options=LEAN_JVM)
        self.zk_port = free_port()
        self.stream_port = free_port()

    def storage_args(self) -> list[str]:
        zk_dir = self.workdir / "zookeeper"
        zk_dir.mkdir(parents=True, exist_ok=True)  # its existence selects ZooKeeper mode
        return ["--zookeeper-port", str(self.zk_port), "--zookeeper-dir", str(zk_dir),
                "--bookkeeper-dir", str(self.workdir / "bookkeeper"), "--bookkeeper-port", str(self.bookie_port),
                "--stream-storage-port", str(self.stream_port), "--num-bookies", "1"]


class SecondBroker(PulsarBroker):
    """Node B: ``org.apache.pulsar.PulsarBrokerStarter`` (a plain broker, not standalone: standalone's
    --only-broker mode runs with runningStandalone=true, and with it lookups of bundles owned by A were
    answered with B, which then refused them as "not served by this instance"), on A's ZooKeeper, so
    A's bookie and cluster."""

    STOPPED_LINES = (PulsarBroker.STOPPED_LINES[1],)

    def __init__(self, workdir: Path, first: ZkStandaloneBroker) -> None:
        super().__init__(workdir, extra_config=COMMON, jvm_options=LEAN_JVM)
        self.first = first
        self.config_path = workdir / "broker.conf"

    def config(self) -> dict[str, str]:
        settings = super().config()
        zk = f"zk:127.0.0.1:{self.first.zk_port}"
        settings.update({"metadataStoreUrl": zk, "configurationMetadataStoreUrl": zk,
                         "bookkeeperNumberOfChannelsPerBookie": "1"})
        return settings

    def command(self, java: str) -> list[str]:
        cmd = super().command(java)
        main = cmd.index("org.apache.pulsar.PulsarStandaloneStarter")
        return [*cmd[:main], "org.apache.pulsar.PulsarBrokerStarter", "--broker-conf", str(self.config_path)]

    def storage_args(self) -> list[str]:
        return []

    def _scale_coordinators(self, deadline: float) -> None:
        """A already scaled the (shared) assign topic."""


def broker_id(broker: PulsarBroker) -> str:
    """What the load manager calls a broker (its lookupServiceAddress): advertised host and web port."""
    return f"127.0.0.1:{broker.web_port}"


def put_following(broker: PulsarBroker, path: str, hops: int = 5) -> tuple[int, Any]:
    """PUT ``path`` and follow 307 redirects (urllib follows them for GET only)."""
    url = broker.admin_url + path
    for _ in range(hops):
        req = urllib.request.Request(url, method="PUT", headers={"Accept": "application/json"})  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - loopback
                return int(resp.status), resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            if exc.code in (301, 302, 307, 308) and exc.headers.get("Location"):
                url = exc.headers["Location"]
                continue
            return int(exc.code), exc.read().decode(errors="replace")
    return 307, f"too many redirects for {path}"


class TwoBrokerCluster:
    def __init__(self, workdir: Path) -> None:
        self.a = ZkStandaloneBroker(workdir / "a")
        self.b = SecondBroker(workdir / "b", self.a)

    @property
    def brokers(self) -> list[PulsarBroker]:
        return [self.a, self.b]

    def start(self) -> TwoBrokerCluster:
        self.a.start()
        self.b.start()
        self.wait_active_brokers(2)
        return self

    def kill(self) -> None:
        self.b.kill()
        self.a.kill()

    def admin(self) -> PulsarBroker:
        """A broker that is running, for admin calls (they are redirected to the owner as needed)."""
        for broker in (self.a, self.b):
            if broker.running():
                return broker
        raise RuntimeError("no broker is running")

    def wait_active_brokers(self, n: int, timeout_s: float = 90.0) -> list[str]:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                code, body = self.admin().get_json("/admin/v2/brokers/standalone")
                last = (code, body)
                if code == 200 and isinstance(body, list) and len(body) >= n:
                    return list(body)
            except OSError as exc:
                last = exc
            time.sleep(0.5)
        raise AssertionError(f"{n} active brokers not seen in {timeout_s}s: {last}")

    # ---- ownership ------------------------------------------------------------------------------

    def owner_url(self, topic: str) -> str:
        """The brokerUrl that owns ``topic`` now (admin lookup, which loads/assigns it)."""
        tenant, ns, local = split_topic(topic)
        path = f"/lookup/v2/topic/persistent/{tenant}/{ns}/{urllib.parse.quote(local, safe='')}"
        code, body = self.admin().get_json(path)
        assert code == 200, (topic, code, body)
        return str(body["brokerUrl"])

    def owner_of(self, topic: str) -> PulsarBroker:
        url = self.owner_url(topic)
        for broker in self.brokers:
            if broker.url == url:
                return broker
        raise AssertionError(f"{topic} owned by {url}, none of ours")

    def bundle_of(self, topic: str) -> str:
        tenant, ns, local = split_topic(topic)
        code, body = self.admin().get_json(
            f"/lookup/v2/topic/persistent/{tenant}/{ns}/{urllib.parse.quote(local, safe='')}/bundle")
        assert code == 200, (topic, code, body)
        return str(body) if not isinstance(body, dict) else str(body.get("bundle", body))

    def unload_bundle(self, namespace: str, bundle: str, to: PulsarBroker | None = None,
                      via: PulsarBroker | None = None) -> None:
        """Unload ``bundle`` (sent to ``via``, its owner: the broker answers 307 elsewhere), to ``to``."""
        query = "" if to is None else "?" + urllib.parse.urlencode({"destinationBroker": broker_id(to)})
        code, body = put_following(via or self.admin(), f"/admin/v2/namespaces/{namespace}/{bundle}/unload{query}")
        assert code in (200, 204), (namespace, bundle, code, body)

    def move_topic(self, topic: str, to: PulsarBroker, timeout_s: float = 90.0) -> None:
        """Unload the bundle of ``topic`` to broker ``to`` (``destinationBroker``: ModularLoadManagerImpl's
        bundle affinity) until a lookup names ``to``.

        A plain unload does not do: with bundles spread evenly per namespace the broker that loses the
        bundle has the fewest and gets it back (273 unloads in a row). Never move the bundle holding the
        namespace's __transaction_buffer_snapshot / __change_events (support.spread_topic avoids them):
        after that, lookups named a broker that answered "not served by this instance" for them for good."""
        tenant, ns, _ = split_topic(topic)
        deadline = time.monotonic() + timeout_s
        owner = self.owner_url(topic)
        tries = 0
        while owner != to.url:
            assert time.monotonic() < deadline, f"{topic} did not move to {to.url} in {tries} unloads (owner {owner})"
            self.unload_bundle(f"{tenant}/{ns}", self.bundle_of(topic), to, via=self.owner_of(topic))
            tries += 1
            time.sleep(0.5)
            owner = self.owner_url(topic)
