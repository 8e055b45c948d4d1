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
    """A TCP socket bound to ``host`` (an address, or a name resolved here, once, to its first address)
    and ``port`` (0: a free one), with SO_REUSEADDR, not yet listening. ``reuse_port``: SO_REUSEPORT, for
    the workers of ``--workers N`` that all bind the service port (tc_server/workers.py). Raises OSError
    (``socket.gaierror`` for a name that does not resolve)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
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
