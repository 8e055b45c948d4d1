"""The supervisor forwards ``str(request.rel_url)`` as it came (workers_front.WorkersAdmin._ask) and the
client library normalizes dot segments: a call authorized and routed as /admin/v3/transactions/... reached
any path of a worker's admin port (its /readyz and /metrics). Dot segments are now refused (a review's)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.support.server_process import started
from tests.workers.helpers import workers_server


def _raw_get(port: int, target: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


async def test_a_forwarded_call_stays_under_the_transactions_api(tmp_path: Path) -> None:
    server = started(workers_server(tmp_path))
    try:
        for target in ("/admin/v3/transactions/../../../readyz", "/admin/v3/transactions/%2e%2e/%2e%2e/%2e%2e/metrics"):
            answer = _raw_get(server.admin_port, target)
            status_line = answer.split(b"\r\n", 1)[0]
            # It was: 200 with worker 0's own /readyz ({"ready":true,"led":[0,2]}) and its /metrics.
            assert b" 404 " in status_line or b" 400 " in status_line, (target, answer[:300])
    finally:
        assert server.stop() == 0
