"""A Pulsar broker stand-in on a real socket (plain or TLS), for what a real broker cannot do on cue:
answer LOOKUP with a REDIRECT or a URL that does not parse, hang, stop reading. The real brokers are in
tests/e2e and tests/participants/test_real_broker.py."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from tc_server.wire import (
    Connect,
    Connected,
    FrameDecoder,
    Lookup,
    LookupResponse,
    LookupType,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    Ping,
    Pong,
    decode_command,
    encode_command,
)
from tc_server.wire.commands import EndTxnOnPartition, EndTxnOnPartitionResponse

LookupAnswer = Callable[[Lookup], LookupResponse | None]
MetadataAnswer = Callable[[PartitionedMetadata], PartitionedMetadataResponse | None]
EndTxnAnswer = Callable[[EndTxnOnPartition], EndTxnOnPartitionResponse | None]


def acknowledge(command: EndTxnOnPartition) -> EndTxnOnPartitionResponse:
    """An END_TXN_ON_PARTITION's success, as a broker answers it."""
    return EndTxnOnPartitionResponse(command.request_id, command.most, command.least)


class StandInBroker:
    """Answers CONNECT with CONNECTED (after ``connect_delay_s``), PING with PONG, and each LOOKUP with
    ``answer(lookup)`` after ``lookup_delay_s`` (None: never), each PARTITIONED_METADATA with
    ``metadata_answer(request)`` (None, or no such function: never). ``connects`` holds every CONNECT (with the
    credentials it carried), ``lookup_frames`` every LOOKUP's BaseCommand bytes as they arrived.
    ``answers = False``: after CONNECTED it answers nothing (a hung broker); ``reads = False``: after
    CONNECTED it reads nothing either (a broker whose process stopped). ``ssl_context``: it speaks TLS,
    and ``url`` is its pulsar+ssl:// URL (``localhost``, the name test certificates carry). ``owns_every_topic``:
    every LOOKUP names this stand-in. ``end_txn_answer``: each END_TXN_ON_PARTITION, kept in ``end_txns``, is
    answered ``end_txn_answer(command)`` (None: never; e.g. :func:`acknowledge`)."""

    def __init__(self, answer: LookupAnswer | None = None, *, connect_delay_s: float = 0.0,
                 lookup_delay_s: float = 0.0, answers: bool = True, reads: bool = True,
                 ssl_context: ssl.SSLContext | None = None, metadata_answer: MetadataAnswer | None = None,
                 owns_every_topic: bool = False, end_txn_answer: EndTxnAnswer | None = None) -> None:
        self.answer = answer
        self.owns_every_topic = owns_every_topic
        self.end_txn_answer = end_txn_answer
        self.end_txns: list[EndTxnOnPartition] = []
        self.metadata_answer = metadata_answer
        self.ssl_context = ssl_context
        self.connects: list[Connect] = []
        self.connect_delay_s = connect_delay_s
        self.lookup_delay_s = lookup_delay_s
        self.answers = answers
        self.reads = reads
        self.lookup_frames: list[bytes] = []
        self.open: set[asyncio.StreamWriter] = set()
        self.connections_total = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        if self.ssl_context is not None:
            return f"pulsar+ssl://localhost:{self.port}"
        return f"pulsar://127.0.0.1:{self.port}"

    async def start(self) -> StandInBroker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.owns_every_topic:
            self.answer = connect_to(self.url)
        return self

    def stop(self) -> None:
        for writer in self.open:
            writer.close()
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open.add(writer)
        self.connections_total += 1
        decoder = FrameDecoder()
        try:
            while data := await reader.read(65536):
                decoder.feed(data)
                while (frame := decoder.next_frame()) is not None:
                    await self._on_frame(frame, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.open.discard(writer)
            writer.close()

    async def _on_frame(self, frame: bytes, writer: asyncio.StreamWriter) -> None:
        command = decode_command(frame)
        if isinstance(command, Connect):
            self.connects.append(command)
            await asyncio.sleep(self.connect_delay_s)
            writer.write(encode_command(Connected("stand-in", 21)))
            if not self.reads:
                await asyncio.Event().wait()
        elif not self.answers:
            return
        elif isinstance(command, Ping):
            writer.write(encode_command(Pong()))
        elif isinstance(command, Lookup):
            self.lookup_frames.append(frame)
            await asyncio.sleep(self.lookup_delay_s)
            answer = self.answer(command) if self.answer is not None else None
            if answer is not None:
                writer.write(encode_command(answer))
        elif isinstance(command, EndTxnOnPartition) and self.end_txn_answer is not None:
            self.end_txns.append(command)
            if (ended := self.end_txn_answer(command)) is not None:
                writer.write(encode_command(ended))
        elif isinstance(command, PartitionedMetadata) and self.metadata_answer is not None:
            metadata = self.metadata_answer(command)
            if metadata is not None:
                writer.write(encode_command(metadata))


def connect_to(url: str) -> LookupAnswer:
    return lambda lookup: LookupResponse(lookup.request_id, LookupType.CONNECT, broker_service_url=url)


def redirect_to(url: str) -> LookupAnswer:
    return lambda lookup: LookupResponse(lookup.request_id, LookupType.REDIRECT, broker_service_url=url)


