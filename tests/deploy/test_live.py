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
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

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


@pytest.fixture(scope="module")
def server() -> Iterator[object]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    with smoke.run_server(tc_server_command(), env=env) as running:
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


def test_every_dashboard_series_is_in_a_fresh_scrape(server: object) -> None:
    seen = scrape(server)
    wanted = {name for expr in dashboard_exprs(dashboard()) for name in metric_names(expr)}
    missing = sorted(wanted - set(seen))
    assert not missing, (
        "series the dashboard reads are absent from /metrics of a freshly started server "
        f"(labelled families need their label sets created at start): {missing}")


def test_coordinator_series_carry_cluster_and_coordinator_id(server: object) -> None:
    seen = scrape(server)
    assert "pulsar_txn_created_total" in seen and "pulsar_txn_active_count" in seen
    coordinator_series = [n for n in seen if n.startswith("pulsar_txn_") and "metadata_store" not in n
                          and not n.endswith("_created")]
    for name in coordinator_series:
        assert {"cluster", "coordinator_id"} <= seen[name], name


def test_the_image_healthcheck_command_passes(server: object) -> None:
    """The Dockerfile's HEALTHCHECK, run as Docker would (exec form), with the admin port from the env."""
    (check,) = dockerfile_stages()[-1].args("HEALTHCHECK")
    argv = json.loads(check[check.index("CMD") + len("CMD"):].strip())
    assert argv[0] == "python"
    admin_listen = f"127.0.0.1:{server.admin_port}"  # type: ignore[attr-defined]
    env = {**os.environ, "TC_SERVER_ADMIN_LISTEN": admin_listen}
    assert subprocess.run([sys.executable, *argv[1:]], env=env, timeout=10).returncode == 0
    env["TC_SERVER_ADMIN_LISTEN"] = f"127.0.0.1:{smoke.free_port()}"  # nothing listens there
    assert subprocess.run([sys.executable, *argv[1:]], env=env, timeout=10,
                          capture_output=True).returncode != 0
