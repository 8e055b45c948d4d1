"""Fixtures of the two-broker tests: a real cluster (cluster.py), tc-server processes of each test's own in
front of it, and the stock Java client harness (tests/interop)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tc_server.bench.process import TcServerProcess
from tc_server.bench.pulsar_broker import PulsarBroker
from tests.cluster.cluster import TwoBrokerCluster
from tests.interop.conftest import java_harness
from tests.support.server_process import started

__all__ = ["java_harness"]

COORDINATORS = 16


@pytest.fixture
def two_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoBrokerCluster]:
    cluster = TwoBrokerCluster(tmp_path_factory.mktemp("two-brokers"))
    try:
        cluster.start()
    except Exception as exc:  # noqa: BLE001 - the logs say why
        cluster.kill()
        pytest.fail(f"the two-broker cluster did not start: {exc}\n{cluster.a.log_tail()}\n{cluster.b.log_tail()}")
    yield cluster
    cluster.kill()


@pytest.fixture
def cluster(two_brokers: TwoBrokerCluster) -> Iterator[TwoBrokerCluster]:
    """A fresh cluster for each test (unloads and kills leave a cluster's system topics in states that made
    the next tests' transaction buffers hang in Initializing), both brokers running."""
    for broker in two_brokers.brokers:
        if not broker.running():
            broker.start()
    two_brokers.wait_active_brokers(2)
    yield two_brokers
    for broker in two_brokers.brokers:
        if not broker.running():
            broker.start()


@pytest.fixture
def tc_front(cluster: TwoBrokerCluster, tmp_path: Path) -> Iterator[Callable[..., TcServerProcess]]:
    """tc-server in front of the cluster: ``tc_front(upstream, *args)``; ``upstream`` is "a", "b" or "both"."""
    servers: list[TcServerProcess] = []

    def start(upstream: str, *extra: str) -> TcServerProcess:
        choices: dict[str, list[PulsarBroker]] = {"a": [cluster.a], "b": [cluster.b], "both": [cluster.a, cluster.b]}
        hosts = choices[upstream]
        url = "pulsar://" + ",".join(f"127.0.0.1:{b.port}" for b in hosts)
        n = len(servers)
        server = TcServerProcess(tmp_path / f"tc{n}" / "data", "--upstream-url", url, "--coordinators",
                                 str(COORDINATORS), *extra, log_path=tmp_path / f"tc{n}.log")
        servers.append(started(server))
        return server

    yield start
    for server in servers:
        server.stop()
