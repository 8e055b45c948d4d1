"""TLS servers whose handshakes under way are bounded, per client address and in all.

asyncio's own TLS server (``create_server(ssl=...)``, uvloop's too) calls a protocol's ``connection_made``
only once the handshake is done, so connection limits counted there (``--max-connections[-per-address]``,
the admin port's budget) did not see a socket whose handshake never finished: anyone who could reach the
port held a descriptor for each such socket, for the handshake timeout, as many as they liked. A Pulsar
broker counts a connection when it is accepted, before its TLS handshake (Netty's ``channelActive``).

:class:`TlsServer` accepts the TCP connections itself (``sock_accept``), where the client's address is
known, counts each handshake under way against an :class:`AddressBudget` (a connection past it is closed
at once), and hands the socket to ``connect_accepted_socket``, which runs the handshake (bounded by its
timeout) and then gives the protocol its TLS transport; the protocol's own limits apply from there, as
before. A client so holds at most its share of handshakes plus its share of connections. (Accepting
plain TCP and calling ``start_tls`` instead loses the ClientHello on uvloop, which starts reading after
``connection_made`` whatever the protocol paused.)
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from collections.abc import Callable

import structlog

from tc_server.server.address_budget import AddressBudget

log = structlog.get_logger(__name__)

# Long enough for a client across a slow link; a client that stalls holds its socket no longer.
HANDSHAKE_TIMEOUT_S = 10.0
# When the bound of handshakes in all is reached, a new connection (from an address under its own bound) takes
# the slot of the oldest handshake under way this long: clients that stall their handshakes (each holds ~53 KB)
# then keep others out only by opening sockets faster than this, where they held every slot for the whole
# timeout. A handshake completes in milliseconds, a few hundred across a slow link.
GIVE_UP_AFTER_S = 2.0
# accept() failing for want of descriptors or memory: try again after this rather than spin (asyncio's
# own server waits a second too).
ACCEPT_RETRY_S = 1.0
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class TlsServer(asyncio.AbstractServer):
    """Serves ``protocol_factory``'s protocols over TLS on ``sockets`` (bound; listened to here with
    ``backlog``), a handshake counted against ``budget`` from its accept until it ends. Closed as
    ``create_server``'s server is (``close``, then ``wait_closed``)."""

    def __init__(self, sockets: list[socket.socket], protocol_factory: Callable[[], asyncio.Protocol],
                 context: ssl.SSLContext, budget: AddressBudget, *, backlog: int,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        self._loop = asyncio.get_running_loop()
        self._sockets = sockets
        self._factory = protocol_factory
        self._context = context
        self.budget = budget
        self._timeout_s = handshake_timeout_s
        # Under way, in the order they began: when (loop time) and from where. Whoever takes one out (its end, or
        # a newer connection taking its slot) gives its slot back.
        self._handshakes: dict[asyncio.Task[None], tuple[float, str]] = {}
        for sock in sockets:
            sock.listen(backlog)
            sock.setblocking(False)
        self._accepting = [self._loop.create_task(self._accept_forever(sock), name="tls-accept") for sock in sockets]

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return any(not task.done() for task in self._accepting)

    async def start_serving(self) -> None:
        """Serving from the start (as create_server's default)."""

    async def serve_forever(self) -> None:
        await self.wait_closed()

    def close(self) -> None:
        """Stop accepting (each accept task closes its socket as it ends) and give up the handshakes under
        way; connections already handed to their protocol stay, as with ``create_server``'s server."""
        for task in (*self._accepting, *self._handshakes):
            task.cancel()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._accepting, *self._handshakes, return_exceptions=True)

    async def _accept_forever(self, sock: socket.socket) -> None:
        try:
            while True:
                try:
                    conn, peer = await self._loop.sock_accept(sock)
                except OSError as exc:
                    if sock.fileno() == -1 or exc.errno in (errno.EBADF, errno.EINVAL):
                        return  # the socket is closed or no longer listens: nothing more to accept
                    if exc.errno in _OUT_OF_RESOURCES:
                        log.warning("accept failed; trying again", error=repr(exc), retry_after_s=ACCEPT_RETRY_S)
                        await asyncio.sleep(ACCEPT_RETRY_S)
                    continue  # otherwise a connection that went before it was accepted (ECONNABORTED)
                address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
                if self.budget.full_for_others_than(address):
                    self._give_up_oldest()
                if not self.budget.admit(address):
                    conn.close()
                    continue
                if conn.family in (socket.AF_INET, socket.AF_INET6):
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as create_server's transports
                handshake = self._loop.create_task(self._handshake(conn, address))
                self._handshakes[handshake] = (self._loop.time(), address)
        finally:
            sock.close()

    def _give_up_oldest(self) -> None:
        """Give the oldest handshake's slot to a new connection, if it has been under way GIVE_UP_AFTER_S."""
        oldest = next(iter(self._handshakes), None)
        if oldest is None or self._loop.time() - self._handshakes[oldest][0] < GIVE_UP_AFTER_S:
            return
        _, address = self._handshakes.pop(oldest)
        self.budget.release(address)
        oldest.cancel()

    async def _handshake(self, conn: socket.socket, address: str) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn, ssl=self._context,
                                                     ssl_handshake_timeout=self._timeout_s)
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            # A client that is not TLS, does not trust the certificate, or stalled: as with create_server,
            # no protocol sees it (the refused certificate is the client's to report).
            log.debug("TLS handshake failed", peer=address, error=repr(exc))
            conn.close()
        except asyncio.CancelledError:  # its slot given to a newer connection, or the server closing
            conn.close()
            raise
        finally:
            task = asyncio.current_task()
            if task is not None and self._handshakes.pop(task, None) is not None:
                self.budget.release(address)
