"""One client connection: a thin ``asyncio.Protocol`` around the sans-IO codec.

``data_received`` feeds the frame decoder and handles each command: discovery and keep-alive are
answered at once; transaction requests run as tasks so that many are in flight per connection (the
Java client pipelines up to 1000 per coordinator handler, and all handlers for one server share one
connection). Bad input is answered and contained here: it can close this connection, never another.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, cast

import structlog

from tc_server.auth.certificates import ServerTlsContext
from tc_server.client import ConnectionFailed
from tc_server.logs import LogLimiter
from tc_server.metrics import Metrics
from tc_server.outgoing import OutgoingFrames
from tc_server.server import discovery
from tc_server.server.address_budget import AddressBudget
from tc_server.server.dispatch import Dispatcher, TxnRequest
from tc_server.server.flow_control import ReadFlowControl
from tc_server.server.handshake import (
    MIN_TC_CLIENT_CONNECT_VERSION,
    AuthenticationFailed,
    Authenticator,
    AuthSession,
    InvalidRoles,
    RefreshAction,
    negotiate,
    refresh_challenge,
    wall_clock_ms,
)
from tc_server.server.relay import BrokerSide, open_relay
from tc_server.server.upstream import (
    FORWARDED_COMMANDS,
    ForwardingSession,
    Upstream,
    connect_for_broker,
    error_answer,
    host_port,
)
from tc_server.wire import (
    MESSAGE_SIZE_FRAME_PADDING,
    AddPartitionToTxn,
    AddSubscriptionToTxn,
    AuthResponse,
    Command,
    Connect,
    EndTxn,
    Error,
    FrameDecoder,
    FrameError,
    Lookup,
    MalformedCommand,
    NewTxn,
    PartitionedMetadata,
    Ping,
    Pong,
    ServerError,
    TcClientConnect,
    WatchTcAssignments,
    WatchTcAssignmentsClose,
    WatchTcAssignmentsUpdate,
    command_name,
    decode_command,
    encode_command,
    encode_frame,
)

log = structlog.get_logger("tc_server.connection")

# Requests in flight on one connection before we stop reading from it (back-pressure, not an
# error): 16 coordinator handlers x 1000 pipelined ops each (TransactionMetaStoreHandler's semaphore).
MAX_IN_FLIGHT = 16_384
# ERROR needs a request id; -1 is what the broker sends when there is none (authentication errors).
NO_REQUEST_ID = -1
NOT_SERVED = "not served by a transaction coordinator; set --upstream-url to forward it to a broker"
STOPPING = "this tc-server instance is stopping: retry at the coordinator's next leader"
NOT_FORWARDED = ("not served on tc-server's service URL, which forwards lookups only (FORWARDED_COMMANDS); "
                 "producers and consumers connect to the broker a LOOKUP names")
# Why a connection was closed at once (the label values of tc_server_connections_refused_total).
REFUSAL_REASONS = ("max_connections", "max_connections_per_address", "max_tls_handshakes", "max_buffered_input",
                   "answers_unread")
# Answers held for a client past this (its transport's buffer and our queue) when a forwarded answer comes: the
# client reads nothing while the brokers answer what it sent, up to ~5 MiB an answer (a namespace's topics),
# so a few hundred KB of pipelined requests held GiBs (a review: 2 GiB from 2,000 GET_TOPICS_OF_NAMESPACE).
# Pausing its reads bounds the requests, not the answers to those already forwarded: it is closed.
MAX_ANSWERS_HELD_BYTES = 32 * 1024 * 1024
# Past the input budget, a connection still holding more than this after serving what it can is
# growing a large unfinished frame (TC commands are far smaller): it is the one closed.
SMALL_INPUT_BYTES = 16 * 1024
# Answers queued in one turn past this are written before the next frame is read (_process_frames): the
# transport's high-water mark (64 KiB), so a client that reads nothing is paused within about one of it.
ANSWERS_QUEUED_BYTES = 64 * 1024
# WATCH_TC_ASSIGNMENTS watches one connection may hold (a client needs one; see ClientConnection._watch).
MAX_WATCHES_PER_CONNECTION = 16
# The largest frame read before the handshake is done (then --max-frame-size): a CONNECT and its credentials
# (a token of a few KB), or a PING. Every frame is parsed whole, and anyone who can reach the port could make
# the event loop parse 5 MB frames of junk, as often as it liked, without a credential (a review).
MAX_FRAME_BEFORE_CONNECT = 64 * 1024
# How long a closing connection may take to hand its last answers to the client before it is cut: one
# that reads nothing (hung, paused) never takes them, and a graceful close waits for that forever.
CLOSE_FLUSH_S = 5.0
# A relayed connection whose broker has read nothing for this many keep-alive intervals (--keepalive-s)
# is closed, both sides: as a peer that answers no PING is (a PING left unanswered one interval).
RELAY_STALL_KEEPALIVES = 2
# How long a client asked for fresh credentials (a broker refused its old ones) has to answer before the
# next refusal closes its connection instead (it then connects again with fresh ones).
UPSTREAM_REFRESH_WAIT_S = 10.0


@dataclass
class ServerContext:
    """What every connection of one server shares."""

    dispatcher: Dispatcher
    metrics: Metrics
    authenticator: Authenticator
    keepalive_s: float
    max_message_size: int
    max_frame_size: int
    # Server-wide bound on requests in flight: past it, the connection that crossed it stops reading
    # until the total is back under half (a stalled store must not pile up tasks without bound).
    max_in_flight: int = 4096
    # How often expiring credentials are checked (brokers' authenticationRefreshCheckSeconds).
    authentication_refresh_check_s: float = 60.0
    # The front door (server/upstream.py): None when no --upstream-url is set.
    upstream: Upstream | None = None
    # HOST:PORT this instance is reached at (CONNECT's proxy_to_broker_url naming one of them is for us:
    # the v5 SDK dials its coordinators that way).
    own_addresses: frozenset[str] = frozenset()
    # The TLS context of relays to peer tc-server instances for clients that came over TLS (None: no TLS
    # listener; auth/broker_client.py peer_tls_context).
    peer_ssl_context: ssl.SSLContext | None = None
    # The TLS listener's reloading context (None: no TLS): which client certificates still prove a role.
    tls: ServerTlsContext | None = None
    # Client connections at once, overall and per remote host (issue 15): past them, closed at once.
    max_connections: int = 4096
    max_connections_per_address: int = 1024
    # Input buffered by all connections together, and its cap (issue 15: 200 stalled 5 MB frames took 1 GB).
    max_buffered_input: int = 64 * 1024 * 1024
    buffered_input: int = 0
    in_flight: int = 0
    in_flight_share: int = field(init=False)  # per connection; see _share_connections
    paused: set[ClientConnection] = field(default_factory=set)
    # Every accepted connection (closed at the stop), and those served here: CONNECTED sent by this
    # instance. Only the latter share the bound: sockets that never send CONNECT and connections relayed to
    # a broker run none of our requests, yet counted, 400 idle sockets cut every client's share from 2,048
    # requests in flight to 10 (a review).
    connections: set[ClientConnection] = field(default_factory=set)
    served: set[ClientConnection] = field(default_factory=set)
    # Connections admitted, overall and per address (the limits above; made in __post_init__).
    admitted: AddressBudget = field(init=False)
    # Server-wide warnings (refused connections) are rate-limited: a flood must not flood the log.
    log_limiter: LogLimiter = field(default_factory=LogLimiter)

    def __post_init__(self) -> None:
        self.admitted = AddressBudget(self.max_connections, self.max_connections_per_address)
        for reason in REFUSAL_REASONS:
            self.metrics.connections_refused.labels(reason)
        # Read when scraped: a set() on every request start and end was a measurable part of the
        # per-request cost (profiled under load).
        self.metrics.in_flight.set_function(lambda: self.in_flight)
        self._share_connections()

    def joined(self, connection: ClientConnection) -> None:
        self.connections.add(connection)

    def serving(self, connection: ClientConnection) -> None:
        """``connection`` is served here from now on (its handshake done): it takes a share of the bound."""
        self.served.add(connection)
        self._share_connections()

    def left(self, connection: ClientConnection) -> None:
        self.connections.discard(connection)
        self.paused.discard(connection)
        if connection in self.served:
            self.served.discard(connection)
            self._share_connections()

    def _share_connections(self) -> None:
        # Requests each connection may have in flight: an equal share of the server-wide bound, so that
        # one flooding connection cannot take it all and starve the others (issue 15: a flooder made a
        # well-behaved client fail 5 of 81 requests), and never above MAX_IN_FLIGHT. Kept up to date as
        # connections come and go, not computed twice per request (~1.5 % of the event loop, profiled). A
        # lone connection gets half, not all: the other half is there for whoever connects next (a review: one
        # connection's 4,096 END_TXNs, each waiting --participant-wait-s for an unreachable participant, held
        # the whole bound, and a client that connected then was served nothing for as long).
        self.in_flight_share = max(1, min(MAX_IN_FLIGHT, self.max_in_flight // max(2, len(self.served))))

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address`` in, or say which limit refuses it."""
        if self.admitted.admit(address):
            return None
        return "max_connections" if self.admitted.count >= self.max_connections else "max_connections_per_address"

    def refused_at_accept(self, reason: str, peer: str) -> None:
        """A connection closed at once for a limit (REFUSAL_REASONS): counted, logged once per interval (the
        client retries, as it does when a broker's maxConnectionsPerIp closes it)."""
        self.metrics.connections_refused.labels(reason).inc()
        if (left_out := self.log_limiter.allow("connection refused")) is not None:
            log.warning("connection refused", peer=peer, reason=reason, max_connections=self.max_connections,
                        max_connections_per_address=self.max_connections_per_address,
                        refused_since_last_line=left_out)

    def release(self, address: str) -> None:
        self.admitted.release(address)


