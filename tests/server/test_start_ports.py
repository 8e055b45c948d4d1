"""The ports a start takes. A start that fails part way gives back what it took: the service port is bound
before the coordinator campaigns (the advertised URL needs it), so a later failure (here the admin port,
held by someone else) must release it, or an in-process retry, a test or an embedding program finds it
still in use. A port inside the host's ephemeral range is named in a warning: a restart can find it held
by an outgoing connection (README, *Several cores*)."""

from __future__ import annotations

import socket
from dataclasses import replace

import pytest
import structlog

from tc_server.app import start_app
from tc_server.bench.process import free_port
from tc_server.config import ephemeral_port_range


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


async def test_a_port_inside_the_ephemeral_range_is_warned_about(settings):
    low, high = ephemeral_port_range()
    with socket.socket() as probe:  # the kernel's pick for port 0 lies inside the range
        probe.bind(("127.0.0.1", 0))
        inside = probe.getsockname()[1]
    assert low <= inside <= high
    with structlog.testing.capture_logs() as logged:
        app = await start_app(replace(settings, listen=f"127.0.0.1:{free_port()}", admin_listen=f"127.0.0.1:{inside}"))
        await app.stop()
    warned = [e for e in logged if e["event"].startswith("a port inside the host's ephemeral range")]
    assert [(e["setting"], e["address"], e["ephemeral_range"]) for e in warned] == [
        ("--admin-listen", f"127.0.0.1:{inside}", f"{low}-{high}")]
