"""The alert rules (deploy/prometheus/alerts.yml) with the real Prometheus tools, Debian's `prometheus`
package (`make debian-tools`): promtool checks the rules and runs their unit tests
(tests/deploy/alerts_test.yml); a real Prometheus scrapes a real tc-server with the rules loaded, where every
rule evaluates without error, every series the rules read is scraped, nothing fires on a healthy instance,
and real failures (the embedded store's writer process killed, an upstream broker that refuses
connections, tc-server killed) make their alerts fire or pend. The files that carry the rules elsewhere
(the PrometheusRule, compose's Prometheus, the runbook) are checked against them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tc_server.app import start_app
from tc_server.bench.process import descendants_of, terminate_process
from tc_server.client import connect
from tc_server.config import Settings
from tc_server.coordinator import layout
from tc_server.coordinator.leadership import leader_value
from tc_server.server.connection import NO_REQUEST_ID
from tc_server.store.memory import MemoryBackend, MemoryStore
from tc_server.wire import Error, ServerError, encode_command
from tests.security.pki import TestCa
from tests.support.server_process import ServerProcess, free_port, started

from .manifests import (
    COMPOSE,
    DEPLOY,
    K8S,
    ROOT,
    TEST_EVALUATION,
    TEST_SCRAPE,
    compose,
    load_yaml_docs,
    metric_names,
    sidecar_post_rendered,
)

RULES = DEPLOY / "prometheus" / "alerts.yml"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yml")
PROMETHEUS_RULE = K8S / "alerts" / "prometheusrule.yaml"
RUNBOOK = ROOT / "docs" / "alerts.md"
# The series the rules read that a single tc-server process does not export: Prometheus makes `up`, the
# supervisor of --workers exports the workers' restarts (tests/server/test_workers.py checks that one).
NOT_FROM_ONE_PROCESS = {"up", "tc_server_worker_restarts_total"}
# Exported from the first forwarded request on (its labels are command and outcome); the failure test
# below sees it.
AFTER_THE_FIRST_FORWARD = {"tc_server_forwarded_requests_total"}
# Exported with TLS on only (a 0 without would be an expired certificate); the TLS test below sees it.
ONLY_WITH_TLS = {"tc_server_tls_certificate_expiry_timestamp_seconds"}
WAIT_S = 30.0


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        source = {"kubectl": "kubectl (README, *Requirements*)"}.get(
            name, "`make debian-tools` installs Debian's prometheus package")
        pytest.fail(f"{name} not found on the PATH: {source}")
    return path


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


# --- the rule file on its own ----------------------------------------------------------------------

def test_promtool_accepts_the_rules() -> None:
    done = subprocess.run([tool("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_unit_tests_pass() -> None:
    # Run from the test file's directory: its rule_files path is relative to it.
    done = subprocess.run([tool("promtool"), "test", "rules", UNIT_TESTS.name], cwd=UNIT_TESTS.parent,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    cases = [case for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    for rule in rules():
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in mine), f"{rule['alert']}: no case where it fires"
        assert any(not case["exp_alerts"] for case in mine), f"{rule['alert']}: no case where it stays quiet"


def test_every_alert_has_a_severity_and_its_runbook_section() -> None:
    runbook = RUNBOOK.read_text()
    headings = {line[4:].strip() for line in runbook.splitlines() if line.startswith("### ")}
    for rule in rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert rule["annotations"]["runbook"] == f"docs/alerts.md#{name.lower()}", name
        assert name in headings, f"docs/alerts.md has no '### {name}' section"
    assert headings == {rule["alert"] for rule in rules()}, "docs/alerts.md describes alerts that do not exist"


def test_the_readme_counts_the_rules_there_are() -> None:
    # The README said 14 rules, and its list left out the critical TcServerTransactionsRefused (a review).
    readme = (ROOT / "README.md").read_text()
    stated = re.search(r"alerts\.yml` \((\d+) rules:", readme)
    assert stated is not None, "README no longer states how many alert rules there are"
    assert int(stated[1]) == len(rules())


def test_the_prometheus_rule_holds_the_same_groups() -> None:
    (doc,) = load_yaml_docs(PROMETHEUS_RULE)
    assert doc["kind"] == "PrometheusRule"
    assert doc["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"], (
        "deploy/kubernetes/alerts/prometheusrule.yaml must carry deploy/prometheus/alerts.yml's groups")


def test_compose_prometheus_loads_the_rules() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    mounts = compose()["services"]["prometheus"]["volumes"]
    assert "./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts, COMPOSE


def test_every_scrape_config_names_its_job_as_the_rules_expect() -> None:
    """`up{job="tc-server"}` finds the instances whichever way they are scraped."""
    assert 'up{job="tc-server"}' in next(r["expr"] for r in rules() if r["alert"] == "TcServerDown")
    for name in ("prometheus.yml", "kubernetes-scrape.yml"):
        config = yaml.safe_load((DEPLOY / "prometheus" / name).read_text())
        assert "tc-server" in {job["job_name"] for job in config["scrape_configs"]}, name
    (standalone,) = load_yaml_docs(K8S / "standalone" / "podmonitor.yaml")
    pod_labels = next(doc for doc in load_yaml_docs(K8S / "standalone" / "deployment.yaml")
                      if doc["kind"] == "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[standalone["spec"]["jobLabel"]] == "tc-server"
    (sidecar,) = load_yaml_docs(K8S / "sidecar" / "podmonitor.yaml")
    (endpoint,) = sidecar["spec"]["podMetricsEndpoints"]
    assert {"targetLabel": "job", "replacement": "tc-server"} in endpoint["relabelings"]


def test_kustomize_builds_the_standalone_variant_with_the_rules() -> None:
    done = subprocess.run([tool("kubectl"), "kustomize", str(K8S / "standalone")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(done.stdout) if doc]
    assert "PrometheusRule" in kinds and "Deployment" in kinds


def test_the_sidecar_post_renderer_adds_the_sidecar_and_the_rules() -> None:
    """deploy/kubernetes/sidecar/post-render.sh, as Helm runs it: a rendered chart in, the chart with the
    sidecar, its Service, PodMonitor and rules out (it copies the directory and ../alerts, which it includes)."""
    tool("kubectl")  # the script runs `kubectl kustomize`
    docs = sidecar_post_rendered()
    assert {"StatefulSet", "Service", "PodMonitor", "PrometheusRule"} <= {doc["kind"] for doc in docs}
    (broker,) = [doc for doc in docs if doc["kind"] == "StatefulSet"]
    names = [c["name"] for c in broker["spec"]["template"]["spec"]["containers"]]
    assert sorted(names) == ["pulsar-broker", "tc-server"]


# --- a real Prometheus scraping a real tc-server ------------------------------------------------------

class Prometheus:
    """A Prometheus server on loopback with the rule file loaded, scraping tc-server admin ports (a supervisor's
    and its workers', or one)."""

    def __init__(self, workdir: Path, *admin_ports: int) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": TEST_SCRAPE, "scrape_timeout": TEST_SCRAPE,
                       "evaluation_interval": TEST_EVALUATION},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "tc-server",
                                "static_configs": [{"targets": [f"127.0.0.1:{port}" for port in admin_ports]}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [tool("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.wait_for(lambda: self._ready(), "Prometheus ready")
        except BaseException:  # the caller has no object to stop: the process must not outlive the test
            self.stop()
            raise

    def _ready(self) -> bool:
        try:
            with urllib_open(f"http://127.0.0.1:{self.port}/-/ready") as resp:
                return bool(resp.status == 200)
        except OSError:
            assert self.proc.poll() is None, f"Prometheus exited: {self.log_path.read_text()[-2000:]}"
            return False

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib_open(f"http://127.0.0.1:{self.port}/api/v1/{path}{query}") as resp:
            doc = json.load(resp)
        assert doc["status"] == "success", doc
        return doc["data"]

    def alerts(self) -> dict[str, str]:
        """alert name -> state (pending, firing) of the active alerts."""
        return {alert["labels"]["alertname"]: alert["state"] for alert in self.api("alerts")["alerts"]}

    def value(self, query: str) -> float | None:
        result = self.query(query)
        return float(result[0]["value"][1]) if result else None

    def query(self, query: str) -> list[dict[str, Any]]:
        """The series ``query`` gives now (empty: none, or a condition that does not hold)."""
        return list(self.api("query", query=query)["result"])

    def wait_for(self, check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not check():
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not within {WAIT_S:.0f} s; Prometheus log: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.25)

    def stop(self) -> None:
        terminate_process(self.proc, timeout_s=10, kill_wait_s=5)


def urllib_open(url: str) -> Any:
    return urllib.request.urlopen(url, timeout=5)  # noqa: S310 - http://127.0.0.1 only


@contextmanager
def scraped(tmp_path: Path, *server_args: str) -> Iterator[tuple[ServerProcess, Prometheus]]:
    """A tc-server on the embedded store and a Prometheus that has scraped it and evaluated the rules."""
    server = started(ServerProcess(tmp_path / "data", *server_args))
    prometheus: Prometheus | None = None
    try:
        prometheus = Prometheus(tmp_path, server.admin_port)
        prometheus.wait_for(lambda: prometheus.value('tc_server_ready{job="tc-server"}') == 1.0,
                            "a scrape of the ready tc-server")
        prometheus.wait_for(lambda: all(rule.get("lastEvaluation", "0001").startswith("2")
                                        for group in prometheus.api("rules")["groups"] for rule in group["rules"]),
                            "every rule evaluated")
        yield server, prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        server.stop()


def unanswered_url() -> str:
    return f"pulsar://127.0.0.1:{free_port()}"  # nothing listens there


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """Healthy, and with an upstream broker that would refuse connections: nobody asked it to forward, so
    nothing is wrong (tc_server_upstream_up stays 0 until a forward connects)."""
    with scraped(tmp_path_factory.mktemp("healthy"), "--upstream-url", unanswered_url()) as (_, prometheus):
        yield prometheus


def test_every_rule_evaluates_without_error(healthy: Prometheus) -> None:
    evaluated = {rule["name"]: (rule["health"], rule.get("lastError", ""))
                 for group in healthy.api("rules")["groups"] for rule in group["rules"]}
    assert set(evaluated) == {rule["alert"] for rule in rules()}
    assert all(health == "ok" for health, _ in evaluated.values()), evaluated


def test_every_series_the_rules_read_is_scraped(healthy: Prometheus) -> None:
    read = {name for rule in rules() for name in metric_names(rule["expr"])} - NOT_FROM_ONE_PROCESS
    read -= AFTER_THE_FIRST_FORWARD | ONLY_WITH_TLS
    scraped_names = set(healthy.api("label/__name__/values"))
    missing = sorted(read - scraped_names)
    assert not missing, f"the rules read series a fresh tc-server does not export: {missing}"


def test_nothing_fires_on_a_healthy_instance(healthy: Prometheus) -> None:
    assert healthy.alerts() == {}


async def test_real_failures_raise_their_alerts(tmp_path: Path) -> None:
    """The store's writer process killed: TcServerStoreWriterLost fires. Forwards to an upstream broker
    that refuses connections: TcServerUpstreamUnreachable pends (its `for` is 2 minutes). tc-server killed:
    TcServerDown pends."""
    with scraped(tmp_path, "--upstream-url", unanswered_url()) as (server, prometheus):
        assert server.proc is not None
        (writer,) = descendants_of(server.proc.pid)
        os.kill(writer, signal.SIGKILL)
        client = await connect("127.0.0.1", server.port)
        try:
            # tc-server finds its writer gone (the end of the channel, or this write, which then fails as an
            # unknown outcome) and starts another for the next write.
            await client.new_txn(tc_id=0)
            # Forwarded lookups that fail, spread over several scrapes so that their rate is seen.
            for _ in range(4):
                answer = await client.lookup("persistent://public/default/alerts")
                assert answer.error is not None, answer
                await asyncio.sleep(1.0)
        finally:
            client.close()
        await asyncio.to_thread(prometheus.wait_for,
                                lambda: prometheus.alerts().get("TcServerStoreWriterLost") == "firing",
                                "TcServerStoreWriterLost firing")
        await asyncio.to_thread(prometheus.wait_for,
                                lambda: prometheus.alerts().get("TcServerUpstreamUnreachable") == "pending",
                                "TcServerUpstreamUnreachable pending")
        assert AFTER_THE_FIRST_FORWARD <= set(prometheus.api("label/__name__/values"))
        server.kill()
        await asyncio.to_thread(prometheus.wait_for, lambda: prometheus.alerts().get("TcServerDown") == "pending",
                                "TcServerDown pending")


def test_a_certificate_a_day_from_its_expiry_raises_the_critical_alert(tmp_path: Path) -> None:
    """A TLS listener whose certificate is valid for a day: the expiry is scraped as the certificate
    says, and the critical alert fires (the warning, 14 days ahead, waits out its `for`)."""
    ca = TestCa(tmp_path)
    server_cert = ca.issue("localhost", "server", server=True, valid_days=1)
    tls_args = ("--tls-listen", f"127.0.0.1:{free_port()}", "--tls-cert-file", str(server_cert.cert_file),
                "--tls-key-file", str(server_cert.key_file))
    with scraped(tmp_path, *tls_args) as (_, prometheus):
        expiry = prometheus.value("tc_server_tls_certificate_expiry_timestamp_seconds")
        assert expiry == server_cert.certificate.not_valid_after_utc.timestamp()
        prometheus.wait_for(lambda: prometheus.alerts() == {"TcServerTlsCertificateExpiringCritical": "firing",
                                                             "TcServerTlsCertificateExpiringSoon": "pending"},
                            "the certificate alerts")


async def test_a_broker_refusing_a_clients_credentials_is_not_unreachable(tmp_path: Path) -> None:
    """tc-server's own authentication off, the broker checking tokens: a client with a bad token is refused
    at the broker's CONNECT. The broker answered, so it is up (tc_server_upstream_up 1), and
    TcServerUpstreamUnreachable (critical) stays quiet; it pended before (a review). The broker is a
    stand-in that answers every CONNECT with AuthenticationError, as a real broker with token authentication
    answers a bad token (tests/server/test_upstream.py uses the same answer; the real broker's refusals of
    tc-server's own credentials are in tests/security/test_broker_auth.py)."""
    accepted = 0

    async def refuse_credentials(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        await reader.read(65536)  # the CONNECT
        writer.write(encode_command(Error(NO_REQUEST_ID, ServerError.AuthenticationError, "invalid token")))
        await writer.drain()
        writer.close()

    broker = await asyncio.start_server(refuse_credentials, "127.0.0.1", 0)
    url = f"pulsar://127.0.0.1:{broker.sockets[0].getsockname()[1]}"
    (rule,) = [r for r in rules() if r["alert"] == "TcServerUpstreamUnreachable"]
    try:
        with scraped(tmp_path, "--upstream-url", url) as (server, prometheus):
            client = await connect("127.0.0.1", server.port)
            try:
                for _ in range(4):  # over several scrapes, so that the failures' rate is seen
                    answer = await client.lookup("persistent://public/default/t")
                    assert answer.error is ServerError.AuthenticationError, answer
                    await asyncio.sleep(1.0)
            finally:
                client.close()
            await asyncio.to_thread(prometheus.wait_for,
                                    lambda: prometheus.value("tc_server_upstream_up") == 1.0, "the broker up")
            assert accepted >= 4
            await asyncio.sleep(2.0)  # more evaluations
            assert (await asyncio.to_thread(prometheus.api, "query", query=rule["expr"]))["result"] == []
            assert "TcServerUpstreamUnreachable" not in await asyncio.to_thread(prometheus.alerts)
    finally:
        broker.close()


async def test_a_coordinator_led_by_pulsar_5s_own_coordinator_has_a_leader(tmp_path: Path) -> None:
    """Pulsar 5's coordinator leads coordinator 0 (README *Pulsar 5*: it takes over when tc-server steps
    down, and tc-server follows it): tc-server is ready, LOOKUP names that leader, and no tc-server says
    tc_server_coordinator_leader 1 for it. TcServerCoordinatorWithoutLeader (critical) pended there before
    (a review); it reads tc_server_coordinator_has_leader, which knows that leader."""
    backend = MemoryBackend()
    pulsar5 = MemoryStore(backend)  # the other coordinator's store session, holding coordinator 0's record
    await pulsar5.put(layout.leader_path(0), leader_value("pulsar://pulsar5-broker:6650", "pulsar5-broker"),
                      ephemeral=True)
    settings = Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", store="memory", coordinators=4,
                        data_dir=str(tmp_path / "data"))
    app = await start_app(settings, store=MemoryStore(backend))
    prometheus: Prometheus | None = None
    try:
        (tmp_path / "prometheus").mkdir()
        prometheus = await asyncio.to_thread(Prometheus, tmp_path / "prometheus", app.admin.port)
        await asyncio.to_thread(prometheus.wait_for, lambda: prometheus.value("tc_server_ready") == 1.0,
                                "a scrape of the ready tc-server")
        assert await asyncio.to_thread(prometheus.value, 'tc_server_coordinator_leader{coordinator_id="0"}') == 0.0
        assert await asyncio.to_thread(prometheus.value, 'tc_server_coordinator_has_leader{coordinator_id="0"}') == 1.0
        await asyncio.sleep(2.0)  # evaluations
        (rule,) = [r for r in rules() if r["alert"] == "TcServerCoordinatorWithoutLeader"]
        assert (await asyncio.to_thread(prometheus.api, "query", query=rule["expr"]))["result"] == []
        assert await asyncio.to_thread(prometheus.alerts) == {}
    finally:
        if prometheus is not None:
            await asyncio.to_thread(prometheus.stop)
        await app.stop()
        await pulsar5.close()
