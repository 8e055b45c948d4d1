"""One client-side Pulsar connection: tc-server talking to a broker (or a peer), and our test client.

A thin ``asyncio.Protocol`` around the sans-IO codec, like the server side: CONNECT handshake with the
credentials it is given (answering AUTH_CHALLENGE with them, during the handshake and on refresh),
keep-alive both ways, and request-id correlation so that many requests are in flight at once. An
answer comes back as the typed command and its frame bytes (a forwarded answer is relayed verbatim).
Which failures are worth retrying is said by :mod:`tc_server.client.errors`.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import structlog

from tc_server.client.errors import (
    ClientError,
    ConnectionClosed,
    ConnectionFailed,
    HandshakeRefused,
    RequestTimedOut,
)
from tc_server.outgoing import OutgoingFrames
from tc_server.wire import (
    MESSAGE_SIZE_FRAME_PADDING,
    AuthChallenge,
    AuthResponse,
    Command,
    Connect,
    Connected,
    Error,
    FrameDecoder,
    FrameError,
    MalformedCommand,
    Ping,
    Pong,
    ServerError,
    decode_command,
    encode_command,
    encode_frame,
)

log = structlog.get_logger("tc_server.client")

CLIENT_VERSION = "tc-server"
# The newest protocol version we speak (docs/pulsar-protocol.md: Java 4.x sends 21).
PROTOCOL_VERSION = 21
# What a broker may send us: its frames are bounded by its maxMessageSize (5 MiB default) + 10 KiB,
# and the answers we wait for are far smaller; a peer announcing more is broken.
MAX_FRAME_SIZE = 5 * 1024 * 1024 + 10 * 1024
# A peer's CONNECTED may announce more (its maxMessageSize): frames up to that are taken from it, up to what a
# 32-bit size field holds.
MAX_ANNOUNCED_FRAME_SIZE = 2**31 - 1

# Called with every command that answers no pending request (pushes, late answers, unmatched ERRORs).
CommandListener = Callable[[Command, bytes], None]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a ``pulsar://`` or ``pulsar+ssl://`` URL points."""

    host: str
    port: int
    tls: bool

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Raises ValueError naming the URL when it is not ``pulsar[+ssl]://HOST:PORT``."""
        parts = urlsplit(url)
        if parts.scheme not in ("pulsar", "pulsar+ssl") or not parts.hostname:
            raise ValueError(f"not a pulsar://HOST:PORT or pulsar+ssl://HOST:PORT URL: {url!r}")
        try:
            port = parts.port
        except ValueError:
            port = None
        if port is None:
            raise ValueError(f"no port in {url!r}")
        return cls(parts.hostname, port, parts.scheme == "pulsar+ssl")

    @classmethod
    def with_tls(cls, url: str, ssl_context: ssl.SSLContext | None) -> tuple[Endpoint, ssl.SSLContext | None]:
        """``url`` parsed, and the TLS context to connect with (None: plain TCP). A caller that hands a
        context speaks TLS to every broker: a ``pulsar://`` URL is then refused (ValueError), not connected
        to in plain, which carried tc-server's own broker token in the clear to a plain URL a lookup
        answer named in its TLS field."""
        endpoint = cls.parse(url)
        if not endpoint.tls:
            if ssl_context is not None:
                raise ValueError(f"{url} is not a pulsar+ssl:// URL, while the brokers are reached over TLS (the "
                                 "credentials would cross it in the clear)")
            return endpoint, None
        return endpoint, ssl_context if ssl_context is not None else ssl.create_default_context()


@dataclass(frozen=True, slots=True)
class ClientAuth:
    """The credentials a CONNECT carries: ``auth_method_name`` and ``auth_data`` (docs/pulsar-protocol.md §1)."""

    method: str = "none"
    data: bytes | None = None


NO_AUTH = ClientAuth()


def connect_command(auth: ClientAuth = NO_AUTH, client_version: str = CLIENT_VERSION,
                    protocol_version: int = PROTOCOL_VERSION) -> Connect:
    return Connect(client_version=client_version, protocol_version=protocol_version,
                   auth_method_name=auth.method, auth_data=auth.data)


