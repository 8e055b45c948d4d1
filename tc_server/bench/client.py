"""A minimal pipelining Pulsar TC client on the wire codec, for tests and the load generator.

It speaks exactly what a Java client sends to a coordinator (CONNECT, TC_CLIENT_CONNECT, NEW_TXN,
ADD_*, END_TXN) and matches answers by request id, so thousands of requests can be in flight.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, TypeVar

from tc_server.wire import (
    AddPartitionToTxn,
    AddSubscriptionToTxn,
    Command,
    Connect,
    Connected,
    EndTxn,
    EndTxnResponse,
    Error,
    FrameDecoder,
    Lookup,
    LookupResponse,
    NewTxn,
    NewTxnResponse,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    Ping,
    Pong,
    Subscription,
    TcClientConnect,
    TcClientConnectResponse,
    TxnAction,
    WatchTcAssignments,
    WatchTcAssignmentsUpdate,
    decode_command,
    encode_command,
)

R = TypeVar("R")


class ClientProtocolError(Exception):
    pass


class TcClient(asyncio.Protocol):
    """Use :func:`connect`. Responses that carry an error are returned, not raised, so tests can
    look at the exact code, message and txnid_most_bits."""

    def __init__(self) -> None:
        self._decoder = FrameDecoder(64 * 1024 * 1024)
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._connected: asyncio.Future[Connected] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pings_received = 0
        self.errors: list[Error] = []  # ERROR frames that matched no pending request
        self.answer_pings = True
        self.assignment_updates: asyncio.Queue[WatchTcAssignmentsUpdate] = asyncio.Queue()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._decoder.feed(data)
        while (frame := self._decoder.next_frame()) is not None:
            self._on_command(decode_command(frame))

    def connection_lost(self, exc: Exception | None) -> None:
        error = ConnectionError(f"connection lost: {exc!r}")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        if not self._connected.done():
            self._connected.set_exception(error)
        if not self.closed.done():
            self.closed.set_result(None)

    def _on_command(self, cmd: Command) -> None:
        if isinstance(cmd, Connected):
            self._connected.set_result(cmd)
        elif isinstance(cmd, Ping):
            self.pings_received += 1
            if self.answer_pings:
                self.send(Pong())
        elif isinstance(cmd, WatchTcAssignmentsUpdate):
            self.assignment_updates.put_nowait(cmd)
        elif isinstance(cmd, Pong):
            future = self._pending.pop(-2, None)
            if future is not None and not future.done():
                future.set_result(cmd)
        else:
            request_id = getattr(cmd, "request_id", None)
            future = self._pending.pop(request_id, None) if request_id is not None else None
            if future is not None and not future.done():
                future.set_result(cmd)
            elif isinstance(cmd, Error):
                self.errors.append(cmd)

    # requests
    def send(self, cmd: Command) -> None:
        assert self._transport is not None
        self._transport.write(encode_command(cmd))

    def send_raw(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def next_request_id(self) -> int:
        return next(self._ids)

    async def request(self, cmd: Any, request_id: int) -> Any:
        if self.closed.done():
            # connection_lost already failed everything pending; a request registered after it
            # would wait forever.
            raise ConnectionError("connection lost before the request was sent")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        self.send(cmd)
        return await future

    async def handshake(self, protocol_version: int = 21) -> Connected:
        self.send(Connect(client_version="tc-server-test-client", protocol_version=protocol_version,
                          auth_method_name="none"))
        return await self._connected

    async def ping(self) -> Pong:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[-2] = future
        self.send(Ping())
        return await future  # type: ignore[no-any-return]

    async def watch_assignments(self, watch_id: int) -> WatchTcAssignmentsUpdate:
        """Send WATCH_TC_ASSIGNMENTS; returns the first update (later ones queue up in
        ``assignment_updates``)."""
        self.send(WatchTcAssignments(watch_id))
        return await self.assignment_updates.get()

    async def partitioned_metadata(self, topic: str) -> PartitionedMetadataResponse:
        rid = self.next_request_id()
        return await self.request(PartitionedMetadata(topic, rid), rid)  # type: ignore[no-any-return]

    async def lookup(self, topic: str) -> LookupResponse:
        rid = self.next_request_id()
        return await self.request(Lookup(topic, rid), rid)  # type: ignore[no-any-return]

    async def tc_client_connect(self, tc_id: int) -> TcClientConnectResponse:
        rid = self.next_request_id()
        return await self.request(TcClientConnect(rid, tc_id), rid)  # type: ignore[no-any-return]

    async def new_txn(self, tc_id: int, ttl_ms: int = 0) -> NewTxnResponse:
        rid = self.next_request_id()
        return await self.request(NewTxn(rid, ttl_ms, tc_id), rid)  # type: ignore[no-any-return]

    async def end_txn(self, most: int, least: int, commit: bool) -> EndTxnResponse:
        rid = self.next_request_id()
        action = TxnAction.COMMIT if commit else TxnAction.ABORT
        return await self.request(EndTxn(rid, most, least, action), rid)  # type: ignore[no-any-return]

    async def add_partition(self, most: int, least: int, topic: str) -> Any:
        rid = self.next_request_id()
        return await self.request(AddPartitionToTxn(rid, most, least, (topic,)), rid)

    async def add_subscription(self, most: int, least: int, topic: str, sub: str) -> Any:
        rid = self.next_request_id()
        return await self.request(AddSubscriptionToTxn(rid, most, least, (Subscription(topic, sub),)), rid)


async def connect(host: str, port: int, *, handshake: bool = True, protocol_version: int = 21) -> TcClient:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(TcClient, host, port)
    if handshake:
        await client.handshake(protocol_version)
    return client
