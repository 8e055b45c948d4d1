"""The Kubernetes layouts as a cluster runs them: the sidecar patch rendered as the README says (Helm's
post-renderer, post-render.sh) over a broker StatefulSet shaped like the Pulsar Helm chart's, and the IPv6
advice of both layouts followed on a real tc-server process."""

from __future__ import annotations

import os
import shutil
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tc_server.config import parse_hostport
from tests.deploy.manifests import (
    K8S,
    config_maps,
    container_env,
    dockerfile_env,
    dockerfile_stages,
    sidecar_post_rendered,
    tc_server_containers,
)
from tests.support.server_process import ServerProcess


def rendered_broker() -> dict[str, Any]:
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl not found on the PATH (README, *Requirements*)")
    (broker,) = [doc for doc in sidecar_post_rendered() if doc["kind"] == "StatefulSet"]
    return broker


def test_the_broker_stays_the_pods_default_container() -> None:
    # The strategic-merge patch puts tc-server first in `containers`, and kubectl's default container is the
    # first one unless kubectl.kubernetes.io/default-container names another: `kubectl logs pulsar-broker-0`
    # showed tc-server's log, and `kubectl exec pulsar-broker-0 -- bin/pulsar-admin ...` ran in the tc-server
    # image, which has no bin/pulsar-admin.
    template = rendered_broker()["spec"]["template"]
    annotations = template.get("metadata", {}).get("annotations", {})
    default = annotations.get("kubectl.kubernetes.io/default-container") or template["spec"]["containers"][0]["name"]
    assert default == "pulsar-broker", [c["name"] for c in template["spec"]["containers"]]
    assert template["metadata"]["labels"] == {"component": "broker"}  # merged, not replaced


@pytest.mark.parametrize("variant", ["standalone", "sidecar"])
def test_the_ipv6_advice_gives_a_pod_reachable_on_its_ipv6_address(tmp_path: Path, variant: str) -> None:
    # The advice said only to write the advertised URL as pulsar://[$(POD_IP)]:PORT; with the listen
    # addresses left at 0.0.0.0 (IPv4 only) the pod's IPv6 address refused every client and the kubelet's
    # probes (the liveness probe restarted the container for ever). It now names the [::] listen addresses.
    (_, container), = list(tc_server_containers(variant))
    env = {**dockerfile_env(dockerfile_stages()[-1]), **container_env(container, config_maps(variant))}
    text = "\n".join(path.read_text() for path in (K8S / variant).glob("*.yaml"))
    listen_port = parse_hostport(env["TC_SERVER_LISTEN"])[1]
    admin_port = parse_hostport(env["TC_SERVER_ADMIN_LISTEN"])[1]
    assert f"[::]:{listen_port}" in text and f"[::]:{admin_port}" in text, "the advice names both listen addresses"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("TC_SERVER_")}
    server = ServerProcess(tmp_path / "data", store="memory", base_env=base_env)
    # The listen addresses as the advice says, on free ports; the pod's IPv6 address is ::1 here.
    server.extra_args += ["--listen", f"[::]:{server.port}", "--admin-listen", f"[::]:{server.admin_port}",
                          "--advertised-url", f"pulsar://[::1]:{server.port}"]
    # Its own wait asks the admin port at 127.0.0.1: a dual-stack cluster whose primary family is IPv4
    # probes and scrapes there. The admin port on [::] was IPv6-only (asyncio's binding), never ready at it.
    server.start()
    try:
        # The kubelet's httpGet probe at the pod's IPv6 address, GET http://[pod IP]:port/readyz, and a
        # client at the advertised URL; both ports answer at either family, as Pulsar's own do on [::].
        with urllib.request.urlopen(f"http://[::1]:{server.admin_port}/readyz", timeout=5) as answer:  # noqa: S310
            assert answer.status == 200
        for address in ("::1", "127.0.0.1"):
            socket.create_connection((address, server.port), timeout=5).close()
    finally:
        assert server.stop() == 0, server.log_tail()
