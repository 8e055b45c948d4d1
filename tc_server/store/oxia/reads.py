"""Reads on one shard: point gets and index gets (``Read``) and range scans (``RangeScan``), docs/oxia-client.md.

Each function takes the stub of the shard's leader and applies the request timeout: the whole
unary-stream call for a get, and every message of a scan (a scan of many records may take long in
total but must never stall).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from tc_server._proto import oxia_client_pb2 as pb
from tc_server._proto import oxia_client_pb2_grpc as pb_grpc
from tc_server.store.api import Record, StoreClosedError, StoreUnavailableError


def to_record(key: str, response: pb.GetResponse) -> Record:
    """A :class:`Record` from a ``GetResponse`` (its ``key`` field wins when set: scans and index
    lookups report the primary key there)."""
    return versioned_record(response.key if response.HasField("key") else key, response.value, response.version)


def versioned_record(key: str, value: bytes, version: pb.Version) -> Record:
    """The :class:`Record` of ``key`` holding ``value`` at Oxia's ``version`` (as a read or a put answered it)."""
    return Record(
        key=key,
        value=value,
        version=version.version_id,
        created_ms=version.created_timestamp,
        modified_ms=version.modified_timestamp,
        session_id=version.session_id if version.HasField("session_id") else None,
    )


def status_name(status: int) -> str:
    """The name of an Oxia ``Status``, or its number when this client does not know it (a newer
    server's: ``Status.Name`` would raise)."""
    return pb.Status.Name(status) if status in pb.Status.values() else f"status {status}"


def unavailable(what: str, error: BaseException) -> StoreUnavailableError:
    """The typed error for a failed or timed-out RPC."""
    if isinstance(error, grpc.aio.AioRpcError):
        detail = f"{error.code().name}: {error.details()}"
    elif isinstance(error, TimeoutError):
        detail = "timed out"
    else:
        detail = repr(error)
    return StoreUnavailableError(f"{what}: {detail}")


def cut_by_close() -> bool:
    """For an ``except asyncio.CancelledError`` around a call: True when the store's close() ended the call
    (grpc.aio ends a call cancelled locally with CancelledError, and only close() cancels calls locally:
    it closes the channels), False when the caller's own task is being cancelled."""
    task = asyncio.current_task()
    return task is None or not task.cancelling()


def closed_under_the_call() -> None:
    """For an ``except asyncio.CancelledError`` around a call: unless the caller's own task is being
    cancelled, raise the StoreClosedError the store's callers expect. A CancelledError would end their task
    as cancelled, which no one asked for."""
    if cut_by_close():
        raise StoreClosedError("the Oxia store was closed during the call")


async def get(stub: pb_grpc.OxiaClientStub, shard: int, key: str, timeout_s: float) -> Record | None:
    """The record at ``key`` on ``shard``, or None. Raises :class:`StoreUnavailableError` when the
    call fails or does not finish within ``timeout_s``."""
    request = pb.ReadRequest(shard=shard, gets=[pb.GetRequest(key=key, include_value=True)])
    try:
        async with asyncio.timeout(timeout_s):
            call = stub.Read(request)
            try:
                async for response in call:
                    for got in response.gets:
                        if got.status == pb.KEY_NOT_FOUND:
                            return None
                        if got.status != pb.OK:
                            raise StoreUnavailableError(
                                f"get {key!r} on shard {shard}: {status_name(got.status)}")
                        return to_record(key, got)
            finally:
                call.cancel()
    except (grpc.RpcError, TimeoutError) as e:
        raise unavailable(f"get {key!r} on shard {shard}", e) from e
    except asyncio.CancelledError:
        closed_under_the_call()
        raise
    raise StoreUnavailableError(f"get {key!r} on shard {shard}: the server sent no answer")


async def index_gets(stub: pb_grpc.OxiaClientStub, shard: int, gets: list[pb.GetRequest],
                     timeout_s: float) -> list[bool]:
    """For each get on a secondary index (``secondary_index_name``, ``EQUAL``), in order, whether ``shard``
    holds a record under its secondary key: all in one ``Read`` call. Raises :class:`StoreUnavailableError`
    when the call fails, takes longer than ``timeout_s``, leaves a get unanswered or answers one with a
    status other than ``OK`` or ``KEY_NOT_FOUND``."""
    answers: list[pb.GetResponse] = []
    try:
        async with asyncio.timeout(timeout_s):
            call = stub.Read(pb.ReadRequest(shard=shard, gets=gets))
            try:
                async for response in call:
                    answers.extend(response.gets)
                    if len(answers) >= len(gets):
                        break
            finally:
                call.cancel()
    except (grpc.RpcError, TimeoutError) as e:
        raise unavailable(f"{len(gets)} index get(s) on shard {shard}", e) from e
    except asyncio.CancelledError:
        closed_under_the_call()
        raise
    if len(answers) != len(gets):
        raise StoreUnavailableError(f"{len(gets)} index get(s) on shard {shard}: {len(answers)} answered")
    found: list[bool] = []
    for get, got in zip(gets, answers, strict=True):
        if got.status not in (pb.OK, pb.KEY_NOT_FOUND):
            # Any other failure must not pass for an absent record.
            raise StoreUnavailableError(f"index get of {get.key!r} in {get.secondary_index_name} on shard "
                                        f"{shard}: {status_name(got.status)}")
        found.append(got.status == pb.OK)
    return found


async def range_scan(
    stub: pb_grpc.OxiaClientStub,
    shard: int,
    start_inclusive: str,
    end_exclusive: str,
    timeout_s: float,
    *,
    secondary_index_name: str | None = None,
) -> AsyncIterator[Record]:
    """Every record of ``shard`` in ``[start_inclusive, end_exclusive)`` (of the secondary keys of
    ``secondary_index_name`` when given), in the server's order. Raises
    :class:`StoreUnavailableError` when the call fails, a message takes longer than ``timeout_s`` or
    a record comes with a status other than ``OK`` or ``KEY_NOT_FOUND``.
    """
    request = pb.RangeScanRequest(shard=shard, start_inclusive=start_inclusive, end_exclusive=end_exclusive)
    if secondary_index_name is not None:
        request.secondary_index_name = secondary_index_name
    call = stub.RangeScan(request)
    try:
        while True:
            try:
                async with asyncio.timeout(timeout_s):
                    response = await call.read()
            except (grpc.RpcError, TimeoutError) as e:
                raise unavailable(f"range scan on shard {shard}", e) from e
            except asyncio.CancelledError:
                closed_under_the_call()
                raise
            if response is grpc.aio.EOF:
                return
            for got in response.records:
                if got.status == pb.KEY_NOT_FOUND:
                    # An index scan reads each record after its index entry (oxiad's
                    # secondaryIndexRangeIterator): one deleted in between is simply gone.
                    continue
                # Any other failure must not pass for an absent record.
                if got.status != pb.OK:
                    raise StoreUnavailableError(
                        f"range scan on shard {shard}: record {got.key!r}: {status_name(got.status)}")
                yield to_record(got.key, got)
    finally:
        call.cancel()
