"""Readers for the deployment files, shared by the tests in this package.

They turn the compose file, the Kubernetes manifests, the Dockerfile and the Grafana dashboard into
plain data (environments, ports, probes, PromQL expressions) that the tests compare with
``tc_server.config`` and ``tc_server.metrics``.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.metrics import MetricWrapperBase

from tc_server.config import Settings, load_settings, parse_hostport
from tc_server.metrics import LoopFamily, Metrics, ScrapedGauge

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "tc-server.json"
# The tests' own Prometheus: its scrape and evaluation intervals (the shipped configs use 15 s). A scrape's
# timeout is its interval, 2 s and not 1: a scrape that times out makes `up` 0 (TcServerDown pends) and the
# scraped series stale, and a loaded 2-core machine can hold a process for a second.
TEST_SCRAPE = "2s"
TEST_EVALUATION = "1s"

# What the downward API gives a pod at run time; any valid IPv4 address will do for validation.
SAMPLE_POD_IP = "10.1.2.3"


def load_yaml_docs(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def port_of(hostport: str) -> int:
    return parse_hostport(hostport)[1]


# --- Dockerfile -------------------------------------------------------------------------------------

@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def dockerfile_stages(path: Path = DOCKERFILE) -> list[Stage]:
    """Split the Dockerfile into stages of (KEYWORD, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    build_args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            build_args[name] = default
        elif keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: build_args.get(m.group(1), m.group(0)), words[0])
            stage = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, stage))
        else:
            stages[-1].instructions.append((keyword, rest))
    return stages


