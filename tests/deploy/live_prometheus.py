"""A real Prometheus (Debian's package, as tests/deploy/test_alerts.py finds it) with the shipped rules, scraping
tc-server admin ports: what the rules see of real processes."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

from tc_server.bench.process import free_port, terminate_process
from tests.deploy.test_alerts import RULES, tool, urllib_open

INTERVAL = "1s"


class Prometheus:
    """A real Prometheus with the shipped rules, scraping the given admin ports as job tc-server."""

    def __init__(self, workdir: Path, targets: list[str]) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "tc-server", "static_configs": [{"targets": targets}]}],
        }
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [tool("prometheus"), f"--config.file={workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 30
            while not self._ready():
                assert time.monotonic() < deadline, "Prometheus not ready within 30 s"
                time.sleep(0.25)
        except BaseException:
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

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"])

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def stop(self) -> None:
        terminate_process(self.proc, timeout_s=10, kill_wait_s=5)
