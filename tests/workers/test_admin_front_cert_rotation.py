"""The supervisor trusts only the certificate it serves itself when it forwards a call to a worker's admin
port (workers_front.WorkerCertificates). It rebuilt that trust only when ITS OWN reload happened, and each
process checks the files on its own timer (--tls-cert-refresh-check-s, default 300 s): after a rotation,
until every process had reloaded, a worker presented a certificate the supervisor did not trust, and
forwarded /admin/v3/transactions calls were 503s (a review's test). It now trusts the previous certificate
too and reads the file again when a worker presents another."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tc_server.admin.routes import PREFIX
from tests.security.pki import TestCa
from tests.support.server_process import started
from tests.workers.helpers import workers_server

INTERVAL_S = 4.0


async def test_forwarded_admin_calls_survive_a_certificate_rotation(tmp_path: Path) -> None:
    ca = TestCa(tmp_path)
    cert = ca.issue("tc-server", "server", server=True)
    server = started(workers_server(tmp_path, "--admin-tls", "--tls-cert-file", str(cert.cert_file),
                                    "--tls-key-file", str(cert.key_file),
                                    "--tls-cert-refresh-check-s", str(INTERVAL_S)))
    try:
        assert server.get_json(f"{PREFIX}/coordinators")[0] == 200
        ca.issue("tc-server", "server", server=True)  # the rotation: same paths, a new key and certificate
        failures: list[str] = []
        answered = 0
        deadline = time.monotonic() + 3 * INTERVAL_S
        while time.monotonic() < deadline:
            for worker_path in (f"{PREFIX}/transactionMetadata/0/1", f"{PREFIX}/transactionMetadata/1/1"):
                code, body = await asyncio.to_thread(server.get_json, worker_path, 10.0)
                answered += 1
                if code == 503:
                    failures.append(str(body)[:300])
            await asyncio.sleep(0.05)
        assert "TLS certificate reloaded" in server.log_path.read_text()
        # It was: tens of 503s "worker k ... did not answer: ClientConnectorCertificateError(... certificate
        # verify failed ...)" between the supervisor's reload and the worker's.
        assert not failures, f"{len(failures)} of {answered} forwarded calls failed after a rotation: {failures[:1]}"
    finally:
        assert server.stop() == 0
