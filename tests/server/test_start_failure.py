"""A start that fails part way gives back what it took: the service port is bound before the coordinator
campaigns (the advertised URL needs it), so a later failure (here the admin port, held by someone else)
must release it, or an in-process retry, a test or an embedding program finds it still in use."""

from __future__ import annotations

import socket
from dataclasses import replace

import pytest

from tc_server.app import start_app
from tc_server.bench.process import free_port


async def test_a_failed_start_releases_the_service_port(settings):
    service_port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        admin = f"127.0.0.1:{holder.getsockname()[1]}"
        with pytest.raises(OSError, match=f"address already in use: {admin} \\(--admin-listen"):
            await start_app(replace(settings, listen=f"127.0.0.1:{service_port}", admin_listen=admin))
    with socket.socket() as again:  # SO_REUSEADDR off: a port still held (or listening) refuses this
        again.bind(("127.0.0.1", service_port))
    app = await start_app(replace(settings, listen=f"127.0.0.1:{service_port}"))
    try:
        assert app.listener is not None and app.listener.port == service_port
    finally:
        await app.stop()