def close_flushing(transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
    """Close ``transport`` once what it holds is written, or cut it after CLOSE_FLUSH_S (a peer that
    stopped reading never takes it). One that is closing already is left as it is: asyncio's SSL
    transport closed a second time drops its protocol, and asking its write buffer then raised
    AttributeError (a stop's drain reaching a TLS connection its peer had just closed)."""
    if transport.is_closing():
        return
    transport.close()
    if transport.get_write_buffer_size():  # else it is closed already
        loop.call_later(CLOSE_FLUSH_S, transport.abort)


class ClientConnection(asyncio.Protocol):
    def __init__(self, context: ServerContext) -> None:
        self._ctx = context
        # The server's loop creates its protocols. Kept, because asyncio.get_running_loop() makes a
        # getpid() system call on every call in CPython 3.11 (its fork check): ~5 % of the server's busy
        # samples when called per request and per answer (py-spy, issue 13).
        self._loop = asyncio.get_running_loop()
        self._decoder = FrameDecoder(min(MAX_FRAME_BEFORE_CONNECT, context.max_frame_size))
        self._transport: asyncio.Transport | None = None
        self._log: Any = log
        self._address = ""  # the remote host, counted against --max-connections-per-address
        self._admitted = False
        self._counted_input = 0  # this connection's part of the context's buffered_input
        # What a client may repeat at will (unknown commands, repeated handshakes) is logged once per
        # interval per connection, not once per frame (issue 15: 19x the input in log lines).
        self._log_limiter = LogLimiter()
        self._connected = False
        self._protocol_version = 0  # as CONNECTED negotiated it
        self._closing = False
        self._eof = False  # the client shut down its sending side (see eof_received)
        self._draining = False  # the server stops: what arrives now is refused, not started (drain)
        # Who txn requests act as: the txn owner and whether they may act on any txn (handshake.py).
        self._principal: str | None = None
        self._superuser = False
        self._proxied = False  # a Pulsar proxy's connection (--proxy-roles)
        # The role of a client that authenticated with a TLS certificate, whose requests go to brokers as a
        # Pulsar proxy's (--upstream-proxy-auth-plugin: upstream.py's Upstream.proxies_for); else None.
        self._proxy_for: str | None = None
        # The proven credentials (None: authentication off) and the timer that checks their expiry.
        self._auth: AuthSession | None = None
        self._auth_check: asyncio.TimerHandle | None = None
        self._waiting_pong = False
        self._eof_unread_at_tick = False  # half-closed, its answers unread at the last keep-alive tick
        self._frames_read = 0
        # A v0 client's frame unfinished at the last keep-alive tick with no frame read since the one before.
        self._partial_frame_at_tick = False
        self._frames_at_tick = 0  # _frames_read at the last keep-alive tick
        self._keepalive: asyncio.TimerHandle | None = None
        # When a refresh challenge was sent because a broker refused the client's credentials (loop time;
        # None: none unanswered).
        self._upstream_challenge_at: float | None = None
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._flow = ReadFlowControl()  # why this connection is not being read (flow_control.py)
        # Responses written in one loop iteration go out in one write: a syscall per response was
        # a quarter of the server's time under load (profiled), and batching adds no latency.
        self._out = OutgoingFrames(self._loop)
        # WATCH_TC_ASSIGNMENTS watch ids of this connection, and how to stop listening for changes.
        self._watches: set[int] = set()
        self._unwatch: Callable[[], None] | None = None
        # The client's CONNECT (its credentials go upstream with what is forwarded for it).
        self._connect: Connect | None = None
        self._forwarding: ForwardingSession | None = None
        # Set once this connection is carried to a broker byte for byte (relay.py).
        self._relay: BrokerSide | None = None
        # While the broker of a relayed connection reads nothing, or its client (RELAY_STALL_KEEPALIVES, below).
        self._relay_stall: asyncio.TimerHandle | None = None
        self._relay_client_stall: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass, but has its interface.
        self._transport = cast(asyncio.Transport, transport)
        self._out.transport = self._transport
        self._flow.attach(self._transport)
        peer = transport.get_extra_info("peername")
        self._log = log.bind(peer=f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer))
        self._address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        refusal = self._ctx.admit(self._address)
        if refusal is not None:
            self._refuse_connection(refusal)
            return
        self._admitted = True
        self._ctx.joined(self)
        self._ctx.metrics.connections.inc()
        self._schedule_keepalive()
        self._log.debug("connection opened")

    def _refuse_connection(self, reason: str) -> None:
        """Past a connection limit: close at once (no CONNECT is read)."""
        self._closing = True
        assert self._transport is not None
        peer = self._transport.get_extra_info("peername")
        self._ctx.refused_at_accept(reason, f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer))
        self._transport.abort()  # nothing to flush: give the descriptor back now

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return  # refused in connection_made: nothing was set up
        self._ctx.release(self._address)
        self._closing = True
        self._count_input()
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._auth_check is not None:
            self._auth_check.cancel()
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        self._ctx.left(self)
        self._ctx.metrics.connections.dec()
        if self._forwarding is not None:
            self._forwarding.close()
        for stall in (self._relay_stall, self._relay_client_stall):
            if stall is not None:
                stall.cancel()
        if self._relay is not None and self._relay.transport is not None:
            # Bounded as close() is: a broker that stopped reading never drains what waits for it, and
            # the socket stayed open for good, tracked by nothing.
            close_flushing(self._relay.transport, self._loop)
        self._log.info("connection closed", error=repr(exc) if exc else None, in_flight=self._in_flight)

    def eof_received(self) -> bool | None:
        """The client shut down its sending side. What it sent before is still served and answered, and
        the connection closes once nothing of it is left (asyncio's default closed it at once, and the
        answers of the requests in flight were lost while their work went on: a NEW_TXN's txn was left
        to time out, a commit's outcome never reached the client). A relayed connection closes as before
        (the broker sees the client go), and so does a TLS one: TLS cannot half-close, and asyncio's SSL
        layer logs a warning for every connection whose protocol asks it to."""
        if self._relay is not None or (self._transport is not None
                                       and self._transport.get_extra_info("sslcontext") is not None):
            return None
        self._eof = True
        self._close_if_done()
        return True

    def _close_if_done(self) -> None:
        """After the client's EOF: close once no request of it is in flight and no frame of it waits."""
        if self._eof and self._in_flight == 0 and not self._flow.paused and not self._closing:
            self.close()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._relay is not None and self._relay.transport is not None:
            self._relay.transport.write(data)
            return
        self._decoder.feed(data)
        self._process_frames()
        ctx = self._ctx
        if (ctx.buffered_input > ctx.max_buffered_input and not self._flow.paused
                and self._decoder.buffered > SMALL_INPUT_BYTES and not self._closing):
            ctx.metrics.connections_refused.labels("max_buffered_input").inc()
            if (left_out := ctx.log_limiter.allow("input budget")) is not None:
                self._log.warning("closing: buffered input over the server's budget", buffered=self._decoder.buffered,
                                  budget=ctx.max_buffered_input, closed_since_last_line=left_out)
            self.close()
            self._count_input()

    def _count_input(self) -> None:
        """Keep the context's buffered_input up to date with this connection's decoder."""
        now = 0 if self._closing else self._decoder.buffered
        self._ctx.buffered_input += now - self._counted_input
        self._counted_input = now

    def _process_frames(self) -> None:
        if self._draining:
            self._refuse_unstarted()
            return
        # Stop at once when paused: pause_reading() only stops the socket, while the frames of
        # this read are already in the decoder. They wait there until reading resumes.
        try:
            while not self._closing and not self._flow.paused:
                # A connection still in its handshake is read whatever the bound: a CONNECT takes no slot, and
                # paused it went unanswered until its keep-alive closed it for sending no CONNECT (a review:
                # 4,200 END_TXNs waiting for their participants on one connection kept every new client out).
                if self._ctx.in_flight >= self._ctx.max_in_flight and self._connected:
                    self._pause_reading("server-busy")
                    self._ctx.paused.add(self)
                    return
                if self._out.queued_bytes > ANSWERS_QUEUED_BYTES:
                    # Written now rather than at the turn's end: a write buffer over its high-water mark
                    # pauses reading (pause_writing) before the next frame. Without it, one read's small
                    # requests were all answered first, however much larger their answers (a repeated
                    # WATCH_TC_ASSIGNMENTS: the whole map, ~33 times the request), by a client that reads
                    # nothing: the input budget bounded what it sent, nothing what the server then held.
                    self._out.flush()
                    continue
                frame = self._decoder.next_frame()
                if frame is None:
                    self._close_if_done()
                    return
                self._frames_read += 1
                self._on_frame(frame)
        except FrameError as exc:
            # The limit before the handshake is not --max-frame-size: said, lest an operator look for it there.
            why = str(exc) if self._connected else f"{exc} (before CONNECT is served)"
            self._warn_any_client_can("bad frame; closing", error=why)
            # Said before the close (request id -1: no request of the frame could be read), so that the client's
            # log names why: a frame over --max-frame-size was a bare disconnect (a review).
            self.send(Error(NO_REQUEST_ID, ServerError.UnknownError, f"bad frame: {why}"))
            self.close()
        finally:
            self._count_input()

    def pause_writing(self) -> None:
        # The client is not reading its answers: stop reading its requests (or, when carried to a
        # broker, the broker's bytes) until it does.
        if self._relay is not None and self._relay.transport is not None:
            self._relay.transport.pause_reading()
            # The broker's side is no longer read, so its close (its keep-alive's, which the client's silence
            # fails) went unnoticed, and the client's connection stayed open for good, its slot and buffers held
            # (a review). A client that reads nothing for this long is given up, as the broker gives it up.
            if self._relay_client_stall is None:
                self._relay_client_stall = self._loop.call_later(
                    RELAY_STALL_KEEPALIVES * self._ctx.keepalive_s, self._relay_stalled, "client")
        self._pause_reading("write-buffer")

    def resume_writing(self) -> None:
        if self._relay_client_stall is not None:
            self._relay_client_stall.cancel()
            self._relay_client_stall = None
        if self._relay is not None and self._relay.transport is not None:
            self._relay.transport.resume_reading()
        self._resume_reading("write-buffer")

    # -- commands ------------------------------------------------------------------------------

    def _on_frame(self, frame: bytes) -> None:
        try:
            cmd = decode_command(frame)
        except MalformedCommand as exc:
            self._warn_any_client_can("malformed command; closing", reason=exc.reason, request_id=exc.request_id)
            self.send(Error(NO_REQUEST_ID if exc.request_id is None else exc.request_id, ServerError.UnknownError,
                            f"malformed command: {exc.reason}"))
            self.close()
            return
        # Any inbound command proves the peer alive (PulsarHandler clears its waiting flag the same way).
        self._waiting_pong = False
        if not self._connected:
            if isinstance(cmd, Ping):  # answered in any state, as a broker does (PulsarHandler.handlePing)
                self.send(Pong())
                return
            if isinstance(cmd, Connect):
                try:
                    self._on_connect(cmd)
                except Exception as exc:  # noqa: BLE001 - as below: an answer, never an escape
                    self._answer_failure(cmd, exc)
                    self.close()  # the handshake did not happen
            else:
                request_id = getattr(cmd, "request_id", None)
                self._warn_any_client_can("command before CONNECT; closing", command=command_name(cmd))
                if request_id is not None:
                    self.send(Error(request_id, ServerError.NotAllowedError, "send CONNECT first"))
                self.close()
            return
        route = self._ROUTES.get(type(cmd))
        try:
            if route is None:
                self._forward_or_refuse(cmd, frame)
            else:
                route(self, cmd, frame)
        except Exception as exc:  # noqa: BLE001 - a handler's bug answers this command, not the loop
            self._answer_failure(cmd, exc)

    def _answer_failure(self, cmd: Command, exc: BaseException) -> None:
        """The last resort for an exception a handler did not turn into an answer: a typed answer
        (UnknownError: it is our bug, not the client's input), one log line, the connection stays up.
        Left to escape, asyncio would log it and drop the connection (issue 15)."""
        name = command_name(cmd)
        if (left_out := self._log_limiter.allow("command handler failed")) is not None:
            self._log.error("command handler failed", command=name, exc_info=exc, left_out_since_last_line=left_out)
        self._ctx.metrics.request_errors.labels(name, ServerError.UnknownError.name).inc()
        message = f"internal error serving {name}: {type(exc).__name__}"
        request_id = getattr(cmd, "request_id", None)
        try:
            if isinstance(cmd, NewTxn | EndTxn | AddPartitionToTxn | AddSubscriptionToTxn):
                self.send(self._ctx.dispatcher.error_response(cmd, ServerError.UnknownError, message))
            else:
                self.send(Error(NO_REQUEST_ID if request_id is None else request_id, ServerError.UnknownError,
                                message))
        except Exception:  # noqa: BLE001 - not even an answer can be encoded: give up on this connection
            self._log.error("cannot answer; closing", command=name, exc_info=True)
            self.close()

    # Each handler takes the decoded command and its BaseCommand bytes; what has no route here is
    # forwarded to the upstream broker (or refused without one): see _forward_or_refuse.
    def _on_txn_request(self, cmd: Any, frame: bytes) -> None:
        self._start(self._ctx.dispatcher.transaction(cmd, self._principal, self._superuser, self._log), cmd)

    def _on_ping(self, cmd: Any, frame: bytes) -> None:
        self.send(Pong())

    def _on_pong(self, cmd: Any, frame: bytes) -> None:
        pass

    def _on_tc_client_connect(self, cmd: Any, frame: bytes) -> None:
        self.send(self._ctx.dispatcher.tc_client_connect(cmd))

    def _on_lookup(self, cmd: Any, frame: bytes) -> None:
        if discovery.assign_partition(cmd.topic) is not None:
            self.send(self._ctx.dispatcher.lookup(cmd))
        else:
            self._forward_or_refuse(cmd, frame)

    def _on_partitioned_metadata(self, cmd: Any, frame: bytes) -> None:
        if discovery.assign_partition(cmd.topic) is not None:
            self.send(self._ctx.dispatcher.partitioned_metadata(cmd))
        else:
            self._forward_or_refuse(cmd, frame)

    def _on_watch(self, cmd: Any, frame: bytes) -> None:
        self._watch(cmd.watch_id)

    def _on_watch_close(self, cmd: Any, frame: bytes) -> None:
        self._watches.discard(cmd.watch_id)

    def _on_repeated_handshake(self, cmd: Any, frame: bytes) -> None:
        # A broker takes CONNECT once (ServerCnx.handleConnect checks its state, and the failure closes the
        # connection): ignored, the sender waited for an answer that never came.
        self._log_repeated("CONNECT on a connection already connected; closing", command=command_name(cmd))
        self.send(Error(NO_REQUEST_ID, ServerError.NotAllowedError,
                        "CONNECT on a connection already connected: open a new connection"))
        self.close()

    def _warn_any_client_can(self, event: str, **fields: Any) -> None:
        """A warning that anyone who reaches the port can provoke, on as many connections as they like (a
        bad frame, a forged token): at most one per interval for the whole server (the context's limiter, as
        refused connections), the next saying how many were left out; the metrics count every one. One line
        per connection made the log 26 times what a client sent."""
        # Keyed apart from the context's own lines of the same name (a connection refused at accept for a
        # limit): each says the count of its own kind.
        if (left_out := self._ctx.log_limiter.allow(f"client: {event}")) is not None:
            self._log.warning(event, **fields, left_out_since_last_line=left_out)

    def _log_repeated(self, event: str, **fields: Any) -> None:
        """An info line a client can provoke at will: at most one per interval on this connection; the
        next one says how many were left out (the metrics still count every one)."""
        left_out = self._log_limiter.allow(event)
        if left_out is not None:
            self._log.info(event, **fields, left_out_since_last_line=left_out)

    def _forward_or_refuse(self, cmd: Command, frame: bytes) -> None:
        """Hand a lookup-like request that is not the coordinator's to the upstream broker, or refuse it:
        without an upstream (the answer names the setting), or a command that is no such request. Only
        those are forwarded: the frame decoder keeps no payload (a SEND would reach the broker without
        its message), and a command whose request id the codec cannot read (PRODUCER, SUBSCRIBE, …)
        could never be answered, nor the broker's pushes for it bounded."""
        upstream = self._ctx.upstream
        name = command_name(cmd)
        request_id = getattr(cmd, "request_id", None)
        forwardable = name in FORWARDED_COMMANDS and request_id is not None
        if upstream is not None and self._connect is not None and forwardable:
            if self._forwarding is None:
                self._forwarding = ForwardingSession(upstream, self._connect, self._send_bytes,
                                                     self._upstream_credentials_expired, proxied=self._proxied,
                                                     proxy_for=self._proxy_for, client_tls=self._over_tls(),
                                                     max_frame_size=self._ctx.max_message_size
                                                     + MESSAGE_SIZE_FRAME_PADDING)
            self._start(self._forwarding.forward(cmd, encode_frame(frame)))
            return
        self._log_repeated("command not served", command=name, request_id=request_id)
        self._ctx.metrics.request_errors.labels("OTHER", ServerError.NotAllowedError.name).inc()
        topic = getattr(cmd, "topic", None)
        if isinstance(cmd, PartitionedMetadata | Lookup):
            self.send(self._ctx.dispatcher.not_served(cmd))
        else:
            subject = f"{name} of {topic}" if topic else name
            why = NOT_SERVED if upstream is None else NOT_FORWARDED
            self.send(Error(NO_REQUEST_ID if request_id is None else request_id,
                            ServerError.NotAllowedError, f"{subject}: {why}"))

    def _on_connect(self, connect: Connect) -> None:
        try:
            result = negotiate(connect, self._ctx.authenticator, self._ctx.max_message_size,
                               self._peer_certificate())
        except AuthenticationFailed as exc:
            self._refuse_authentication("authentication failed", connect.auth_method_name, exc)
            return
        except InvalidRoles as exc:
            self._refuse("connection refused", ServerError.AuthorizationError, exc)
            return
        self._connect = connect
        self._proxied = result.proxied  # also what a relayed CONNECT keeps of it (connect_for_broker)
        upstream, session = self._ctx.upstream, result.session
        if upstream is not None and session is not None and result.principal \
                and upstream.proxies_for(session.credentials.method):
            # A certificate client, or a Pulsar proxy (--proxy-roles) with a certificate: for the client it
            # names (result.principal), as that proxy would connect to the brokers itself.
            self._proxy_for = result.principal
        target = connect.proxy_to_broker_url
        if target and host_port(target) not in self._ctx.own_addresses:
            self._carry_to(target, connect)
            return
        self._connected = True
        self._decoder.max_frame_size = self._ctx.max_frame_size
        self._ctx.serving(self)
        self._principal = result.principal
        self._superuser = result.superuser
        if result.proxied:
            self._log = self._log.bind(acting_as=(result.principal or "")[:128])  # the client behind the proxy
        if connect.original_principal and result.session is not None and not result.proxied:
            # Ignored (handshake.py). Most likely a Pulsar proxy whose role is not in --proxy-roles: its
            # clients would all act as the proxy, and the brokers refuse the lookups forwarded for them.
            self._log.warning("original_principal ignored: the role is not in --proxy-roles",
                              role=result.session.role, original_principal=connect.original_principal[:64])
        self._start_auth_refresh(result.session)
        # Cut, as every field a client chooses: bound to the logger, a frame's worth of it was repeated in
        # every later line of the connection.
        self._log = self._log.bind(client=connect.client_version[:64], protocol=result.protocol_version)
        self._protocol_version = result.protocol_version
        if result.protocol_version < MIN_TC_CLIENT_CONNECT_VERSION:
            # Such a client skips TC_CLIENT_CONNECT and sends txn requests straight away; we
            # serve them all the same.
            self._log.info("old protocol version: client will not send TC_CLIENT_CONNECT")
        self.send(result.connected)
        self._log.info("client connected")

    def _watch(self, watch_id: int) -> None:
        """WATCH_TC_ASSIGNMENTS: the full map now, and again whenever it changes. A client needs one
        watch; past MAX_WATCHES_PER_CONNECTION the request is refused (each watch is kept and answered
        again on every change: a client sending a million ids held 200 MB, and a change would have
        answered each of them in one turn of the event loop)."""
        if watch_id not in self._watches and len(self._watches) >= MAX_WATCHES_PER_CONNECTION:
            self.send(WatchTcAssignmentsUpdate(
                watch_id, error=ServerError.NotAllowedError,
                message=f"at most {MAX_WATCHES_PER_CONNECTION} assignment watches per connection; close one "
                        f"(WATCH_TC_ASSIGNMENTS_CLOSE) first"))
            return
        self._watches.add(watch_id)
        if self._unwatch is None:
            self._unwatch = self._ctx.dispatcher.coordinator.watch_assignments(self._assignments_changed)
        self.send(WatchTcAssignmentsUpdate(watch_id, self._ctx.dispatcher.assignments_snapshot()))

    def _assignments_changed(self, leaders: dict[int, str]) -> None:
        snapshot = self._ctx.dispatcher.assignments_snapshot(leaders)
        for watch_id in sorted(self._watches):
            self.send(WatchTcAssignmentsUpdate(watch_id, snapshot))

    def _start(self, work: Coroutine[Any, Any, Any], request: TxnRequest | None = None) -> None:
        """Run one request as a task, counted against this connection's and the server's bounds.
        ``request``: the txn request whose answer ``work`` returns (sent when the task is done);
        None for work that answers on its own (forwarding)."""
        ctx = self._ctx
        self._in_flight += 1
        ctx.in_flight += 1
        if self._in_flight >= ctx.in_flight_share:
            self._pause_reading("in-flight")
        # The work is the task's coroutine and the bookkeeping is its done callback: a wrapper
        # coroutine per request was resumed on every step of it (profiled, issue 13).
        task = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._finished, request))

    def _finished(self, request: TxnRequest | None, task: asyncio.Task[Any]) -> None:
        """A request's task is done: leave the bounds, then answer a txn request (exactly once)."""
        self._tasks.discard(task)
        ctx = self._ctx
        self._in_flight -= 1
        ctx.in_flight -= 1
        if self._in_flight < max(1, ctx.in_flight_share // 2) and self._flow.paused_for("in-flight"):
            self._resume_reading("in-flight")
        if ctx.paused and ctx.in_flight < max(1, ctx.max_in_flight // 2):
            for connection in list(ctx.paused):
                connection._resume_reading("server-busy")
            ctx.paused.clear()
        if self._eof:
            self._loop.call_soon(self._close_if_done)  # once this request's answer below is queued
        if task.cancelled():
            # Only its deadline cancels a request's task, and the dispatcher answers that. Any other
            # cancellation (an awaited task or future cancelled under the request) would leave the
            # client waiting for its operation timeout: answer once, unless the connection is gone.
            if request is not None and not self._closing:
                self._answer_failure(request, asyncio.CancelledError())
            return
        error = task.exception()
        if request is None:
            if error is not None:  # forward() never raises; if it did, say so rather than lose it
                self._log.error("forwarding failed", exc_info=error)
            return
        if isinstance(error, Exception):  # Dispatcher.transaction never raises; a bug still gets an answer
            self._answer_failure(request, error)
            return
        try:
            self.send(task.result())
        except Exception as exc:  # noqa: BLE001 - e.g. an id the wire cannot carry: answer, never escape
            self._answer_failure(request, exc)

    # -- carrying a proxied connection to its broker (relay.py) ------------------------------------

    def _carry_to(self, target: str, connect: Connect) -> None:
        """CONNECT with ``proxy_to_broker_url`` naming a broker (or a peer tc-server): connect there,
        hand it the client's CONNECT, then relay bytes both ways."""
        upstream = self._ctx.upstream
        # A peer tc-server (the v5 SDK dials a coordinator led elsewhere through this connection), or
        # a broker a forwarded lookup named; nothing else: tc-server is no open relay.
        peers = self._peers()
        peer = host_port(target) in peers
        url = peers.get(host_port(target)) if peer else (
            upstream.proxy_target(target) if upstream is not None else None)
        if url is None:
            # For good: NotAllowedError, which clients do not retry.
            if peer:
                error, why = ServerError.NotAllowedError, ("the client speaks TLS and that tc-server instance "
                                                           "advertises no pulsar+ssl:// URL (the client's "
                                                           "credentials would go in the clear)")
            elif upstream is None:
                error, why = ServerError.NotAllowedError, "no --upstream-url is set"
            elif upstream.named_without_tls(target):
                error, why = ServerError.NotAllowedError, ("the upstream speaks TLS and named this broker without "
                                                           "a pulsar+ssl:// URL (the client's credentials would go "
                                                           "in the clear)")
            else:
                # Maybe not yet: each tc-server process learns brokers from the lookups it answers, and a
                # client's lookup may have gone through another instance behind the same address
                # (replicas, --workers). ServiceNotReady before CONNECTED is a failed connection, which
                # clients open again, through whichever instance.
                error = ServerError.ServiceNotReady
                why = "no lookup answered by this tc-server instance has named it yet; retry"
            self._log.warning("refusing to proxy", target=target[:256], reason=why)
            self.send(Error(NO_REQUEST_ID, error, f"cannot proxy to {target}: {why}"))
            self.close()
            return
        # Frames the client sent after CONNECT wait in the decoder until the broker is connected.
        self._pause_reading("relay-setup")
        # The setup has its own bound (open_relay's timeout, the upstream's request timeout). The
        # keep-alive, still waiting for a handshake of this connection's own, closed a client whose
        # relay took longer to set up than the rest of its first interval ("no CONNECT").
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._log = self._log.bind(proxy_to=target[:256])
        broker_connect = connect_for_broker(connect, self._proxied)
        if peer:  # a plain client goes to the peer's plain URL (_peers), a TLS one to its TLS URL
            ssl_context = self._ctx.peer_ssl_context if url.startswith("pulsar+ssl://") else None
        else:
            assert upstream is not None  # proxy_target named the URL
            # A plain upstream names its brokers' TLS URLs too, and a TLS client is carried to the one it
            # named: trusting the brokers' CA (--broker-client-tls-trust-certs), not the system's alone.
            ssl_context = upstream.ssl_context_for(self._proxy_for is not None, url, self._ctx.peer_ssl_context)
            # A TLS-certificate client goes to a broker as a Pulsar proxy's client (upstream.py). Never to a peer
            # tc-server: that takes the proxy credentials as the proxy role's own unless its --proxy-roles lists
            # it, and every certificate client relayed there acted as that one role (a review's).
            try:
                if self._proxy_for is not None:
                    broker_connect = upstream.proxy_connect(connect, self._proxy_for)
            except ConnectionFailed as exc:  # the proxy credentials cannot be read (a token file gone)
                self._log.warning("cannot proxy to the broker", error=str(exc))
                self.send(Error(NO_REQUEST_ID, ServerError.ServiceNotReady, f"cannot proxy to {target}: {exc}"))
                self.close()
                return
        self._tasks.add(task := self._loop.create_task(self._open_relay(url, broker_connect, ssl_context)))
        task.add_done_callback(self._tasks.discard)

    def _over_tls(self) -> bool:
        """Whether the client speaks TLS to tc-server (came to the pulsar+ssl:// listener)."""
        return self._transport is not None and self._transport.get_extra_info("ssl_object") is not None

    def _peers(self) -> dict[str, str | None]:
        """HOST:PORT of each peer tc-server instance (its plain and its TLS address) -> the URL to relay to.
        A client that came over TLS is relayed over TLS or not at all (None: the peer has no TLS URL):
        its credentials crossed a plain connection to the peer when it named the peer's plain address."""
        coordinator = self._ctx.dispatcher.coordinator
        over_tls = self._over_tls()
        peers: dict[str, str | None] = {}
        for url in coordinator.assignments().values():
            tls = coordinator.tls_url(url)
            peers[host_port(url)] = tls if over_tls else url
            if tls:
                peers[host_port(tls)] = tls
        return peers

    async def _open_relay(self, target: str, broker_connect: Connect, ssl_context: ssl.SSLContext | None) -> None:
        """Connect to ``target``, hand it ``broker_connect`` (the client's CONNECT as that side should see it),
        then relay bytes both ways."""
        upstream = self._ctx.upstream
        timeout_s = upstream.request_timeout_s if upstream is not None else 10.0
        try:
            broker = await open_relay(target, self, ssl_context=ssl_context, timeout_s=timeout_s)
        except (OSError, TimeoutError, ValueError) as exc:
            self._log.warning("cannot reach the broker to proxy to", error=repr(exc))
            # Before CONNECTED the client takes an ERROR as a failed connection and retries later.
            self.send(Error(NO_REQUEST_ID, ServerError.ServiceNotReady,
                            f"tc-server cannot reach broker {target}: {exc!r}"))
            self.close()
            return
        if self._closing:
            if broker.transport is not None:
                broker.transport.close()
            return
        assert broker.transport is not None
        self._relay = broker  # PING/PONG now run end to end between client and broker
        self._ctx.metrics.proxied_connections.inc()
        # A proxy's CONNECT (a TLS-certificate client's): a broker's refresh challenge of the proxy credentials
        # reaches the client, whose answer it refuses, so the proxy token should not expire (docs/security.md).
        broker.transport.write(encode_command(broker_connect) + self._decoder.take_buffered())
        self._count_input()
        self._log.info("proxying to broker")
        self._resume_reading("relay-setup")

    def relay_to_client(self, data: bytes) -> None:
        if self._transport is not None and not self._closing:
            # Nothing of ours is queued once the relay runs; should that ever change, it goes first
            # rather than after broker bytes it would cut in the middle of a frame.
            self._out.flush()
            self._transport.write(data)

    def relay_closed(self, exc: Exception | None) -> None:
        if self._relay is not None:  # counted once relayed (not a broker side closed unused)
            self._ctx.metrics.proxied_connections.dec()
        self.close()

    def pause_client_reading(self) -> None:
        self._pause_reading("relay-write-buffer")
        # Both directions can now stand still for good: the client is not read, and the keep-alive runs
        # end to end (not here). A client that left was never noticed, and the connection and its
        # broker's stayed open for good. A broker that reads nothing for this long is given up.
        if self._relay_stall is None:
            self._relay_stall = self._loop.call_later(RELAY_STALL_KEEPALIVES * self._ctx.keepalive_s,
                                                      self._relay_stalled, "broker")

    def resume_client_reading(self) -> None:
        if self._relay_stall is not None:
            self._relay_stall.cancel()
            self._relay_stall = None
        self._resume_reading("relay-write-buffer")

    def _relay_stalled(self, side: str) -> None:
        """The ``side`` ("broker" or "client") of a relayed connection read nothing for RELAY_STALL_KEEPALIVES."""
        if side == "broker":
            self._relay_stall = None
        else:
            self._relay_client_stall = None
        if self._closing:
            return
        self._log.warning(f"the {side} of a relayed connection read nothing; closing it",
                          waited_s=RELAY_STALL_KEEPALIVES * self._ctx.keepalive_s)
        if self._relay is not None and self._relay.transport is not None:
            self._relay.transport.abort()
        self.close()

    # -- authentication: refusal and refresh (handshake.py says how brokers do it) --------------

    def _peer_certificate(self) -> bytes | None:
        """The client's TLS certificate (DER), present only if the TLS layer verified it (against the trust
        file of the last reload: ServerTlsContext.verified_peer_certificate)."""
        ssl_object = self._transport.get_extra_info("ssl_object") if self._transport is not None else None
        if ssl_object is None or self._ctx.tls is None:
            return None
        return self._ctx.tls.verified_peer_certificate(ssl_object)

    def _refuse_authentication(self, event: str, method: str | None, exc: AuthenticationFailed) -> None:
        # The message names the problem, never the credentials (tc_server/auth/api.py).
        self._refuse(event, ServerError.AuthenticationError, exc, method=(method or "")[:64])

    def _refuse(self, event: str, error: ServerError, exc: Exception, **fields: Any) -> None:
        """End the handshake: log ``event``, count it, answer ERROR ``error`` with ``exc``'s message, close."""
        self._warn_any_client_can(event, error=str(exc), **fields)
        self._ctx.metrics.request_errors.labels("CONNECT", error.name).inc()
        self.send(Error(NO_REQUEST_ID, error, str(exc)))
        self.close()

    def _start_auth_refresh(self, session: AuthSession | None) -> None:
        self._auth = session
        if session is None:
            return
        self._log = self._log.bind(role=session.role, method=session.credentials.method)
        if session.expires:
            self._schedule_auth_check()

    def _schedule_auth_check(self) -> None:
        self._auth_check = self._loop.call_later(
            self._ctx.authentication_refresh_check_s, self._on_auth_check)

    def _on_auth_check(self) -> None:
        session = self._auth
        if session is None or self._closing:
            return
        action, why = session.check(wall_clock_ms())
        if action is RefreshAction.CLOSE:
            # As ServerCnx: the connection is closed without an ERROR.
            self._log.warning("closing: " + why)
            self.close()
            return
        if action is RefreshAction.CHALLENGE:
            self._log.info(why)
            self.send(session.challenge())
        self._schedule_auth_check()

    def _upstream_credentials_expired(self) -> None:
        """A broker refused the client's credentials, which it had taken before: ask the client for fresh
        ones (AUTH_CHALLENGE, as a broker does), or close the connection of a client that cannot refresh
        them, which then connects again with fresh ones. Without this, with tc-server's authentication
        off nothing ever asked: every forwarded request failed for the rest of the connection."""
        if self._closing:
            return
        asked_at = self._upstream_challenge_at
        if asked_at is not None and self._loop.time() - asked_at < UPSTREAM_REFRESH_WAIT_S:
            return  # asked already (several forwards find out at once): the answer is on its way
        connect = self._connect
        flags = connect.feature_flags if connect is not None else None
        if connect is None or not (flags and flags.supports_auth_refresh) or asked_at is not None:
            self._log.warning("closing: a broker refused the client's credentials, which it had taken before, and "
                              "the client cannot refresh them on this connection (or did not answer when asked)")
            self._loop.call_soon(self.close)  # after the answer of the request that found out
            return
        self._upstream_challenge_at = self._loop.time()
        self._log.info("a broker refused the client's credentials, which it had taken before; asking for fresh ones")
        self.send(refresh_challenge(connect.auth_method_name, connect.protocol_version))

    def _on_auth_response(self, cmd: Any, frame: bytes) -> None:
        """AUTH_RESPONSE to a refresh challenge: fresh credentials of the same role, or the end."""
        session = self._auth
        if session is None:
            if self._upstream_challenge_at is not None and self._forwarding is not None and self._connect is not None:
                # Authentication is off here: the brokers judge them.
                self._upstream_challenge_at = None
                self._connect = replace(self._connect, auth_data=cmd.response_data)
                self._forwarding.refresh_credentials(cmd.response_data)
                self._log.info("fresh credentials for forwarded requests")
                return
            self._log_repeated("ignoring AUTH_RESPONSE: authentication is off")
            return
        self._upstream_challenge_at = None
        try:
            session.refresh(self._ctx.authenticator, cmd.response_data, self._peer_certificate())
        except AuthenticationFailed as exc:
            self._refuse_authentication("authentication refresh failed", session.credentials.method, exc)
            return
        self._log.info("authentication refreshed", expires_at_ms=session.credentials.expires_at_ms)
        if session.expires and self._auth_check is None:  # the first credentials had no expiry: checked now
            self._schedule_auth_check()
        # Forwarded requests carry the client's own credentials: the fresh ones from now on.
        if self._connect is not None:
            self._connect = replace(self._connect, auth_data=cmd.response_data)
        if self._forwarding is not None:
            self._forwarding.refresh_credentials(cmd.response_data)

    # -- output and lifecycle ------------------------------------------------------------------

    def send(self, cmd: Command) -> None:
        if self._transport is None or self._closing:
            return
        self._out.add(encode_command(cmd))

    def _send_bytes(self, data: bytes) -> None:
        """Queue an already encoded frame (a forwarded answer), in order with everything else we send; close
        a client that leaves more than MAX_ANSWERS_HELD_BYTES unread."""
        if self._transport is None or self._closing:
            return
        held = self._transport.get_write_buffer_size() + self._out.queued_bytes
        if held + len(data) > MAX_ANSWERS_HELD_BYTES:
            self._ctx.metrics.connections_refused.labels("answers_unread").inc()
            if (left_out := self._ctx.log_limiter.allow("answers unread")) is not None:
                self._log.warning("closing: the client leaves its answers unread", held_bytes=held,
                                  limit_bytes=MAX_ANSWERS_HELD_BYTES, closed_since_last_line=left_out)
            # Cut, not flushed: it reads nothing, and a flushing close held all of it CLOSE_FLUSH_S more.
            self._closing = True
            self._transport.abort()
            return
        self._out.add(data)

    def close(self) -> None:
        """Close after what was written is flushed, or cut it after CLOSE_FLUSH_S (connection_lost follows
        either way: the slot, the buffers and the upstream sessions are released)."""
        if not self._closing and self._transport is not None:
            self._out.flush()
            self._closing = True
            close_flushing(self._transport, self._loop)

    async def drain(self, timeout_s: float) -> None:
        """Start nothing more: answer the requests received but not started, and those that still arrive,
        wait (bounded) for those in flight, then close (graceful stop).

        Reading goes on (unless the client does not read its answers): requests left unread in the
        socket when it closed made the kernel reset the connection, and the client lost the answers
        already sent to it along with them."""
        self._draining = True
        self._ctx.paused.discard(self)
        self._flow.resume("server-busy")
        self._flow.resume("in-flight")
        self._refuse_unstarted()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        self.close()

    def _refuse_unstarted(self) -> None:
        """Transaction requests already received but not started (they wait in the decoder while the
        connection is at its bound of requests in flight, or came in the read the stop cut short) are
        answered TransactionCoordinatorNotFound, which clients retry at the coordinator's next leader, and
        other requests MetadataError. Before, the connection closed without a word for them, and the Java
        client waited out its operation timeout (30 s) before giving up on each transaction request."""
        if self._closing or self._relay is not None or not self._connected:
            return
        try:
            while (frame := self._decoder.next_frame()) is not None:
                try:
                    cmd = decode_command(frame)
                except MalformedCommand:
                    continue
                if isinstance(cmd, TxnRequest):
                    self.send(Dispatcher.error_response(cmd, ServerError.TransactionCoordinatorNotFound,
                                                        STOPPING))
                elif (request_id := getattr(cmd, "request_id", None)) is not None:
                    # A lookup, partition metadata, ...: MetadataError, which the clients retry (on another
                    # connection, as this one closes).
                    self.send(error_answer(cmd, request_id, ServerError.MetadataError, STOPPING))
        except FrameError:
            pass  # the rest cannot be read: nothing of it is answerable
        finally:
            self._count_input()

    def _pause_reading(self, reason: str) -> None:
        self._flow.pause(reason)

    def _resume_reading(self, reason: str) -> None:
        # Frames received before the pause wait in the decoder: go on with them (unless the bytes now
        # go to a broker untouched).
        if self._flow.resume(reason) and self._relay is None:
            self._loop.call_soon(self._process_frames)

    def _schedule_keepalive(self) -> None:
        self._keepalive = self._loop.call_later(self._ctx.keepalive_s, self._on_keepalive)

    def _on_keepalive(self) -> None:
        """PulsarHandler's keep-alive tick: no handshake yet → close; no PONG since the last
        PING → close, unless this side is not reading (then the PONG may wait unread in the socket, as
        PulsarHandler skips the close while auto-read is off); otherwise PING again."""
        if self._closing:
            return
        if not self._connected:
            self._log.warning("no CONNECT within the keep-alive interval; closing")
            self.close()
            return
        # Not read for the server's own bounds (its share of requests in flight, the server at its
        # bound): a healthy client's PONG waits unread, and closing lost every answer in flight on it. A
        # client that does not read its answers (write-buffer) is closed as before.
        pong_unread = self._flow.paused and not self._flow.paused_for("write-buffer")
        # Half-closed and its answers unread for a whole interval: _close_if_done() waits for reading to resume
        # (frames may wait in the decoder), which only the client's reading brings, and the ticks below skip
        # a half-closed client, so one that never read held its slot and buffers for good (a review). Closed
        # as a client that does not PONG is; close() still gives it CLOSE_FLUSH_S to take its answers.
        unread = self._eof and self._flow.paused_for("write-buffer")
        if unread and self._eof_unread_at_tick:
            self._log.warning("half-closed client reads none of its answers; closing")
            self.close()
            return
        self._eof_unread_at_tick = unread
        # A client that shut down its sending side (eof_received: its answers still due) cannot PONG, and a
        # broker pings no peer below protocol version 1 (PulsarHandler.handleKeepAliveTimeout): neither is
        # dead for a missing PONG. The first closes once its requests are answered (_close_if_done); the
        # second stays as long as it is connected, as at a broker, within the connection limits.
        if self._eof or self._protocol_version < 1:
            # But a frame unfinished across a whole interval, with no frame read meanwhile, is no client's (the
            # PONG rule closes any other such connection): a v0 one holding part of a large frame kept its slot
            # and input budget for good, and a dozen of them held the budget over its limit, which then closed
            # others (a review). A pipelining client's reads end mid-frame too: it reads frames all the while.
            stalled = (not self._eof and self._decoder.buffered > 0 and not self._flow.paused
                       and self._frames_read == self._frames_at_tick)
            if stalled and self._partial_frame_at_tick:
                self._log.warning("a frame unfinished for a whole keep-alive interval; closing",
                                  buffered=self._decoder.buffered)
                self.close()
                return
            self._partial_frame_at_tick = stalled
            self._frames_at_tick = self._frames_read
            self._schedule_keepalive()
            return
        if self._waiting_pong and not pong_unread:
            self._log.warning("no PONG within the keep-alive interval; closing")
            self.close()
            return
        self._waiting_pong = True
        self.send(Ping())
        self._schedule_keepalive()

    _ROUTES: ClassVar[dict[type, Callable[[ClientConnection, Any, bytes], None]]] = {
        NewTxn: _on_txn_request,
        EndTxn: _on_txn_request,
        AddPartitionToTxn: _on_txn_request,
        AddSubscriptionToTxn: _on_txn_request,
        Ping: _on_ping,
        Pong: _on_pong,
        TcClientConnect: _on_tc_client_connect,
        Lookup: _on_lookup,
        PartitionedMetadata: _on_partitioned_metadata,
        WatchTcAssignments: _on_watch,
        WatchTcAssignmentsClose: _on_watch_close,
        Connect: _on_repeated_handshake,
        AuthResponse: _on_auth_response,
    }
