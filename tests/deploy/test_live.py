"""The real server, started as the image starts it, answers its probes and exports what the dashboard reads.

prometheus_client only writes a labelled family's samples once a label set exists, so this test relies on
the server creating its label sets (per coordinator, per command) at start. A family missing here is a
dashboard panel that stays empty on a fresh instance: report it, do not drop it from the check.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tc_server import __version__
from tc_server.bench.process import READY_TIMEOUT_S
from tests.security.pki import TestCa

from .manifests import ROOT, dashboard, dashboard_exprs, dockerfile_stages, metric_names

_spec = importlib.util.spec_from_file_location("deploy_smoke", ROOT / "deploy" / "smoke.py")
assert _spec is not None and _spec.loader is not None
smoke = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = smoke  # dataclasses look their module up there
_spec.loader.exec_module(smoke)


def tc_server_command() -> list[str]:
    """The console script of the environment running the tests; the module entry point otherwise."""
    script = Path(sys.executable).parent / "tc-server"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from tc_server.cli import main; sys.exit(main())"]


def this_checkout_env() -> dict[str, str]:
    """This environment, with this checkout's tc_server first (the console script may be another's)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.fixture(scope="module")
def server() -> Iterator[object]:
    with smoke.run_server(tc_server_command(), env=this_checkout_env()) as running:
        try:
            running.wait_ready()
        except RuntimeError as exc:  # its message holds the server's log tail
            pytest.fail(str(exc))
        yield running


def scrape(server: object) -> dict[str, set[str]]:
    """sample name -> label names seen, from one GET /metrics."""
    status, body = smoke.get(server.admin_url + "/metrics")  # type: ignore[attr-defined]
    assert status == 200
    seen: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            seen.setdefault(sample.name, set()).update(sample.labels)
    return seen


def test_probes_answer(server: object) -> None:
    for path in ("/healthz", "/readyz"):
        status, _ = smoke.get(server.admin_url + path)  # type: ignore[attr-defined]
        assert status == 200, path


# Dashboard series of features this fresh server runs without: their panels are empty where the feature is
# off. tests/deploy/test_alerts.py scrapes each from a server with the feature on.
FEATURE_SERIES = {
    "tc_server_upstream_up": "--upstream-url",
    "tc_server_forwarded_requests_total": "--upstream-url, from the first forwarded request",
    "tc_server_tls_certificate_expiry_timestamp_seconds": "--tls-listen or --admin-tls",
}


def test_every_dashboard_series_is_in_a_fresh_scrape(server: object) -> None:
    seen = scrape(server)
    wanted = {name for expr in dashboard_exprs(dashboard()) for name in metric_names(expr)} - set(FEATURE_SERIES)
    missing = sorted(wanted - set(seen))
    assert not missing, (
        "series the dashboard reads are absent from /metrics of a freshly started server "
        f"(labelled families need their label sets created at start): {missing}")


def test_build_info_names_the_running_version(server: object) -> None:
    status, body = smoke.get(server.admin_url + "/metrics")  # type: ignore[attr-defined]
    samples = [s for family in text_string_to_metric_families(body.decode()) for s in family.samples
               if s.name == "tc_server_build_info"]
    assert status == 200 and len(samples) == 1, samples
    assert samples[0].labels["version"] == __version__ and samples[0].value == 1.0, samples


def test_coordinator_series_carry_cluster_and_coordinator_id(server: object) -> None:
    seen = scrape(server)
    assert "pulsar_txn_created_total" in seen and "pulsar_txn_active_count" in seen
    coordinator_series = [n for n in seen if n.startswith("pulsar_txn_") and "metadata_store" not in n
                          and not n.endswith("_created")]
    for name in coordinator_series:
        assert {"cluster", "coordinator_id"} <= seen[name], name


def image_healthcheck(settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The Dockerfile's HEALTHCHECK, run as Docker would (exec form), in a container whose settings are
    these TC_SERVER_* variables (and nothing from the caller's shell)."""
    (check,) = dockerfile_stages()[-1].args("HEALTHCHECK")
    argv = json.loads(check[check.index("CMD") + len("CMD"):].strip())
    # The image's PATH finds these two in its venv; here they are this environment's.
    program = {"python": [sys.executable], "tc-server": tc_server_command()}[argv[0]]
    env = {k: v for k, v in this_checkout_env().items() if not k.startswith("TC_SERVER_")}
    env |= {"TC_SERVER_" + name.upper(): value for name, value in settings.items()}
    return subprocess.run([*program, *argv[1:]], env=env, timeout=30, capture_output=True, text=True)


def test_the_image_healthcheck_command_passes(server: object) -> None:
    admin_listen = f"127.0.0.1:{server.admin_port}"  # type: ignore[attr-defined]
    done = image_healthcheck({"admin_listen": admin_listen})
    assert done.returncode == 0, done.stderr
    done = image_healthcheck({"admin_listen": f"127.0.0.1:{smoke.free_port()}"})  # nothing listens there
    # 1 is "unhealthy" to Docker; 2 is reserved.
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr


def wait_started(server: object) -> None:
    """Until the server logged "started" (its admin port is then open); the probes cannot tell, as
    /readyz is on the address under test."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if '"event": "started"' in server.log_path.read_text():  # type: ignore[attr-defined]
            return
        if not server.running():  # type: ignore[attr-defined]
            break
        time.sleep(0.1)
    pytest.fail(f"tc-server did not start:\n{server.log_tail()}")  # type: ignore[attr-defined]


@pytest.mark.parametrize("admin", ["ipv6", "tls", "mtls"])
def test_the_image_healthcheck_follows_the_admin_settings(tmp_path: Path, admin: str) -> None:
    """HEALTHCHECK used to ask http://127.0.0.1:<port> whatever the settings: it failed with the admin port
    on [::] (which asyncio bound IPv6-only) and with --admin-tls."""
    port = smoke.free_port()
    settings = {"admin_listen": f"[::]:{port}" if admin == "ipv6" else f"127.0.0.1:{port}"}
    if admin != "ipv6":
        ca = TestCa(tmp_path)
        cert = ca.issue("tc-server", "server", server=True)
        settings |= {"admin_tls": "true", "tls_cert_file": str(cert.cert_file), "tls_key_file": str(cert.key_file)}
    if admin == "mtls":  # the admin port then refuses a handshake without a trusted client certificate
        settings |= {"tls_trust_certs_file": str(ca.cert_file), "tls_require_trusted_client_cert": "true"}
    flags: list[str] = []
    for name, value in settings.items():  # the same settings as flags of `run`, as a CMD would give them
        flags += [f"--{name.replace('_', '-')}"] + ([] if value == "true" else [value])
    with smoke.run_server(tc_server_command(), extra_args=flags, env=this_checkout_env()) as running:
        wait_started(running)
        done = image_healthcheck(settings)
        assert done.returncode == 0, done.stderr