class PulsarConnection(asyncio.Protocol):
    """Use :func:`open_connection` (or :meth:`handshake` after ``loop.create_connection``)."""

    def __init__(self, url: str = "", *, keepalive_s: float | None = None,
                 on_command: CommandListener | None = None, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self.url = url
        self._decoder = FrameDecoder(max_frame_size)
        self._transport: asyncio.Transport | None = None
        # Frames sent in one loop turn leave in one write (outgoing.py): a group commit resolves many
        # decisions at once, and their END_TXN_ON_PARTITION requests to one broker then share a send().
        self._out = OutgoingFrames(loop)
        self._pending: dict[int, asyncio.Future[tuple[Command, bytes]]] = {}
        self._ids = itertools.count(1)
        self._connect: Connect | None = None
        self._connected: asyncio.Future[Connected] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self._on_command = on_command
        self._keepalive_s = keepalive_s
        self._keepalive: asyncio.TimerHandle | None = None
        # Loop time since when the peer has owed an answer without sending one (keep-alive traffic does not
        # count); None while it owes none (see owed_answer_for).
        self._owed_since: float | None = None
        self._answered_in_read = False  # a frame of the read under way was more than keep-alive or a challenge
        # Requests whose asker stopped waiting unanswered since the peer's last answer (see unanswered_requests).
        self._unanswered = 0
        self._waiting_pong = False
        self._pong_waiters: list[asyncio.Future[Pong]] = []
        self.answer_pings = True
        self.pings_received = 0
        # Where fresh credentials come from when the peer challenges (a token file read again, as
        # BrokerClientCredentials.auth_data does); None: answer with CONNECT's auth_data again.
        self.auth_data_source: Callable[[], bytes] | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._out.transport = self._transport

    def data_received(self, data: bytes) -> None:
        self._answered_in_read = False
        self._decoder.feed(data)
        try:
            while (frame := self._decoder.next_frame()) is not None:
                self._on_frame(frame)
                if self._transport is not None and self._transport.is_closing():
                    # Closed by that frame (an ERROR refusing the handshake): the rest of the read is
                    # moot, and a PING or AUTH_CHALLENGE in it could not be answered any more.
                    break
        except (FrameError, MalformedCommand) as exc:
            # The peer's stream cannot be trusted past this point: fail what waits on it.
            log.warning("bad frame from peer; closing", url=self.url, error=str(exc))
            self.close()
        # The peer answers as of now: what it still owes, it owes from now on. PINGs and PONGs alone say nothing
        # of it: a broker whose lookups hang (its metadata store stuck) while its I/O thread still answers
        # keep-alives was never taken for hung, each forward timing out on it (a review).
        if self._answered_in_read:
            self._owed_since = self._loop.time() if self._pending else None
            self._unanswered = 0

    def eof_received(self) -> bool | None:
        # The peer closed its sending side; what we queued this turn still goes before asyncio closes.
        self._out.flush()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        reason = f"connection lost ({exc!r})" if exc else "connection closed"
        self._fail_all(ConnectionClosed(self.url, reason))
        if not self._connected.done():
            self._connected.set_exception(ConnectionFailed(self.url, f"{reason} during the handshake"))
            self._connected.exception()  # retrieved: a failed handshake is reported by handshake()
        if not self.closed.done():
            self.closed.set_result(None)

    # -- inbound ---------------------------------------------------------------------------------

    def _on_frame(self, frame: bytes) -> None:
        cmd = decode_command(frame)
        self._waiting_pong = False  # any command proves the peer alive (PulsarHandler does the same)
        kind = type(cmd)
        if kind is Ping:
            self.pings_received += 1
            if self.answer_pings:
                self.send(Pong())
            return
        if kind is Pong:
            waiters, self._pong_waiters = self._pong_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(cast(Pong, cmd))
            return
        if kind is AuthChallenge:
            self._answer_challenge(cast(AuthChallenge, cmd))
            return
        if self._connect is not None and not self._connected.done():
            if kind is Connected:
                connected = cast(Connected, cmd)
                if connected.max_message_size:
                    # Its frames from here are bounded by what it announces, as the Java client's decoder is: a
                    # broker with a larger maxMessageSize answered a forwarded GET_SCHEMA over 5 MiB in a frame
                    # that failed this connection, and the client heard MetadataError on every retry (a review).
                    self._decoder.max_frame_size = max(self._decoder.max_frame_size, min(
                        connected.max_message_size + MESSAGE_SIZE_FRAME_PADDING, MAX_ANNOUNCED_FRAME_SIZE))
                self._connected.set_result(connected)
                self._schedule_keepalive()
                return
            if kind is Error:
                error = cast(Error, cmd)
                self._connected.set_exception(HandshakeRefused(self.url, error.error, error.message))
                self._connected.exception()
                self.close()
                return
        self._answered_in_read = True
        request_id = getattr(cmd, "request_id", None)
        answered = self._pending.pop(request_id, None) if request_id is not None else None
        if answered is not None:
            if not answered.done():
                answered.set_result((cmd, encode_frame(frame)))
        elif self._on_command is not None:
            self._on_command(cmd, encode_frame(frame))

    def _answer_challenge(self, challenge: AuthChallenge) -> None:
        # The broker asks again for credentials during the handshake (multi-step methods) or to
        # refresh them ("PulsarAuthRefresh"); a token client answers with its token again.
        connect = self._connect
        if connect is None:
            return
        try:
            data = self.auth_data_source() if self.auth_data_source is not None else connect.auth_data
        except Exception as exc:  # noqa: BLE001 - a token file being replaced, a variable unset (ConfigError)
            # Not into the event loop from data_received (asyncio logged a fatal error with a traceback and
            # cut the connection anyway, a review): said, and what waits on the connection fails as closed,
            # which callers retry on a new one (its credentials read again).
            log.warning("cannot answer the peer's credential challenge; closing the connection", peer=self.url,
                        error=str(exc))
            self.abort(f"cannot answer the peer's credential challenge: {exc}")
            return
        self.send(AuthResponse(connect.client_version, connect.auth_method_name, data, connect.protocol_version))

    def set_listener(self, on_command: CommandListener | None) -> None:
        """Where commands that answer no pending request go from now on."""
        self._on_command = on_command

    # -- outbound --------------------------------------------------------------------------------

    def send(self, cmd: Command) -> None:
        self.send_raw(encode_command(cmd))

    def send_raw(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ConnectionClosed(self.url, "connection is closed")
        self._out.add(data)

    def next_request_id(self) -> int:
        return next(self._ids)

    async def handshake(self, connect: Connect, timeout_s: float | None = None) -> Connected:
        """Send CONNECT and wait for CONNECTED. Raises HandshakeRefused, ConnectionFailed."""
        self._connect = connect
        self.send(connect)
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(self._connected)
        except TimeoutError:
            self.close()
            raise ConnectionFailed(self.url, f"no CONNECTED within {timeout_s} s") from None

    @property
    def connected(self) -> Connected:
        """CONNECTED as the peer sent it (only after :meth:`handshake`)."""
        return self._connected.result()

    @property
    def is_usable(self) -> bool:
        return self._connected.done() and not self._connected.exception() and not self.closed.done()

    async def request(self, cmd: Any, timeout_s: float | None = None) -> Any:
        """Send ``cmd`` (which has a ``request_id``) and return the command that answers it: its typed
        response, or ERROR. Raises ConnectionClosed, RequestTimedOut."""
        answer, _ = await self.request_frame(encode_command(cmd), cmd.request_id, timeout_s)
        return answer

    async def request_frame(self, frame: bytes, request_id: int,
                            timeout_s: float | None = None) -> tuple[Command, bytes]:
        """Send an encoded frame whose command carries ``request_id``; return the answer and its frame.
        Raises ConnectionClosed, RequestTimedOut."""
        if self.closed.done():
            raise ConnectionClosed(self.url, "connection is closed")
        waiter: asyncio.Future[tuple[Command, bytes]] = self._loop.create_future()
        self._pending[request_id] = waiter
        try:
            self.send_raw(frame)
            if self._owed_since is None:
                self._owed_since = self._loop.time()
            if timeout_s is None:  # the caller bounds it, if anything does: no Timeout per request (issue 13)
                return await waiter
            async with asyncio.timeout(timeout_s):
                return await waiter
        except TimeoutError:
            raise RequestTimedOut(self.url, f"no answer to request {request_id} within {timeout_s} s") from None
        finally:
            # A late answer then finds nothing and goes to on_command (or is dropped).
            if self._pending.get(request_id) is waiter:
                del self._pending[request_id]
                self._unanswered += 1

    async def ping(self, timeout_s: float | None = None) -> Pong:
        waiter: asyncio.Future[Pong] = asyncio.get_running_loop().create_future()
        self._pong_waiters.append(waiter)
        self.send(Ping())
        async with asyncio.timeout(timeout_s):
            return await waiter

    @property
    def awaited_requests(self) -> int:
        """Requests sent whose asker still waits for the answer."""
        return len(self._pending)

    @property
    def unanswered_requests(self) -> int:
        """Requests whose asker stopped waiting (its deadline) without an answer since the peer's last answer:
        one alone may be a request the peer still works on, or lost; two in a row, a peer that does not answer."""
        return self._unanswered

    def owed_answer_for(self) -> float:
        """Seconds the peer has owed an answer without sending any (PINGs, PONGs and challenges are no answer):
        since the first request after the last answer it sent, also when whoever asked has given up waiting.
        0.0 when it owes none."""
        if self._owed_since is None:
            return 0.0
        return self._loop.time() - self._owed_since

    @property
    def unsent_bytes(self) -> int:
        """Bytes written but not yet taken by the peer's socket: the transport's write buffer, and what waits
        for the end of this turn to be written (outgoing.py; many forwards of one turn all queue there)."""
        buffered = self._transport.get_write_buffer_size() if self._transport is not None else 0
        return buffered + self._out.queued_bytes

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._out.flush()  # what was sent before close() still goes
            self._transport.close()

    def abort(self, reason: str) -> None:
        """Close now, dropping what is unsent, and fail what waits with ConnectionClosed(``reason``): for a
        peer that stopped answering or reading, which a graceful close would wait on forever (asyncio
        keeps a closing transport open until its write buffer drains)."""
        self._fail_all(ConnectionClosed(self.url, reason))
        if self._transport is not None:
            self._transport.abort()

    def _fail_all(self, error: ClientError) -> None:
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            if not waiter.done():
                waiter.set_exception(error)

    # -- keep-alive ------------------------------------------------------------------------------

    def _schedule_keepalive(self) -> None:
        if self._keepalive_s is not None and not self.closed.done():
            self._keepalive = asyncio.get_running_loop().call_later(self._keepalive_s, self._on_keepalive)

    def _on_keepalive(self) -> None:
        """PulsarHandler's tick: no PONG since the last PING → close; else PING again."""
        if self._waiting_pong:
            log.warning("peer did not answer PING; closing", url=self.url)
            self.abort(f"no answer to PING within {self._keepalive_s} s")
            return
        self._waiting_pong = True
        try:
            self.send(Ping())
        except ConnectionClosed:
            return
        self._schedule_keepalive()


async def open_connection(
    url: str,
    connect: Connect | None = None,
    *,
    ssl_context: ssl.SSLContext | None = None,
    timeout_s: float = 10.0,
    keepalive_s: float | None = 30.0,
    on_command: CommandListener | None = None,
    factory: Callable[[], PulsarConnection] | None = None,
) -> PulsarConnection:
    """Connect to ``url`` and finish the handshake with ``connect`` (default: no credentials).

    Raises ConnectionFailed (unreachable, refused, TLS failure, no answer in ``timeout_s``, a plain URL
    with ``ssl_context``: Endpoint.with_tls), HandshakeRefused (ERROR in answer to CONNECT), ValueError (a
    malformed URL)."""
    try:
        endpoint, ssl_context = Endpoint.with_tls(url, ssl_context)
    except ValueError as exc:
        if ssl_context is None:
            raise
        raise ConnectionFailed(url, str(exc)) from None
    loop = asyncio.get_running_loop()

    def make() -> PulsarConnection:
        if factory is not None:
            return factory()
        return PulsarConnection(url, keepalive_s=keepalive_s, on_command=on_command)

    try:
        async with asyncio.timeout(timeout_s):
            _, conn = await loop.create_connection(make, endpoint.host, endpoint.port, ssl=ssl_context)
    except (OSError, TimeoutError) as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or repr(exc))
        raise ConnectionFailed(url, f"cannot connect: {reason}") from None
    except ValueError as exc:
        # A host name the resolver cannot encode ("a..b", a label over 63 characters: UnicodeError) or take at
        # all (a NUL in it), as a broker's REDIRECT may name: it escaped as a ValueError, and the client whose
        # lookup followed it was never answered (reviews).
        raise ConnectionFailed(url, f"cannot connect: the host name {endpoint.host[:256]!r} is not valid: "
                                    f"{exc}") from None
    conn.url = url
    try:
        await conn.handshake(connect or connect_command(), timeout_s)
    except asyncio.CancelledError:
        # Whoever opened it gave up (its deadline, or it was closed): nobody else holds this connection.
        conn.close()
        raise
    return conn


def error_of(answer: Command) -> tuple[ServerError, str] | None:
    """The error an answer carries (a typed response's ``error`` or an ERROR frame), or None."""
    if isinstance(answer, Error):
        return answer.error, answer.message
    error = getattr(answer, "error", None)
    if error is None:
        return None
    return error, getattr(answer, "message", None) or error.name
