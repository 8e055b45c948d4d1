"""The Pulsar-protocol listeners: ``pulsar://`` and ``pulsar+ssl://`` (an ``ssl.SSLContext``, whose
certificate tc_server/auth/certificates.py reloads), both feeding the same kind of connection.

Shutdown order (as uvicorn's): stop accepting, let the requests in flight finish within a bound,
then close every connection.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

import structlog

from tc_server.auth.tls_accept import TlsServer
from tc_server.server.address_budget import AddressBudget
from tc_server.server.connection import ClientConnection, ServerContext
from tc_server.server.sockets import bound_socket

log = structlog.get_logger("tc_server.listener")

# TLS handshakes under way at once, in all (never more than --max-connections): each is done in milliseconds or
# given up (tls_accept.py), so 512 keep up with thousands of clients reconnecting at once, and hold ~27 MB at
# most. From one address, as many as --max-connections-per-address: clients behind one NAT reconnect together
# (a cap of 128 refused 272 of 400 such handshakes; a review).
MAX_TLS_HANDSHAKES = 512


class PulsarListener:
    """Bound first (the advertised URL needs the port before the coordinator campaigns), started with the
    server context once the coordinator and its dispatcher exist: nothing is accepted before."""

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None,
                 *, reuse_port: bool = False) -> None:
        self.context: ServerContext | None = None
        # SO_REUSEPORT: the workers of --workers N all bind the service port and the kernel spreads new
        # connections over them (tc_server/workers.py).
        self._reuse_port = reuse_port
        self._host = host
        self._port = port
        self._ssl = ssl_context
        self._server: asyncio.AbstractServer | None = None
        self._socket: socket.socket | None = None

    def bind(self) -> int:
        """Bind the port now (before the coordinator campaigns, which needs the advertised URL, so
        port 0 works); returns the bound port. Raises OSError (e.g. address in use)."""
        self._socket = bound_socket(self._host, self._port, reuse_port=self._reuse_port)
        return self.port

    async def start(self, context: ServerContext) -> None:
        if self._socket is None:
            self.bind()
        assert self._socket is not None
        self.context = context
        loop = asyncio.get_running_loop()
        if self._ssl is None:
            self._server = await loop.create_server(lambda: ClientConnection(context), sock=self._socket,
                                                    backlog=1024)
        else:
            # A connection counts against --max-connections[-per-address] once its handshake is done; the
            # handshakes under way have a bound of their own (tls_accept.py), smaller: one under way holds
            # ~53 KB (OpenSSL's buffers), a done connection ~35 KB, a plain one ~4 KB, and 4,000 stalled
            # handshakes took a process from 61 to 272 MiB (a review; the manifests allow 256 MiB).
            handshakes = AddressBudget(min(context.max_connections, MAX_TLS_HANDSHAKES),
                                       context.max_connections_per_address,
                                       lambda address: context.refused_at_accept("max_tls_handshakes", address))
            self._server = TlsServer([self._socket], lambda: ClientConnection(context), self._ssl, handshakes,
                                     backlog=1024)
        log.info("listening", address=f"{self._host}:{self.port}", tls=self._ssl is not None)

    @property
    def port(self) -> int:
        assert self._socket is not None
        return int(self._socket.getsockname()[1])

    def stop_accepting(self) -> None:
        """Close the listening socket; connections already open stay (stop() drains them)."""
        if self._server is not None:
            self._server.close()

    async def stop(self, drain_timeout_s: float) -> None:
        """Stop accepting, then drain every connection of the shared context (both listeners'). A listener
        bound but never started (the start failed later) just releases its port."""
        if self._server is None or self.context is None:
            if self._socket is not None:
                self._socket.close()
            return
        self._server.close()
        connections = list(self.context.connections)
        if connections:
            await asyncio.gather(*(c.drain(drain_timeout_s) for c in connections))
        await self._server.wait_closed()
        self._server = None
