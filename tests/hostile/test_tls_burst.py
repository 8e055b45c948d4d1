"""A burst of TLS clients from one address (clients behind one NAT reconnecting together) against the bound of
handshakes under way (auth/tls_accept.py, server/listener.py), on a real ``tc-server run`` with its default
limits: a per-address cap of 128 refused 272 of 400 such handshakes (a review)."""

from __future__ import annotations

import asyncio
import resource
import ssl
from pathlib import Path

import pytest

from tests.security.pki import TestCa
from tests.support.server_process import ServerProcess, free_port, started

CLIENTS = 400  # well under --max-connections-per-address (1024) and --max-connections (4096)


async def _handshake(port: int, context: ssl.SSLContext) -> bool:
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost"), 30)
    except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError):
        return False
    writer.transport.abort()
    return True


@pytest.mark.timeout(120)
async def test_a_reconnect_burst_from_one_address_is_not_refused(tmp_path: Path) -> None:
    """listener.py says 512 handshakes "keep up with thousands of clients reconnecting at once", but the bound
    per address is 128 and a connection past it is accepted and closed at once (tls_accept.py: admit() fails ->
    conn.close()); the give-up of the oldest applies only when the bound in all is full. So 400 well-behaved
    clients behind one address (a NAT, a node's SNAT, an application host), reconnecting together after a
    restart of tc-server, see part of their TLS handshakes fail, well under --max-connections-per-address. Before
    this change the bound was the connection limits (1024 per address) and every one was served."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8_000)), hard))
    ca = TestCa(tmp_path)
    issued = ca.issue("localhost", "server", server=True)
    tls_port = free_port()
    server = started(ServerProcess(tmp_path / "data", "--tls-listen", f"127.0.0.1:{tls_port}",
                                   "--tls-cert-file", str(issued.cert_file), "--tls-key-file", str(issued.key_file)))
    try:
        context = ssl.create_default_context(cafile=str(ca.cert_file))
        results = await asyncio.gather(*(_handshake(tls_port, context) for _ in range(CLIENTS)))
        failed = results.count(False)
        assert failed == 0, f"{failed} of {CLIENTS} TLS handshakes from one address were refused"
    finally:
        server.kill()
