"""Compose file, Kubernetes manifests, Prometheus and Grafana config and Dockerfile agree with the code.

Every TC_SERVER_* variable they set must be a setting with a value load_settings accepts, and every port,
probe and scrape target must be the one the settings make the server listen on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tc_server.client.connection import Endpoint
from tc_server.config import CONFIG_ENV, ENV_NAMES, ENV_PREFIX, Settings, parse_hostport

from .manifests import (
    COMPOSE,
    DEPLOY,
    K8S,
    ROOT,
    compose,
    compose_env,
    compose_port_map,
    config_maps,
    container_env,
    dockerfile_env,
    dockerfile_stages,
    is_tc_server_service,
    k8s_docs,
    load_yaml_docs,
    named_ports,
    port_of,
    resolve_port,
    service_link_env,
    settings_from_env,
    tc_server_containers,
)

VARIANTS = ("standalone", "sidecar")
YAML_FILES = sorted([COMPOSE, *DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
NON_ROOT_UID = 10001


def image_env() -> dict[str, str]:
    return dockerfile_env(dockerfile_stages()[-1])


def tc_env_names(env: dict[str, str]) -> set[str]:
    return {k for k in env if k.startswith(ENV_PREFIX)}


# --- every file parses ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_yaml_parses(path: Path) -> None:
    assert load_yaml_docs(path), f"{path} holds no document"


@pytest.mark.parametrize("variant", VARIANTS)
def test_kustomization_lists_every_manifest(variant: str) -> None:
    directory = K8S / variant
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    listed = set(kustomization.get("resources", [])) | {p["path"] for p in kustomization.get("patches", [])}
    present = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
    # The sidecar's pulsar.yaml is the rendered Pulsar chart, produced at deploy time.
    generated = {"pulsar.yaml"} if variant == "sidecar" else set()
    # Directories are kustomizations of their own, shared by both variants (../alerts).
    shared = {entry for entry in listed if (directory / entry).is_dir()}
    assert shared == {"../alerts"}
    assert listed - generated - shared == present
    for doc in k8s_docs(variant):
        assert doc.get("apiVersion") and doc.get("kind") and doc.get("metadata", {}).get("name"), doc


# --- environment variables -----------------------------------------------------------------------

def all_env_sources() -> list[tuple[str, dict[str, str]]]:
    """(where, environment as the process sees it) for every place that starts tc-server."""
    sources = [("Dockerfile", image_env())]
    for name, service in compose()["services"].items():
        if is_tc_server_service(service):
            sources.append((f"compose {name}", {**image_env(), **compose_env(service)}))
    for variant in VARIANTS:
        maps = config_maps(variant)
        for doc, container in tc_server_containers(variant):
            where = f"{variant} {doc['kind']}/{doc['metadata']['name']} {container['name']}"
            sources.append((where, {**image_env(), **container_env(container, maps)}))
    return sources


def test_every_deployment_starts_tc_server() -> None:
    wheres = [where for where, _ in all_env_sources()]
    assert any(w.startswith("compose") for w in wheres)
    assert any(w.startswith("standalone") for w in wheres)
    assert any(w.startswith("sidecar") for w in wheres)


@pytest.mark.parametrize(("where", "env"), all_env_sources(), ids=[w for w, _ in all_env_sources()])
def test_env_names_are_settings_and_values_load(where: str, env: dict[str, str]) -> None:
    unknown = tc_env_names(env) - set(ENV_NAMES) - {CONFIG_ENV}
    assert not unknown, f"{where}: not settings: {sorted(unknown)}"
    settings_from_env(env)  # raises ConfigError naming the setting


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_service_links_of_the_manifests_services_do_not_stop_the_start(variant: str) -> None:
    """An unknown TC_SERVER_* variable stops the start; the kubelet's service links for the Service
    tc-server (and any other Service of these manifests) must not."""
    links: dict[str, str] = {}
    for service in (doc for doc in k8s_docs(variant) if doc["kind"] == "Service"):
        links |= service_link_env(service)
    assert "TC_SERVER_SERVICE_HOST" in links
    maps = config_maps(variant)
    for _, container in tc_server_containers(variant):
        settings_from_env({**links, **image_env(), **container_env(container, maps)})


def test_config_maps_hold_only_settings() -> None:
    for variant in VARIANTS:
        for name, data in config_maps(variant).items():
            assert set(data) <= set(ENV_NAMES), f"{variant} ConfigMap {name}: {set(data) - set(ENV_NAMES)}"


# --- Dockerfile ----------------------------------------------------------------------------------

def test_dockerfile_is_multi_stage_on_slim_python_311() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    assert all(s.base == "python:3.11-slim" for s in stages)
    builder, final = stages[0], stages[-1]
    assert any("deploy/install.sh /opt/tc-server" in run for run in builder.args("RUN"))
    copies = final.args("COPY")
    assert copies == [f"--from={builder.name} /opt/tc-server /opt/tc-server"], "copy the venv only"
    assert not any("pip" in run for run in final.args("RUN")), "nothing is installed in the final stage"


def test_dockerfile_runs_as_non_root() -> None:
    users = dockerfile_stages()[-1].args("USER")
    assert users, "no USER in the final stage"
    uid = users[-1].split(":")[0]
    assert uid == str(NON_ROOT_UID)


def test_dockerfile_entry_point_ports_volume() -> None:
    final = dockerfile_stages()[-1]
    assert final.args("ENTRYPOINT") == ['["tc-server"]']
    assert final.args("CMD") == ['["run"]']
    exposed = {int(p) for rest in final.args("EXPOSE") for p in rest.split()}
    settings = settings_from_env(image_env())
    assert exposed == {6650, 8080} == {port_of(settings.listen), port_of(settings.admin_listen)}
    env = image_env()
    assert env["TC_SERVER_LOG_FORMAT"] == "json"
    assert final.args("VOLUME") == [f'["{env["TC_SERVER_DATA_DIR"]}"]']


def test_dockerfile_healthcheck_is_the_settings_aware_subcommand() -> None:
    # It reads the admin address and scheme from the settings (tests/deploy/test_live.py runs it).
    checks = dockerfile_stages()[-1].args("HEALTHCHECK")
    assert len(checks) == 1
    assert checks[0].endswith('CMD ["tc-server", "healthcheck"]')


def test_install_script_installs_runtime_deps_only_from_the_lock() -> None:
    script = re.sub(r"\\\n", " ", (DEPLOY / "install.sh").read_text())
    commands = [line for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    pip_installs = [line for line in commands if "pip install" in line]
    # pip installs uv alone, pinned by hash; uv installs everything else from uv.lock.
    assert pip_installs and all("--require-hashes -r" in line and "uv-requirements.txt" in line
                                for line in pip_installs), pip_installs
    syncs = [line for line in commands if " sync " in line]
    assert len(syncs) == 1
    assert "--locked" in syncs[0] and "--no-editable" in syncs[0]
    assert "--extra" not in syncs[0] and "--all-extras" not in syncs[0], "runtime dependencies only"


def test_dockerignore_matches_image_check_context() -> None:
    allowed = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    make = (ROOT / "mk" / "deploy.mk").read_text()
    match = re.search(r"^IMAGE_CONTEXT\s*:=\s*(.+)$", make, re.MULTILINE)
    assert match
    assert set(match.group(1).split()) == allowed
    assert "deploy/install.sh" in allowed and "tc_server" in allowed and "pyproject.toml" in allowed
    # Every path it admits exists: LICENSE did not, and the image, labelled Apache-2.0, shipped without the
    # license text (a review).
    assert all((ROOT / path).exists() for path in allowed), [path for path in allowed if not (ROOT / path).exists()]
    assert 'licenses="Apache-2.0"' in (ROOT / "Dockerfile").read_text()
    assert "Apache License" in (ROOT / "LICENSE").read_text()


# --- compose -------------------------------------------------------------------------------------

def tc_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose()["services"].items() if is_tc_server_service(s)}


def test_compose_runs_two_instances_on_oxia() -> None:
    services = compose()["services"]
    assert services["oxia"]["image"].startswith("oxia/oxia:")
    assert services["oxia"]["command"][:2] == ["oxia", "standalone"]
    assert len(tc_services()) == 2
    urls = set()
    for service in tc_services().values():
        settings = settings_from_env({**image_env(), **compose_env(service)})
        assert settings.store == "oxia"
        assert settings.oxia_address == "oxia:6648"
        assert service["depends_on"]["oxia"]["condition"] == "service_healthy"
        urls.add(settings.advertised_url)
    assert len(urls) == 2, "each instance advertises its own URL"
    assert {"prometheus", "grafana"} <= set(services)


def test_compose_ports_match_settings() -> None:
    host_ports: list[int] = []
    for name, service in tc_services().items():
        settings = settings_from_env({**image_env(), **compose_env(service)})
        ports = compose_port_map(service)
        listen, admin = port_of(settings.listen), port_of(settings.admin_listen)
        assert set(ports) == {listen, admin}, name
        host_ports += ports.values()
        # LOOKUP answers send host clients to the advertised URL: it must be the published Pulsar port.
        advertised = urlsplit(settings.advertised_url)
        assert advertised.port == ports[listen], name
    assert sorted(host_ports) == [6650, 6651, 8080, 8081]


def test_prometheus_scrapes_every_compose_instance_on_its_admin_port() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "tc-server")
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    expected = set()
    for name, service in tc_services().items():
        settings = settings_from_env({**image_env(), **compose_env(service)})
        expected.add(f"{name}:{port_of(settings.admin_listen)}")
    assert targets == expected
    mounts = compose()["services"]["prometheus"]["volumes"]
    assert "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def test_grafana_provisioning_matches_compose_mounts() -> None:
    services = compose()["services"]
    mounts = dict(m.rsplit(":", 2)[:2] for m in services["grafana"]["volumes"] if m.startswith("./"))
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboards_dir = mounts["./deploy/grafana/dashboards"]
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/tc-server.yml").read_text())
    assert [p["options"]["path"] for p in providers["providers"]] == [dashboards_dir]
    sources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090" and "9090:9090" in services["prometheus"]["ports"]


# --- Kubernetes ----------------------------------------------------------------------------------

def k8s_containers() -> list[tuple[str, dict[str, Any], dict[str, Any], Settings]]:
    found = []
    for variant in VARIANTS:
        maps = config_maps(variant)
        for doc, container in tc_server_containers(variant):
            settings = settings_from_env({**image_env(), **container_env(container, maps)})
            found.append((variant, doc, container, settings))
    return found


def test_container_ports_are_the_listen_ports() -> None:
    for variant, _, container, settings in k8s_containers():
        ports = named_ports(container)
        listen, admin = port_of(settings.listen), port_of(settings.admin_listen)
        assert set(ports.values()) == {listen, admin}, variant
        pulsar_name, http_name = ("pulsar", "http") if variant == "standalone" else ("tc-pulsar", "tc-http")
        assert ports[pulsar_name] == listen and ports[http_name] == admin, variant
        assert urlsplit(settings.advertised_url).port == listen, variant
        assert urlsplit(settings.advertised_url).hostname == "10.1.2.3", "each pod advertises its pod IP"


def test_probes_hit_healthz_and_readyz_on_the_admin_port() -> None:
    for variant, _, container, settings in k8s_containers():
        admin = port_of(settings.admin_listen)
        liveness = container["livenessProbe"]["httpGet"]
        assert liveness["path"] == "/healthz" and resolve_port(liveness["port"], container) == admin
        if variant == "standalone":
            readiness = container["readinessProbe"]["httpGet"]
            assert readiness["path"] == "/readyz" and resolve_port(readiness["port"], container) == admin
        else:
            # A not-ready sidecar must not take its broker out of service (tc-server-sidecar.yaml).
            assert "readinessProbe" not in container
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe in container:
                assert container[probe]["httpGet"].get("scheme", "HTTP") == "HTTP"


def test_pods_run_as_the_image_user_with_limits() -> None:
    for variant, doc, container, _ in k8s_containers():
        pod_security = doc["spec"]["template"]["spec"].get("securityContext", {})
        security = {**pod_security, **container.get("securityContext", {})}
        assert security["runAsNonRoot"] is True and security["runAsUser"] == NON_ROOT_UID, variant
        assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
        assert security["capabilities"]["drop"] == ["ALL"]
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert image_env()["TC_SERVER_DATA_DIR"] in mounts and "/tmp" in mounts  # read-only root


# The Pulsar Helm chart's names for a release called "pulsar": its broker Service and its Oxia.
BROKER_SERVICE = "pulsar-broker"
CHART_OXIA = "pulsar-oxia-svc"


def test_every_kubernetes_layout_names_its_brokers() -> None:
    """Without an upstream, lookups of ordinary topics get TopicNotFound and decisions never reach a broker."""
    for variant, _, _, settings in k8s_containers():
        endpoints = [Endpoint.parse(url) for url in settings.upstream_urls]
        assert endpoints, f"{variant}: no TC_SERVER_UPSTREAM_URL"
        assert BROKER_SERVICE in {e.host for e in endpoints}, variant
        assert all(e.port == 6650 and not e.tls for e in endpoints), variant  # the chart's plain broker port
        if variant == "sidecar":
            # The broker of the same pod first: the containers share the pod's network.
            assert (endpoints[0].host, endpoints[0].port) == ("127.0.0.1", 6650)
            assert parse_hostport(settings.oxia_address)[0] == CHART_OXIA  # the same release


# A commented-out broker credential: "# KEY: value" (ConfigMap) or "# - name: KEY" + "#   value: value" (env).
COMMENTED_SETTING = re.compile(
    r"^\s*#\s*(?:- name: )?(TC_SERVER_BROKER_CLIENT_AUTH_\w+)(?::\s*|\n\s*#\s*value:\s*)(\S+)", re.MULTILINE)


@pytest.mark.parametrize("variant", VARIANTS)
def test_broker_credentials_are_marked_placeholders_that_load(variant: str) -> None:
    """Left commented out (the token Secret is the operator's), but they must be settings that load."""
    text = "\n".join(path.read_text() for path in sorted((K8S / variant).glob("*.yaml")))
    assert "PLACEHOLDERS" in text and "superUserRoles" in text
    placeholders = dict(COMMENTED_SETTING.findall(text))
    assert set(placeholders) == {"TC_SERVER_BROKER_CLIENT_AUTH_PLUGIN", "TC_SERVER_BROKER_CLIENT_AUTH_PARAMS"}
    (_, container), *_ = tc_server_containers(variant)
    settings = settings_from_env({**image_env(), **container_env(container, config_maps(variant)), **placeholders})
    assert settings.broker_client_auth_params.startswith("file:///var/run/secrets/tc-server/")


def test_standalone_deployment_and_service() -> None:
    docs = k8s_docs("standalone")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (service,) = [d for d in docs if d["kind"] == "Service"]
    assert deployment["spec"]["replicas"] == 2
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    (container,) = [c for _, c in tc_server_containers("standalone")]
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["pulsar"]["port"] == 6650 and ports["http"]["port"] == 8080
    for port in ports.values():
        assert port["targetPort"] in named_ports(container)
    settings = settings_from_env({**image_env(), **container_env(container, config_maps("standalone"))})
    assert settings.store == "oxia" and port_of(settings.oxia_address) == 6648


def test_sidecar_service_targets_the_sidecar_ports() -> None:
    docs = k8s_docs("sidecar")
    (service,) = [d for d in docs if d["kind"] == "Service"]
    (container,) = [c for _, c in tc_server_containers("sidecar")]
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["pulsar"]["targetPort"] == "tc-pulsar" and ports["http"]["targetPort"] == "tc-http"
    assert {p["targetPort"] for p in ports.values()} <= set(named_ports(container))
    # The broker container of the Pulsar chart owns these; the sidecar shares the pod's network.
    broker_ports = {6650, 6651, 8080, 8443}
    assert not set(named_ports(container).values()) & broker_ports
    assert not set(named_ports(container)) & {"http", "pulsar", "https", "pulsarssl"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_pod_monitor_scrapes_the_admin_port(variant: str) -> None:
    (monitor,) = [d for d in k8s_docs(variant) if d["kind"] == "PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    ((workload, container),) = list(tc_server_containers(variant))
    settings = settings_from_env({**image_env(), **container_env(container, config_maps(variant))})
    assert named_ports(container)[endpoint["port"]] == port_of(settings.admin_listen)
    assert endpoint["port"] == ("http" if variant == "standalone" else "tc-http")
    selector = monitor["spec"]["selector"]["matchLabels"]
    if variant == "standalone":
        assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()
    else:
        assert selector == {"component": "broker"}  # the Pulsar Helm chart's broker pods
    # A labelmap of the pods' labels would turn tc-server's own `cluster` label into exported_cluster.
    assert not any(r.get("action") == "labelmap" for r in endpoint.get("relabelings", []))


def test_plain_prometheus_config_keeps_both_port_names() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "kubernetes-scrape.yml").read_text())
    (job,) = config["scrape_configs"]
    keep = next(r for r in job["relabel_configs"] if r.get("action") == "keep")
    pattern = re.compile(keep["regex"])
    for variant, _, container, settings in k8s_containers():
        admin_name = next(n for n, p in named_ports(container).items() if p == port_of(settings.admin_listen))
        assert pattern.fullmatch(f"{container['name']};{admin_name}"), variant
        pulsar_name = next(n for n, p in named_ports(container).items() if p == port_of(settings.listen))
        assert not pattern.fullmatch(f"{container['name']};{pulsar_name}")
    assert not pattern.fullmatch("pulsar-broker;http"), "the broker's own port is not tc-server"


def test_kubernetes_and_compose_use_the_same_image_name() -> None:
    for variant in VARIANTS:
        kustomization = yaml.safe_load((K8S / variant / "kustomization.yaml").read_text())
        names = {i["name"] for i in kustomization["images"]}
        assert names == {c["image"] for _, c in tc_server_containers(variant)}
    assert {s["image"].split(":")[0] for s in tc_services().values()} == {"tc-server"}

