"""One client connection: a thin ``asyncio.Protocol`` around the sans-IO codec.

``data_received`` feeds the frame decoder and handles each command: discovery and keep-alive are
answered at once; transaction requests run as tasks so that many are in flight per connection (the
Java client pipelines up to 1000 per coordinator handler, and all handlers for one server share one
connection). Bad input is answered and contained here: it can close this connection, never another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import structlog

from tc_server.metrics import Metrics
from tc_server.server.dispatch import Dispatcher, TxnRequest
from tc_server.server.handshake import (
    MIN_TC_CLIENT_CONNECT_VERSION,
    AuthenticationFailed,
    Authenticator,
    negotiate,
)
from tc_server.wire import (
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
    Unknown,
    WatchTcAssignments,
    WatchTcAssignmentsClose,
    WatchTcAssignmentsUpdate,
    decode_command,
    encode_command,
)

log = structlog.get_logger("tc_server.connection")

# Requests in flight on one connection before we stop reading from it (back-pressure, not an
# error): 16 coordinator handlers x 1000 pipelined ops each (TransactionMetaStoreHandler's semaphore).
MAX_IN_FLIGHT = 16_384
# ERROR needs a request id; -1 is what the broker sends when there is none (authentication errors).
NO_REQUEST_ID = -1
NOT_SERVED = "not served by a transaction coordinator"


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
    max_in_flight: int = 65_536
    in_flight: int = 0
    paused: set[ClientConnection] = field(default_factory=set)
    connections: set[ClientConnection] = field(default_factory=set)


class ClientConnection(asyncio.Protocol):
    def __init__(self, context: ServerContext) -> None:
        self._ctx = context
        self._decoder = FrameDecoder(context.max_frame_size)
        self._transport: asyncio.Transport | None = None
        self._log: Any = log
        self._connected = False
        self._closing = False
        self._principal: str | None = None
        self._waiting_pong = False
        self._keepalive: asyncio.TimerHandle | None = None
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._read_paused_for = set[str]()  # reasons: "in-flight", "write-buffer"
        # Responses written in one loop iteration go out in one write: a syscall per response was
        # a quarter of the server's time under load (profiled), and batching adds no latency.
        self._out: list[bytes] = []
        # WATCH_TC_ASSIGNMENTS watch ids of this connection, and how to stop listening for changes.
        self._watches: set[int] = set()
        self._unwatch: Callable[[], None] | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass, but has its interface.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self._log = log.bind(peer=f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer))
        self._ctx.connections.add(self)
        self._ctx.metrics.connections.inc()
        self._schedule_keepalive()
        self._log.debug("connection opened")

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        self._ctx.connections.discard(self)
        self._ctx.paused.discard(self)
        self._ctx.metrics.connections.dec()
        self._log.info("connection closed", error=repr(exc) if exc else None, in_flight=self._in_flight)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._decoder.feed(data)
        self._process_frames()

    def _process_frames(self) -> None:
        # Stop at once when paused: pause_reading() only stops the socket, while the frames of
        # this read are already in the decoder. They wait there until reading resumes.
        try:
            while not self._closing and not self._read_paused_for:
                if self._ctx.in_flight >= self._ctx.max_in_flight:
                    self._pause_reading("server-busy")
                    self._ctx.paused.add(self)
                    return
                frame = self._decoder.next_frame()
                if frame is None:
                    return
                self._on_frame(frame)
        except FrameError as exc:
            self._log.warning("bad frame; closing", error=str(exc))
            self.close()

    def pause_writing(self) -> None:
        # The client is not reading its answers: stop reading its requests until it does.
        self._pause_reading("write-buffer")

    def resume_writing(self) -> None:
        self._resume_reading("write-buffer")

    # -- commands ------------------------------------------------------------------------------

    def _on_frame(self, frame: bytes) -> None:
        try:
            cmd = decode_command(frame)
        except MalformedCommand as exc:
            self._log.warning("malformed command; closing", reason=exc.reason, request_id=exc.request_id)
            if exc.request_id is not None:
                self.send(Error(exc.request_id, ServerError.UnknownError, f"malformed command: {exc.reason}"))
            self.close()
            return
        # Any inbound command proves the peer alive (PulsarHandler clears its waiting flag the same way).
        self._waiting_pong = False
        kind = type(cmd)
        if not self._connected:
            if kind is Connect:
                self._on_connect(cmd)  # type: ignore[arg-type]
            else:
                request_id = getattr(cmd, "request_id", None)
                self._log.warning("command before CONNECT; closing", command=kind.__name__)
                if request_id is not None:
                    self.send(Error(request_id, ServerError.NotAllowedError, "send CONNECT first"))
                self.close()
            return
        if kind is NewTxn or kind is EndTxn or kind is AddPartitionToTxn or kind is AddSubscriptionToTxn:
            self._start_txn_request(cmd)  # type: ignore[arg-type]
        elif kind is Ping:
            self.send(Pong())
        elif kind is Pong:
            pass
        elif kind is TcClientConnect:
            self.send(self._ctx.dispatcher.tc_client_connect(cmd))  # type: ignore[arg-type]
        elif kind is Lookup:
            self.send(self._ctx.dispatcher.lookup(cmd))  # type: ignore[arg-type]
        elif kind is PartitionedMetadata:
            self.send(self._ctx.dispatcher.partitioned_metadata(cmd))  # type: ignore[arg-type]
        elif kind is WatchTcAssignments:
            self._watch(cmd.watch_id)  # type: ignore[union-attr]
        elif kind is WatchTcAssignmentsClose:
            self._watches.discard(cmd.watch_id)  # type: ignore[union-attr]
        elif kind is Connect or kind is AuthResponse:
            self._log.info("ignoring repeated handshake command", command=kind.__name__)
        else:
            request_id = getattr(cmd, "request_id", None)
            name = f"type {cmd.type_code}" if isinstance(cmd, Unknown) else kind.__name__
            self._log.info("command not served", command=name, request_id=request_id)
            self._ctx.metrics.request_errors.labels("OTHER", ServerError.NotAllowedError.name).inc()
            self.send(Error(NO_REQUEST_ID if request_id is None else request_id,
                            ServerError.NotAllowedError, f"{name}: {NOT_SERVED}"))

    def _on_connect(self, connect: Connect) -> None:
        try:
            result = negotiate(connect, self._ctx.authenticator, self._ctx.max_message_size)
        except AuthenticationFailed as exc:
            self._log.warning("authentication failed", error=str(exc))
            self.send(Error(NO_REQUEST_ID, ServerError.AuthenticationError, str(exc)))
            self.close()
            return
        self._connected = True
        self._principal = result.principal
        self._log = self._log.bind(client=connect.client_version, protocol=result.protocol_version)
        if result.protocol_version < MIN_TC_CLIENT_CONNECT_VERSION:
            # Such a client skips TC_CLIENT_CONNECT and sends txn requests straight away; we
            # serve them all the same.
            self._log.info("old protocol version: client will not send TC_CLIENT_CONNECT")
        self.send(result.connected)
        self._log.info("client connected")

    def _watch(self, watch_id: int) -> None:
        """WATCH_TC_ASSIGNMENTS: the full map now, and again whenever it changes."""
        self._watches.add(watch_id)
        if self._unwatch is None:
            self._unwatch = self._ctx.dispatcher.coordinator.watch_assignments(self._assignments_changed)
        self.send(WatchTcAssignmentsUpdate(watch_id, self._ctx.dispatcher.assignments_snapshot()))

    def _assignments_changed(self, leaders: dict[int, str]) -> None:
        snapshot = self._ctx.dispatcher.assignments_snapshot(leaders)
        for watch_id in sorted(self._watches):
            self.send(WatchTcAssignmentsUpdate(watch_id, snapshot))

    def _start_txn_request(self, cmd: TxnRequest) -> None:
        ctx = self._ctx
        self._in_flight += 1
        ctx.in_flight += 1
        ctx.metrics.in_flight.set(ctx.in_flight)
        if self._in_flight >= MAX_IN_FLIGHT:
            self._pause_reading("in-flight")
        task = asyncio.get_running_loop().create_task(self._serve_txn(cmd))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_txn(self, cmd: TxnRequest) -> None:
        ctx = self._ctx
        try:
            response = await ctx.dispatcher.transaction(cmd, self._principal)
        finally:
            self._in_flight -= 1
            ctx.in_flight -= 1
            ctx.metrics.in_flight.set(ctx.in_flight)
            if self._in_flight < MAX_IN_FLIGHT // 2:
                self._resume_reading("in-flight")
            if ctx.paused and ctx.in_flight < max(1, ctx.max_in_flight // 2):
                for connection in list(ctx.paused):
                    connection._resume_reading("server-busy")
                ctx.paused.clear()
        self.send(response)

    # -- output and lifecycle ------------------------------------------------------------------

    def send(self, cmd: Command) -> None:
        if self._transport is None or self._closing:
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(encode_command(cmd))

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(out) if len(out) > 1 else out[0])

    def close(self) -> None:
        """Close after what was written is flushed."""
        if not self._closing and self._transport is not None:
            self._flush()
            self._closing = True
            self._transport.close()

    async def drain(self, timeout_s: float) -> None:
        """Stop reading and wait (bounded) for the requests in flight, then close (graceful stop)."""
        self._pause_reading("shutdown")
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        self.close()

    def _pause_reading(self, reason: str) -> None:
        if not self._read_paused_for and self._transport is not None and not self._closing:
            self._transport.pause_reading()
        self._read_paused_for.add(reason)

    def _resume_reading(self, reason: str) -> None:
        if reason not in self._read_paused_for:
            return
        self._read_paused_for.discard(reason)
        if not self._read_paused_for and self._transport is not None and not self._closing:
            self._transport.resume_reading()
            asyncio.get_running_loop().call_soon(self._process_frames)

    def _schedule_keepalive(self) -> None:
        loop = asyncio.get_running_loop()
        self._keepalive = loop.call_later(self._ctx.keepalive_s, self._on_keepalive)

    def _on_keepalive(self) -> None:
        """PulsarHandler's keep-alive tick: no handshake yet → close; no PONG since the last
        PING → close; otherwise PING again."""
        if self._closing:
            return
        if not self._connected:
            self._log.warning("no CONNECT within the keep-alive interval; closing")
            self.close()
            return
        if self._waiting_pong:
            self._log.warning("no PONG within the keep-alive interval; closing")
            self.close()
            return
        self._waiting_pong = True
        self.send(Ping())
        self._schedule_keepalive()
