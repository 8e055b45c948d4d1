"""A raw Pulsar wire peer for the differential tests: the same bytes go to Pulsar 4.2.4's own coordinator
(on the real broker's port) and to tc-server, and the answers come back as plain tuples to compare."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.wire import (
    AddPartitionToTxn,
    AddSubscriptionToTxn,
    Command,
    Connect,
    FrameDecoder,
    Lookup,
    Pong,
    Subscription,
    TcClientConnect,
    decode_command,
    encode_command,
    encode_frame,
)
from tc_server.wire.errors import WireError

_Base = pb.BaseCommand


def raw_end_txn(request_id: int, most: int, least: int, action: int | None) -> bytes:
    """An END_TXN frame with any txn_action varint (an invalid enum value included), or none."""
    m = pb.CommandEndTxn(request_id=request_id, txnid_most_bits=most, txnid_least_bits=least)
    body = m.SerializeToString()
    if action is not None:
        # field 4, varint; written by hand so values outside the enum go on the wire
        body += bytes([4 << 3]) + _varint(action)
    base = pb.BaseCommand(type=_Base.END_TXN)
    raw = base.SerializeToString() + _varint((56 << 3) | 2) + _varint(len(body)) + body
    return encode_frame(raw)


def raw_new_txn(request_id: int, ttl: int, tc_id: int) -> bytes:
    """A NEW_TXN frame with any uint64 ttl and tc_id."""
    base = pb.BaseCommand(type=_Base.NEW_TXN)
    base.newTxn.request_id = request_id
    base.newTxn.txn_ttl_millis = ttl
    base.newTxn.tc_id = tc_id
    return encode_frame(base.SerializeToString())


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


@dataclass
class Peer:
    """One TCP connection speaking raw frames; ``received`` holds every command (or undecodable frame)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    received: list[Any] = field(default_factory=list)
    closed: bool = False
    _decoder: FrameDecoder = field(default_factory=lambda: FrameDecoder(6 * 1024 * 1024))
    _next: int = 1

    @classmethod
    async def open(cls, port: int) -> Peer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    def rid(self) -> int:
        self._next += 1
        return self._next

    def send(self, data: bytes | Command) -> None:
        self.writer.write(data if isinstance(data, bytes) else encode_command(data))

    async def read_until(self, pred, seconds: float = 10.0) -> Any | None:
        """The first received command (from now on, or already received and unconsumed) for which
        ``pred`` holds, or None when ``seconds`` pass or the peer closes."""
        for i, c in enumerate(self.received):
            if pred(c):
                return self.received.pop(i)
        try:
            async with asyncio.timeout(seconds):
                while True:
                    data = await self.reader.read(65536)
                    if not data:
                        self.closed = True
                        return None
                    self._decoder.feed(data)
                    while (frame := self._decoder.next_frame()) is not None:
                        cmd: Any
                        try:
                            cmd = decode_command(frame)
                        except WireError as exc:
                            cmd = ("undecodable", str(exc))
                        if type(cmd).__name__ == "Ping":
                            self.writer.write(encode_command(Pong()))
                            continue
                        self.received.append(cmd)
                    for i, c in enumerate(self.received):
                        if pred(c):
                            return self.received.pop(i)
        except TimeoutError:
            return None
        except ConnectionResetError:
            self.closed = True
            return None

    async def answer(self, request_id: int, seconds: float = 10.0) -> Any | None:
        return await self.read_until(lambda c: getattr(c, "request_id", None) == request_id, seconds)

    async def handshake(self, protocol_version: int = 21) -> Any:
        self.send(Connect(client_version="differential-peer", protocol_version=protocol_version,
                          auth_method_name="none"))
        return await self.read_until(lambda c: type(c).__name__ in ("Connected", "Error", "AuthChallenge"))

    async def tc_connect(self, tc_id: int) -> Any:
        r = self.rid()
        self.send(TcClientConnect(r, tc_id))
        return await self.answer(r, 30)

    async def new_txn(self, tc_id: int, ttl_ms: int = 60_000) -> Any:
        r = self.rid()
        self.send(raw_new_txn(r, ttl_ms, tc_id))
        return await self.answer(r, 30)

    async def end(self, most: int, least: int, action: int | None, seconds: float = 30) -> Any:
        r = self.rid()
        self.send(raw_end_txn(r, most, least, action))
        return await self.answer(r, seconds)

    async def add_partition(self, most: int, least: int, *topics: str) -> Any:
        r = self.rid()
        self.send(AddPartitionToTxn(r, most, least, tuple(topics)))
        return await self.answer(r, 30)

    async def add_subscription(self, most: int, least: int, topic: str, sub: str) -> Any:
        r = self.rid()
        self.send(AddSubscriptionToTxn(r, most, least, (Subscription(topic, sub),)))
        return await self.answer(r, 30)

    def close(self) -> None:
        self.writer.close()


def outcome(answer: Any) -> tuple[Any, ...]:
    """What a client acts on: (type name, error name or 'OK', message), or ('NO ANSWER',)."""
    if answer is None:
        return ("NO ANSWER",)
    if isinstance(answer, tuple):
        return answer
    err = getattr(answer, "error", None)
    return (type(answer).__name__, "OK" if err is None else err.name, getattr(answer, "message", None))


ASSIGN = "persistent://pulsar/system/transaction_coordinator_assign"


async def lookup(peer: Peer, tc_id: int) -> Any:
    """LOOKUP of the assign topic's partition ``tc_id`` (on a broker this makes it load the coordinator)."""
    r = peer.rid()
    peer.send(Lookup(f"{ASSIGN}-partition-{tc_id}", r, authoritative=False))
    return await peer.answer(r, 60)


async def wait_closed(peer: Peer, seconds: float = 3.0) -> bool:
    """Whether the peer closes the connection within ``seconds`` (anything it sends meanwhile is kept)."""
    await peer.read_until(lambda c: False, seconds)
    return peer.closed