def dockerfile_env(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in stage.args("ENV"):
        for word in shlex.split(rest):
            key, sep, value = word.partition("=")
            assert sep, f"ENV {rest!r}: use the KEY=VALUE form"
            env[key] = value
    return env


# --- compose ---------------------------------------------------------------------------------------

def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def compose_env(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def compose_port_map(service: Mapping[str, Any]) -> dict[int, int]:
    """container port -> host port, from short-syntax "HOST:CONTAINER" entries."""
    mapping: dict[int, int] = {}
    for entry in service.get("ports") or []:
        parts = str(entry).split("/")[0].split(":")
        assert len(parts) == 2, f"ports entry {entry!r}: use HOST:CONTAINER"
        mapping[int(parts[1])] = int(parts[0])
    return mapping


def is_tc_server_service(service: Mapping[str, Any]) -> bool:
    return "build" in service or str(service.get("image", "")).startswith("tc-server")


# --- Kubernetes ------------------------------------------------------------------------------------

def k8s_docs(variant: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((K8S / variant).glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs.extend(load_yaml_docs(path))
    return docs


def pod_template_containers(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", []))


def tc_server_containers(variant: str) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload doc, container) for every container running the tc-server image."""
    for doc in k8s_docs(variant):
        for container in pod_template_containers(doc):
            if str(container.get("image", "")).split(":")[0].endswith("tc-server"):
                yield doc, container


def config_maps(variant: str) -> dict[str, dict[str, str]]:
    return {doc["metadata"]["name"]: {k: str(v) for k, v in (doc.get("data") or {}).items()}
            for doc in k8s_docs(variant) if doc.get("kind") == "ConfigMap"}


def container_env(container: Mapping[str, Any], maps: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom first, then env with $(VAR)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        assert ref is not None, f"envFrom {source}: only configMapRef is expected here"
        assert ref["name"] in maps, f"envFrom names ConfigMap {ref['name']!r}, which is not in the manifests"
        env.update(maps[ref["name"]])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)),
                                       str(item["value"]))
        else:
            field_path = item["valueFrom"]["fieldRef"]["fieldPath"]
            assert field_path == "status.podIP", f"unexpected fieldRef {field_path}"
            env[item["name"]] = SAMPLE_POD_IP
    return env


def service_link_env(service: Mapping[str, Any], cluster_ip: str = "10.96.0.10") -> dict[str, str]:
    """The variables the kubelet gives every pod of the namespace for this Service (enableServiceLinks,
    on by default): a Service named tc-server makes TC_SERVER_SERVICE_HOST, TC_SERVER_PORT, ..."""
    name = service["metadata"]["name"].upper().replace("-", "_")
    ports = service["spec"]["ports"]
    env = {f"{name}_SERVICE_HOST": cluster_ip, f"{name}_SERVICE_PORT": str(ports[0]["port"]),
           f"{name}_PORT": f"{ports[0].get('protocol', 'TCP').lower()}://{cluster_ip}:{ports[0]['port']}"}
    for port in ports:
        number, protocol = port["port"], port.get("protocol", "TCP")
        if "name" in port:
            env[f"{name}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(number)
        link = f"{name}_PORT_{number}_{protocol}"
        env |= {link: f"{protocol.lower()}://{cluster_ip}:{number}", f"{link}_PROTO": protocol.lower(),
                f"{link}_PORT": str(number), f"{link}_ADDR": cluster_ip}
    return env


def named_ports(container: Mapping[str, Any]) -> dict[str, int]:
    return {p["name"]: int(p["containerPort"]) for p in container.get("ports", [])}


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    return named_ports(container)[port] if isinstance(port, str) else int(port)


def settings_from_env(env: Mapping[str, str]) -> Settings:
    return load_settings(environ=env)


# --- Grafana dashboard and PromQL -----------------------------------------------------------------

def dashboard() -> dict[str, Any]:
    doc = json.loads(DASHBOARD.read_text())
    assert isinstance(doc, dict)
    return doc


def dashboard_panels(doc: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # collapsed rows keep their panels inside


def dashboard_exprs(doc: Mapping[str, Any]) -> list[str]:
    """Every PromQL expression: panel targets and template variable queries."""
    exprs = [t["expr"] for p in dashboard_panels(doc) for t in p.get("targets", []) if t.get("expr")]
    for var in doc.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var.get("query"), dict) else var["query"]
            exprs.append(query)
    return exprs


PROMQL_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan",
})
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def _strip_grafana(expr: str) -> str:
    # query_result(...) and label_values(metric, label) are Grafana's wrappers, not PromQL.
    expr = re.sub(r"\blabel_values\s*\(\s*([^,()]+?)\s*,\s*\w+\s*\)", r"\1", expr)
    expr = re.sub(r"\bquery_result\s*\(", "(", expr)
    return re.sub(r"\$\{?\w+\}?", "X", expr)  # $__rate_interval, ${datasource}, $cluster


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (label values, groupings and functions removed)."""
    text = _strip_grafana(expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = GROUPING.sub(" ", text)
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        word = match.group(0)
        following = text[match.end():].lstrip()
        if following.startswith("(") or word.lower() in PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def grouping_labels(expr: str) -> set[str]:
    return {label.strip() for group in GROUPING.findall(_strip_grafana(expr))
            for label in group.split(",") if label.strip()}


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(metric name, [(label, op, value)]) for every `name{...}` selector."""
    text = re.sub(r"\blabel_values\s*\(\s*([^,()]+?)\s*,\s*\w+\s*\)", r"\1", expr)
    return [(name, MATCHER.findall(body)) for name, body in SELECTOR.findall(text)]


# The exposition sample names of each metric type (prometheus_client also writes `_created`; dashboards
# must not depend on it).
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def exported_families() -> dict[str, tuple[str, frozenset[str]]]:
    """METRIC_NAMES-style name -> (type, label names), read from the collectors Metrics registers."""
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for value in vars(Metrics("test")).values():
        if isinstance(value, MetricWrapperBase):
            kind = value._type  # noqa: SLF001 - prometheus_client keeps type and labels private
            assert kind is not None, value
            name = value._name + ("_total" if kind == "counter" else "")  # noqa: SLF001
            found[name] = (kind, frozenset(value._labelnames))  # noqa: SLF001
        elif isinstance(value, LoopFamily):
            name = value.name + ("_total" if value.kind == "counter" else "")
            found[name] = (value.kind, frozenset(value.labelnames))
        elif isinstance(value, ScrapedGauge):
            found[value.name] = ("gauge", frozenset(value.labelnames))
    return found


def exported_sample_names() -> dict[str, str]:
    """Every sample name a scrape can show -> its METRIC_NAMES family."""
    names: dict[str, str] = {}
    for family, (kind, _) in exported_families().items():
        base = family.removesuffix("_total") if kind == "counter" else family
        for suffix in SUFFIXES[kind]:
            names[base + suffix] = family
    return names


def sidecar_post_rendered() -> list[dict[str, Any]]:
    """deploy/kubernetes/sidecar/post-render.sh as Helm runs it, over a broker StatefulSet shaped like the
    Pulsar Helm chart's (release "pulsar"): the documents it writes. Needs kubectl (the script runs
    ``kubectl kustomize``); the caller checks it is there."""
    chart = yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "pulsar-broker", "labels": {"component": "broker"}},
        "spec": {"serviceName": "pulsar-broker", "selector": {"matchLabels": {"component": "broker"}},
                 "template": {"metadata": {"labels": {"component": "broker"}},
                              "spec": {"containers": [{"name": "pulsar-broker", "image": "apachepulsar/pulsar"}]}}},
    })
    done = subprocess.run([str(K8S / "sidecar" / "post-render.sh")], input=chart, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]
