"""An instance that cannot reach its metadata store at start (Oxia down, or a wrong TC_SERVER_OXIA_ADDRESS in
the ConfigMap / sidecar patch) waits: /healthz 200, /readyz 503, and /metrics holds tc_server_ready 0,
tc_server_build_info and tc_server_coordinator_has_leader 0 for every coordinator (tc_server/admin/routes.py
StartingRoutes; it held only the first two, and neither the dashboard nor a critical alert saw the instance).
A real Prometheus with deploy/prometheus/alerts.yml scrapes three real tc-server processes:

  healthy   cluster "one", memory store (leads all 16 coordinators)
  waiting1  cluster "one", --store oxia at an address where nothing listens
  waiting2  cluster "two", --store oxia at an address where nothing listens (the cluster's only instance)

and the dashboard's queries are evaluated as Grafana would expand its $cluster/$instance variables.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tc_server.bench.process import terminate_process
from tests.deploy.manifests import DEPLOY, TEST_EVALUATION, TEST_SCRAPE, dashboard, dashboard_panels
from tests.support.server_process import ServerProcess, free_port

RULES = DEPLOY / "prometheus" / "alerts.yml"
WAIT_S = 40.0


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


class Prom:
    def __init__(self, workdir: Path, admin_ports: list[int]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus not on the PATH (make debian-tools)")
        self.port = free_port()
        config = {
            "global": {"scrape_interval": TEST_SCRAPE, "scrape_timeout": TEST_SCRAPE,
                       "evaluation_interval": TEST_EVALUATION},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "tc-server",
                                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in admin_ports]}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        status, body = _get(f"http://127.0.0.1:{self.port}/api/v1/{path}{query}")
        doc = json.loads(body)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def wait_for(self, check: Any, what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                if check():
                    return
            except (OSError, ValueError, AssertionError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not within {WAIT_S:.0f} s\n{self.log.read_text()[-1500:]}")
            time.sleep(0.3)

    def stop(self) -> None:
        terminate_process(self.proc, timeout_s=10, kill_wait_s=5)


class Setup:
    def __init__(self, prom: Prom, healthy: ServerProcess, waiting1: ServerProcess, waiting2: ServerProcess) -> None:
        self.prom, self.healthy, self.waiting1, self.waiting2 = prom, healthy, waiting1, waiting2

    def instance(self, server: ServerProcess) -> str:
        return f"127.0.0.1:{server.admin_port}"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("waiting")
    nothing = f"127.0.0.1:{free_port()}"  # no Oxia listens here
    healthy = ServerProcess(work / "healthy", "--cluster", "one", store="memory")
    waiting1 = ServerProcess(work / "w1", "--cluster", "one", "--oxia-address", nothing, store="oxia")
    waiting2 = ServerProcess(work / "w2", "--cluster", "two", "--oxia-address", nothing, store="oxia")
    servers = [healthy, waiting1, waiting2]
    prom: Prom | None = None
    try:
        healthy.start()
        for server in (waiting1, waiting2):
            server.start(wait=False)
        for server in (waiting1, waiting2):
            deadline = time.monotonic() + WAIT_S
            while server.status("/healthz") != 200:
                assert server.running() and time.monotonic() < deadline, server.log_tail()
                time.sleep(0.2)
            assert server.status("/readyz") == 503
        prom = Prom(work, [s.admin_port for s in servers])
        p = prom
        p.wait_for(lambda: len(p.query('up{job="tc-server"} == 1')) == 3, "three targets scraped")
        p.wait_for(lambda: len(p.query("tc_server_ready == 0")) == 2, "the two waiting instances scraped")
        p.wait_for(lambda: all(r.get("lastEvaluation", "0001").startswith("2")
                               for g in p.api("rules")["groups"] for r in g["rules"]), "rules evaluated")
        time.sleep(3)  # a few more evaluations
        yield Setup(prom, healthy, waiting1, waiting2)
    finally:
        if prom is not None:
            prom.stop()
        for server in servers:
            server.stop()


def grafana_multi(values: list[str]) -> str:
    """A multi-value variable with "All" selected and no allValue, as Grafana writes it into a PromQL regex."""
    # Grafana escapes regex characters with a double backslash (a PromQL string holding "\\.").
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def variable(name: str) -> dict[str, Any]:
    return next(v for v in dashboard()["templating"]["list"] if v["name"] == name)


def panel_expr(title: str) -> str:
    (panel,) = [p for p in dashboard_panels(dashboard()) if p.get("title") == title]
    (target,) = panel["targets"]
    return str(target["expr"])


def test_dashboard_instances_not_ready_counts_an_instance_waiting_for_its_store(setup: Setup) -> None:
    """The stat "Instances not ready" (deploy/grafana/dashboards/tc-server.json) reads
    tc_server_ready{instance=~"$instance"}, and $instance listed only instances that exported
    pulsar_txn_active_count and tc_server_coordinator_leader, which a waiting instance never does: the panel
    built to show not-ready instances said 0 while one was stuck not ready, and a cluster whose every instance
    waited was not in $cluster at all."""
    prom = setup.prom
    # Both waiting instances scraped now (a scrape that failed since the set-up leaves its series stale).
    prom.wait_for(lambda: len(prom.query("tc_server_ready == 0")) == 2, "the two waiting instances scraped")
    cluster_query = variable("cluster")["query"]["query"]
    metric = re.fullmatch(r"label_values\((\w+), cluster\)", cluster_query)
    assert metric, cluster_query
    clusters = prom.api("label/cluster/values", **{"match[]": metric.group(1)})
    assert clusters == ["one", "two"]
    cluster = grafana_multi(["one"])
    # $instance: query_result(...) with the variable's regex over each result line
    inst_var = variable("instance")
    inner = re.fullmatch(r"query_result\((.*)\)", inst_var["query"]["query"], re.S)
    assert inner
    rows = prom.query(inner.group(1).replace("$cluster", cluster))
    instances = sorted(row["metric"]["instance"] for row in rows)
    instance = grafana_multi(instances)

    expr = panel_expr("Instances not ready").replace("$cluster", cluster).replace("$instance", instance)
    shown = float(prom.query(expr)[0]["value"][1])
    # Prometheus itself knows that one instance of cluster "one" (and one of cluster "two") is not ready.
    assert len(prom.query("tc_server_ready == 0")) == 2
    assert shown == 1.0, (
        f"'Instances not ready' shows {shown:g} with cluster 'one' selected, while {setup.instance(setup.waiting1)} "
        f"(TC_SERVER_CLUSTER=one) has tc_server_ready 0; $instance = {instances} leaves out every instance "
        "still waiting for its store")


def test_a_cluster_whose_instances_all_wait_for_the_store_raises_the_critical_leader_alert(setup: Setup) -> None:
    """docs/alerts.md: TcServerCoordinatorWithoutLeader is critical when 'for a minute no instance has known a
    leader of the coordinator'. A scraped instance waiting for its store exported no
    tc_server_coordinator_has_leader, so for a cluster whose every instance waits (Oxia down, or a wrong
    TC_SERVER_OXIA_ADDRESS at deploy time) no critical alert could fire: TcServerDown sees up == 1, the leader
    rule had no series; only the warning TcServerNotReady (after 5 min) was left, while every transaction of
    that cluster failed. Pending here (the rule's `for` is a minute): the rule's condition holds for cluster
    "two", every coordinator, and not for cluster "one", which its healthy instance leads."""
    prom = setup.prom
    prom.wait_for(lambda: len([a for a in prom.api("alerts")["alerts"]
                               if a["labels"]["alertname"] == "TcServerCoordinatorWithoutLeader"]) == 16,
                  "TcServerCoordinatorWithoutLeader pending for cluster two's 16 coordinators")
    leaderless = [a["labels"] for a in prom.api("alerts")["alerts"]
                  if a["labels"]["alertname"] == "TcServerCoordinatorWithoutLeader"]
    assert {labels["cluster"] for labels in leaderless} == {"two"}, leaderless
    assert all(labels["severity"] == "critical" for labels in leaderless), leaderless
