"""Batched writes to one shard over one long-lived ``WriteStream`` (docs/oxia-client.md).

The shape follows the Java client's batching (docs/oxia-client.md): operations are queued,
and a flusher task sends whatever is queued as soon as it runs (no linger: the batch is everything
submitted since the last flush, so under load batches grow by themselves while the in-flight window
is full, and a lone write goes out at once). The server answers in submission order, so responses
are matched to batches first-in, first-out, as the Go client does (``oxia/internal/write_stream.go``).

A stream that fails (server gone, leader moved, protocol error) fails the operations sent on it
with :class:`StoreUnavailableError` (their outcome is unknown) and is dropped; the next write opens
a new one. Operations still queued are then sent on that new stream.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import structlog

from tc_server._proto import oxia_client_pb2 as pb
from tc_server.store.api import StoreClosedError, StoreError, StoreUnavailableError
from tc_server.store.oxia.connections import ConnectionPool

log = structlog.get_logger(__name__)

# Batch limits of Oxia's Go and Java clients (DefaultMaxRequestsPerBatch = 1000,
# DefaultMaxBatchSize = 128 KiB; docs/oxia-client.md). A single larger operation is sent alone.
MAX_OPS_PER_BATCH = 1000
MAX_BATCH_BYTES = 128 * 1024
# The Java client's DefaultMaxWriteBatchesInFlight (docs/oxia-client.md). The server pipelines up to 1024
# writes per stream, so 4 batches keep it busy while letting the next batch grow.
MAX_BATCHES_IN_FLIGHT = 4
# A rough per-operation framing overhead (field tags, lengths, version fields) for the size limit;
# serializing every operation twice just to measure it would cost more than it saves.
OP_OVERHEAD_BYTES = 16

WriteResult = pb.PutResponse | pb.DeleteResponse
# Told (shard, the highest version id a batch's puts got): the notifications tell when those have passed.
VersionListener = Callable[[int, int], None]


@dataclass(slots=True)
class _Op:
    put: pb.PutRequest | None
    delete: pb.DeleteRequest | None
    size: int
    future: asyncio.Future[WriteResult]


@dataclass(slots=True)
class _Batch:
    puts: list[_Op] = field(default_factory=list)
    deletes: list[_Op] = field(default_factory=list)
    size: int = 0
    keys: set[str] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.puts) + len(self.deletes)

    def all_ops(self) -> list[_Op]:
        return self.puts + self.deletes


class _Stream:
    """One ``WriteStream`` call and the batches sent on it and not yet answered."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self.call = call
        self.in_flight: deque[_Batch] = deque()
        self.reader: asyncio.Task[None] | None = None
        self.failed = False


def _fail_ops(ops: list[_Op], error: StoreError) -> None:
    for op in ops:
        if not op.future.done():
            op.future.set_exception(error)
            # Nobody may be waiting any more (the caller timed out); don't warn about it.
            op.future.exception()


class ShardWriter:
    """The write path of one shard on its current leader.

    :meth:`put` and :meth:`delete` return futures that complete with the server's response, or fail
    with :class:`StoreUnavailableError` (the stream broke or the server did not answer within the
    request timeout: outcome unknown) or :class:`StoreClosedError` (after :meth:`close`). Within
    one writer, operations are applied in submission order.
    """

    def __init__(
        self,
        pool: ConnectionPool,
        *,
        shard: int,
        leader: str,
        namespace: str,
        request_timeout_s: float,
        on_version: VersionListener | None = None,
    ) -> None:
        self.shard = shard
        self.leader = leader
        self._pool = pool
        self._metadata = (("shard-id", str(shard)), ("namespace", namespace))
        self._timeout = request_timeout_s
        self._on_version = on_version
        self._queue: deque[_Op] = deque()
        self._wakeup = asyncio.Event()
        self._window = asyncio.Event()
        self._stream: _Stream | None = None
        self._closed: StoreError | None = None
        self._flusher = asyncio.get_running_loop().create_task(
            self._flush_loop(), name=f"oxia-writer-{shard}")
        # Counters for tests and the benchmark.
        self.batches_sent = 0
        self.ops_sent = 0

    def put(self, request: pb.PutRequest) -> asyncio.Future[WriteResult]:
        size = len(request.key) + len(request.value) + OP_OVERHEAD_BYTES + sum(
            len(i.index_name) + len(i.secondary_key) for i in request.secondary_indexes)
        return self._submit(_Op(request, None, size, self._new_future()))

    def delete(self, request: pb.DeleteRequest) -> asyncio.Future[WriteResult]:
        return self._submit(_Op(None, request, len(request.key) + OP_OVERHEAD_BYTES, self._new_future()))

    async def close(self, error: StoreError | None = None) -> None:
        """Fail everything pending with ``error`` (default :class:`StoreClosedError`) and end the
        stream."""
        if self._closed is not None:
            return
        self._closed = error or StoreClosedError("the Oxia store is closed")
        _fail_ops(list(self._queue), self._closed)
        self._queue.clear()
        if self._stream is not None:
            self._break(self._stream, self._closed)
        self._flusher.cancel()
        try:
            await self._flusher
        except asyncio.CancelledError:
            pass

    # -- internals --------------------------------------------------------------------------

    def _new_future(self) -> asyncio.Future[WriteResult]:
        return asyncio.get_running_loop().create_future()

    def _submit(self, op: _Op) -> asyncio.Future[WriteResult]:
        if self._closed is not None:
            _fail_ops([op], self._closed)
            return op.future
        self._queue.append(op)
        self._wakeup.set()
        return op.future

    def _take_batch(self) -> _Batch:
        batch = _Batch()
        while self._queue and len(batch) < MAX_OPS_PER_BATCH:
            op = self._queue[0]
            if op.future.done():
                # The caller gave up (request timeout) before it was sent: never send it.
                self._queue.popleft()
                continue
            if batch and batch.size + op.size > MAX_BATCH_BYTES:
                break
            # Oxia applies a WriteRequest as puts, then deletes (docs/oxia-client.md); a put queued after a
            # delete must wait for the next batch or it would overtake the delete.
            if op.put is not None and batch.deletes:
                break
            # Oxia reports at most one notification per key and batch (the batch's notifications
            # were a map keyed by key, docs/oxia-client.md): a second change of the same key goes in the next
            # batch so that subscribers see every change (e.g. CREATED, then DELETED).
            key = _plain_key(op)
            if key is not None and key in batch.keys:
                break
            if key is not None:
                batch.keys.add(key)
            self._queue.popleft()
            (batch.puts if op.put is not None else batch.deletes).append(op)
            batch.size += op.size
        return batch

    async def _flush_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                stream = self._stream or self._open()
                if len(stream.in_flight) >= MAX_BATCHES_IN_FLIGHT:
                    # The window is full: wait for an answer (the batch keeps growing meanwhile).
                    # No answer within the request timeout means the stream is stuck.
                    self._window.clear()
                    try:
                        async with asyncio.timeout(self._timeout):
                            await self._window.wait()
                    except TimeoutError:
                        self._break(stream, StoreUnavailableError(
                            f"shard {self.shard} at {self.leader}: "
                            f"no write response within {self._timeout}s"))
                    continue
                batch = self._take_batch()
                if not batch:
                    continue
                request = pb.WriteRequest(
                    shard=self.shard,
                    puts=[op.put for op in batch.puts if op.put is not None],
                    deletes=[op.delete for op in batch.deletes if op.delete is not None],
                )
                stream.in_flight.append(batch)
                self.batches_sent += 1
                self.ops_sent += len(batch)
                try:
                    async with asyncio.timeout(self._timeout):
                        await stream.call.write(request)
                except (grpc.RpcError, asyncio.InvalidStateError, TimeoutError) as e:
                    self._break(stream, StoreUnavailableError(
                        f"shard {self.shard} at {self.leader}: write stream failed: {_describe(e)}"))
                except asyncio.CancelledError:
                    # grpc.aio raises CancelledError from write() when the call was cancelled
                    # locally (the reader broke the stream meanwhile). Only a cancellation of this
                    # task itself may end the flusher; otherwise the shard would stall for good.
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
                    self._break(stream, StoreUnavailableError(
                        f"shard {self.shard} at {self.leader}: write stream cancelled"))

    def _open(self) -> _Stream:
        stub = self._pool.stub(self.leader)
        # Oxia's WriteStream takes the shard and namespace from metadata, not from the request
        # (public_rpc_server.go; docs/oxia-client.md); without them the server ends the stream.
        call = stub.WriteStream(metadata=self._metadata)
        stream = _Stream(call)
        stream.reader = asyncio.get_running_loop().create_task(
            self._read_loop(stream), name=f"oxia-writer-{self.shard}-reader")
        self._stream = stream
        return stream

    async def _read_loop(self, stream: _Stream) -> None:
        error: StoreError
        try:
            while True:
                response = await stream.call.read()
                if response is grpc.aio.EOF:
                    error = StoreUnavailableError(
                        f"shard {self.shard} at {self.leader}: the server ended the write stream")
                    break
                if not stream.in_flight:
                    error = StoreUnavailableError(f"shard {self.shard}: a write response nobody asked for")
                    break
                batch = stream.in_flight.popleft()
                self._window.set()
                if len(response.puts) != len(batch.puts) or len(response.deletes) != len(batch.deletes):
                    _fail_ops(batch.all_ops(), StoreUnavailableError(
                        f"shard {self.shard}: response does not match its request"))
                    error = StoreUnavailableError(f"shard {self.shard}: write responses out of step")
                    break
                self._complete(batch, response)
        except grpc.RpcError as e:
            error = StoreUnavailableError(
                f"shard {self.shard} at {self.leader}: write stream failed: {_describe(e)}")
        except asyncio.CancelledError:
            return
        self._break(stream, error)

    def _complete(self, batch: _Batch, response: pb.WriteResponse) -> None:
        highest = -1
        for op, put_response in zip(batch.puts, response.puts, strict=True):
            if not op.future.done():
                op.future.set_result(put_response)
            if put_response.status == pb.OK:
                highest = max(highest, put_response.version.version_id)
        for op, delete_response in zip(batch.deletes, response.deletes, strict=True):
            if not op.future.done():
                op.future.set_result(delete_response)
        if highest >= 0 and self._on_version is not None:
            self._on_version(self.shard, highest)

    def _break(self, stream: _Stream, error: StoreError) -> None:
        if stream.failed:
            return
        stream.failed = True
        if self._stream is stream:
            self._stream = None
        if not isinstance(error, StoreClosedError):
            log.info("oxia_write_stream_failed", shard=self.shard, leader=self.leader,
                     in_flight=sum(len(b) for b in stream.in_flight), error=str(error))
        for batch in stream.in_flight:
            _fail_ops(batch.all_ops(), error)
        stream.in_flight.clear()
        stream.call.cancel()
        if stream.reader is not None and stream.reader is not asyncio.current_task():
            stream.reader.cancel()
        self._window.set()
        if self._queue:
            self._wakeup.set()


def _plain_key(op: _Op) -> str | None:
    """The key an operation changes, or None for a sequential put (its key is new by design)."""
    if op.put is not None:
        return None if op.put.sequence_key_delta else op.put.key
    return op.delete.key if op.delete is not None else None


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    if isinstance(error, TimeoutError):
        return "timed out"
    return repr(error)
