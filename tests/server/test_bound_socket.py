"""tc_server/server/sockets.bound_socket bound a host NAME to the first address it resolves to. Before it,
the admin port (asyncio's create_server) listened on every address of the name, and the Pulsar port bound
the name's IPv4 address (AF_INET). Where /etc/hosts has ``::1 localhost`` (Debian's and Docker's default)
glibc answers ::1 first, so ``--listen localhost:6650`` / ``--admin-listen localhost:8080`` refused
127.0.0.1. A name is now bound at its first IPv4 address (a review's test)."""

from __future__ import annotations

import socket

import pytest

from tc_server.server import sockets


def test_a_name_is_bound_at_its_ipv4_address_too(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def resolver(host, port, *args, **kwargs):  # as glibc answers with "::1 localhost" in /etc/hosts
        if host == "localhost":
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
                    (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    sock = sockets.bound_socket("localhost", 0)
    try:
        sock.listen()
        port = sock.getsockname()[1]
        with socket.socket(socket.AF_INET) as client:
            client.settimeout(2)
            # It was: ConnectionRefusedError (only [::1] is listening).
            assert client.connect_ex(("127.0.0.1", port)) == 0
    finally:
        sock.close()
