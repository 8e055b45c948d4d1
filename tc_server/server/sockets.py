"""The one way every listening port of tc-server is bound: the Pulsar listeners and the admin port.

A wildcard IPv6 address (``[::]``) takes IPv4 clients too (IPV6_V6ONLY off), as Pulsar's own Java
listeners on ``::`` do: an operator who follows the IPv6 advice on a dual-stack cluster keeps every port
reachable at both families, the kubelet's probes and Prometheus's scrapes included. asyncio's and
aiohttp's own binding (``create_server(host=...)``) makes ``::`` IPv6-only, so the admin port used to
refuse at 127.0.0.1 what the Pulsar ports on the same ``::`` answered.
"""

from __future__ import annotations

import socket


def bound_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host`` and ``port`` (0: a free one), with SO_REUSEADDR, not yet listening. A
    name is resolved here, once, to its first IPv4 address (its IPv6 one where it has none): ``localhost`` is
    127.0.0.1, where the probes and clients of this host ask, also where /etc/hosts names ``::1`` first (the
    Debian and Docker default). ``reuse_port``: SO_REUSEPORT, for the workers of ``--workers N`` that all
    bind the service port (tc_server/workers.py). Raises OSError (``socket.gaierror`` for a name that does
    not resolve)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = next((info for info in found if info[0] == socket.AF_INET), found[0])
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock
