"""``OxiaStore``: the :class:`~tc_server.store.api.MetadataStore` on an Oxia cluster (docs/oxia-client.md).

How the Protocol maps onto Oxia (docs/oxia-client.md):

* ``expected_version=EXPECT_ABSENT`` is Oxia's ``expected_version_id = -1``. ``UNEXPECTED_VERSION_ID``
  (also what Oxia answers for a version on a missing key) becomes :class:`BadVersionError` for single
  operations and ``Outcome.BAD_VERSION`` in :meth:`OxiaStore.write_batch`; ``KEY_NOT_FOUND`` on a
  delete is ``False`` / ``Outcome.NOT_FOUND``. Any other status leaves the outcome unknown:
  :class:`StoreUnavailableError` naming it.
* Sequential puts are ``sequence_key_delta=[1]`` with the partition key; the key comes back in
  ``PutResponse.key`` (an answer without it raises :class:`StoreUnavailableError`).
* Ephemeral puts carry the session id of their shard (:mod:`.sessions`); no other put does, also in
  a batch that has both (Oxia would make it ephemeral).
* ``created_ms``/``modified_ms`` are ``Version.created_timestamp``/``modified_timestamp`` (ms).
* Every request is bounded by ``request_timeout_s``; running out of it, or any transport failure,
  raises :class:`StoreUnavailableError`.

**Children of a path** (``scan_prefix``). Pulsar lists the children of ``p`` with
``[p + "/", p + "//")`` (docs/oxia-client.md), which is right only under the segment-wise hierarchical
order of Oxia's ``CompareWithSlash`` (a key with no further ``/`` sorts before any deeper one with
the same leading segments). Newer Oxia documents hierarchical sorting as "fewer ``/`` first, then
bytes", where that range would also take in same-depth keys of other parents, and a namespace may
use natural (byte) order. This client therefore scans ``[prefix, prefix + U+10FFFF)``: under all
three orders it holds every key that starts with ``prefix`` and has no further ``/`` (a child's
next character is always below U+10FFFF), and under the hierarchical ones nothing deeper. A client
side filter then drops anything that is not a direct child (deeper keys under natural order).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import structlog

from tc_server._proto import oxia_client_pb2 as pb
from tc_server.store.api import (
    Delete,
    InvalidOperationError,
    Outcome,
    Put,
    Record,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    WriteResult,
    validate_put,
)
from tc_server.store.keys import index_has_by_scan
from tc_server.store.oxia import reads
from tc_server.store.oxia.assignments import AssignmentWatcher
from tc_server.store.oxia.connections import ConnectionPool
from tc_server.store.oxia.index_probes import IndexProbes
from tc_server.store.oxia.notifications import INDEX_CHECK_PREFIX, NotificationPump, OxiaSubscription
from tc_server.store.oxia.routing import ShardInfo, ShardMap
from tc_server.store.oxia.sessions import SessionManager, default_client_identity
from tc_server.store.oxia.write_stream import ShardWriter
from tc_server.store.oxia.write_stream import WriteResult as Answer
from tc_server.store.writes import StoreWrites, condition_failed

log = structlog.get_logger(__name__)

# Above every character a key can continue with (see the module docstring).
_MAX_CHAR = "\U0010ffff"

# The index of the check whether the server answers gets on an index (_check_index_gets); its record is under
# notifications.INDEX_CHECK_PREFIX.
INDEX_CHECK_INDEX = "tc-server-index-get-check"


# The answers a put and a delete can have. Any other status (an unknown code, SESSION_DOES_NOT_EXIST on
# a delete) says nothing about what the server did: StoreUnavailableError, not a failed condition.
_PUT_STATUSES = frozenset({pb.OK, pb.UNEXPECTED_VERSION_ID})
_DELETE_STATUSES = frozenset({pb.OK, pb.KEY_NOT_FOUND, pb.UNEXPECTED_VERSION_ID})


def children_range(prefix: str) -> tuple[str, str]:
    """The ``[start, end)`` key range that holds every child of ``prefix`` (see module docstring)."""
    return prefix, prefix + _MAX_CHAR


def is_child(key: str, prefix: str) -> bool:
    return key.startswith(prefix) and "/" not in key[len(prefix):]


# How long close() waits for an Oxia that does not answer, its sessions' close and the notification drain
# together: a stop on such an Oxia (the drain of the requests in flight up to 8 s, the partitions' last
# tries 5 s, the leader records' deletes 3 s, this) must fit a pod's termination grace (30 s); a worker's
# supervisor may kill it at 12 s first, which loses nothing. A session that could not be closed expires by
# itself after the session timeout, its records with it.
CLOSE_WAIT_S = 3.0

class OxiaStore(StoreWrites):
    """A :class:`~tc_server.store.api.MetadataStore` session on one Oxia namespace. Open it with
    :func:`connect`.

    Every method raises :class:`StoreClosedError` after :meth:`close`, and
    :class:`StoreUnavailableError` when the cluster cannot be reached or does not answer within the
    request timeout (for writes the outcome is then unknown).
    """

    def __init__(
        self,
        address: str,
        *,
        namespace: str = "default",
        session_timeout_ms: int = 15_000,
        request_timeout_s: float = 10.0,
        client_identity: str | None = None,
    ) -> None:
        self.address = address
        self.namespace = namespace
        self._timeout = request_timeout_s
        self._pool = ConnectionPool()
        self._assignments = AssignmentWatcher(self._pool, address, namespace)
        self._sessions = SessionManager(
            self._pool, self._leader_of, session_timeout_ms=session_timeout_ms,
            request_timeout_s=request_timeout_s, client_identity=client_identity or default_client_identity())
        self._pump = NotificationPump(self._pool, lambda: self._assignments.current)
        self._probes = IndexProbes(lambda shard: self._pool.stub(self._leader_of(shard)), request_timeout_s)
        self._index_gets: bool | None = None  # whether the server answers gets on an index (_check_index_gets)
        self._index_check: asyncio.Future[None] | None = None  # that check, under way or failed
        self._writers: dict[int, ShardWriter] = {}
        # Background tasks held until done (the loop holds tasks only weakly): the closes of writers of shards whose
        # leader moved, the index check's delete.
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    async def _start(self) -> None:
        self._assignments.add_listener(self._on_assignments)
        self._assignments.start()
        shards = await self._assignments.wait_ready(self._timeout)
        self._pump.update(shards)
        # Knowing every shard's commit offset before returning is what lets notifications() promise
        # "changes after the call" (notifications.py).
        if not await self._pump.wait_ready(self._timeout):
            log.warning("oxia_notifications_not_ready", address=self.address)

    def _start_index_check(self) -> None:
        """Start the check of _check_index_gets unless it is under way (one for all who ask meanwhile)."""
        if self._index_check is None or self._index_check.done():
            self._index_check = asyncio.ensure_future(self._check_index_gets())
            # Its failure is raised to those who wait; if none is left, it is still not "never retrieved".
            self._index_check.add_done_callback(lambda check: check.cancelled() or check.exception())

    # -- routing and plumbing -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the Oxia store is closed")

    def _on_assignments(self, shards: ShardMap) -> None:
        self._pump.update(shards)
        for shard, writer in list(self._writers.items()):
            info = shards.get(shard)
            if info is None or info.leader != writer.leader:
                # The old leader will not take writes any more; what was sent to it has an unknown
                # outcome, and the next write opens a stream to the new leader.
                del self._writers[shard]
                # Keep a reference until it finishes (the loop holds tasks only weakly).
                task = asyncio.get_running_loop().create_task(writer.close(StoreUnavailableError(
                    f"shard {shard}: leader moved from {writer.leader}")))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    def _leader_of(self, shard: int) -> str:
        info = self._assignments.current.get(shard)
        if info is None:
            raise StoreUnavailableError(f"shard {shard} is not in the current assignments")
        return info.leader

    def ephemeral_lease(self, key: str, session_id: int | None = None) -> Callable[[], float] | None:
        """See :meth:`MetadataStore.ephemeral_lease`: the keep-alives of session ``session_id`` (by default
        the one this client holds now on ``key``'s shard). Once that session is gone or replaced, the lease
        is over (0.0)."""
        shard = self._route(key, None).shard
        held = self._sessions.current(shard) if session_id is None else session_id
        return functools.partial(self._sessions.alive_until, shard, held)

    def _route(self, key: str, partition_key: str | None) -> ShardInfo:
        info = self._assignments.current.shard_for(key, partition_key)
        if info is None:
            raise StoreUnavailableError(f"no shard covers the hash of {partition_key or key!r}")
        return info

    def _shards(self, partition_key: str | None) -> list[ShardInfo]:
        if partition_key is not None:
            return [self._route(partition_key, partition_key)]
        return self._assignments.current.shards

    def _writer(self, shard: int) -> ShardWriter:
        """The writer of ``shard`` on its current leader. It takes the shard, not a routed
        :class:`ShardInfo`: one routed before an await (a session being created) may name a leader
        that has moved meanwhile, and a writer made for it would stay, since :meth:`_on_assignments`
        only drops writers that exist when the leader moves."""
        writer = self._writers.get(shard)
        if writer is None:
            if self._index_gets is None:
                # Started by the first write (a server's leader records), not by the first END_TXN: on a slow
                # Oxia its two writes, in line behind that decision's CAS, ran the first END_TXNs after a
                # start out of their request timeout. Not at connect: `tc-server export` writes nothing.
                self._start_index_check()
            writer = self._writers[shard] = ShardWriter(
                self._pool, shard=shard, leader=self._leader_of(shard), namespace=self.namespace,
                request_timeout_s=self._timeout, on_version=self._pump.note_own_version)
        return writer

    @property
    def writers(self) -> dict[int, ShardWriter]:
        """The shard writers (for tests and the benchmark's batch counters)."""
        return dict(self._writers)

    # -- MetadataStore ------------------------------------------------------------------------

    async def get(self, key: str, *, partition_key: str | None = None) -> Record | None:
        """The record at ``key``, or None."""
        self._check_open()
        info = self._route(key, partition_key)
        return await reads.get(self._pool.stub(info.leader), info.shard, key, self._timeout)

    async def _put_record(self, op: Put) -> Record | None:
        if op.ephemeral:  # carries its shard's session, which _send gets first
            self._check_open()
            (response,) = await self._send([op])
            assert isinstance(response, pb.PutResponse)
            return self._record(op, response) if response.status == pb.OK else None
        record: Record | None = await self._put_one(op, condition_raises=False, withdraw=True)
        return record

    def _start_put(self, op: Put) -> asyncio.Future[Record]:
        """See :meth:`StoreWrites._start_put` (:meth:`_put_one`: no task; NEW_TXN writes its header this way)."""
        return self._put_one(op, condition_raises=True)

    def _put_one(self, op: Put, condition_raises: bool, withdraw: bool = False) -> asyncio.Future[Any]:
        """One durable put, under way: a future the shard writer's answer resolves from a callback, with no
        task and no gather (each header write of the coordinator goes this way, issue 13). It gives the
        record, or for a failed condition :class:`BadVersionError` (``condition_raises``) or None, and
        fails as :meth:`_send` would. Bounded by the request timeout with one timer: an operation not
        sent by then is never sent; with ``withdraw`` (put(): its caller owns it) neither is one whose
        future was cancelled. Raises at once what cannot be sent (closed, no shard, not encodable)."""
        self._check_open()
        request = self._request(op)
        assert isinstance(request, pb.PutRequest)
        info = self._route(op.key, op.partition_key)
        sent = self._writer(info.shard).put(request)
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[Any] = loop.create_future()
        timer = loop.call_later(self._timeout, self._put_timed_out, outcome, sent)
        sent.add_done_callback(functools.partial(self._resolve_put, outcome, op, info, timer, condition_raises))
        if withdraw:
            outcome.add_done_callback(functools.partial(_withdraw_if_cancelled, sent))
        return outcome

    def _put_timed_out(self, outcome: asyncio.Future[Any], sent: asyncio.Future[Answer]) -> None:
        if not outcome.done():
            outcome.set_exception(StoreUnavailableError(f"write of 1 operation(s): no answer within {self._timeout}s"))
        sent.cancel()  # not sent yet: never sent (the writer skips it); sent: its outcome stays unknown

    def _resolve_put(self, outcome: asyncio.Future[Any], op: Put, info: ShardInfo, timer: asyncio.TimerHandle,
                     condition_raises: bool, sent: asyncio.Future[Answer]) -> None:
        timer.cancel()
        if outcome.done():  # timed out, or the caller stopped waiting (its outcome stays unknown)
            return
        try:
            response = self._checked(op, info, sent.exception() or sent.result(), {})
            assert isinstance(response, pb.PutResponse)  # the writer answers a put with its PutResponse
            if response.status == pb.OK:
                outcome.set_result(self._record(op, response))
            elif condition_raises:
                outcome.set_exception(condition_failed(op.key, op.expected_version))
            else:
                outcome.set_result(None)
        except asyncio.CancelledError:
            outcome.set_exception(StoreUnavailableError(f"write of {op.key!r} cancelled; its outcome is unknown"))
        except StoreError as exc:  # _checked's verdict, handed to whoever awaits the future
            outcome.set_exception(exc)
        except Exception as exc:  # noqa: BLE001 - never left pending: the timer is gone
            outcome.set_exception(StoreUnavailableError(f"put of {op.key!r}: {exc!r}; its outcome is unknown"))

    async def write_batch(self, ops: Sequence[Put | Delete]) -> list[WriteResult]:
        """Send every operation at once: operations of one shard submitted together travel in one
        ``WriteRequest`` (up to the batch limits). Raises :class:`InvalidOperationError` before
        sending anything if an operation is malformed."""
        self._check_open()
        for op in ops:
            if isinstance(op, Put):
                validate_put(op)
        if not ops:
            return []
        responses = await self._send(ops)
        results: list[WriteResult] = []
        for op, response in zip(ops, responses, strict=True):
            if isinstance(op, Put):
                assert isinstance(response, pb.PutResponse)
                if response.status == pb.OK:
                    record = self._record(op, response)
                    results.append(WriteResult(Outcome.OK, record.key, record.version))
                else:  # UNEXPECTED_VERSION_ID: _send raised for any other status
                    results.append(WriteResult(Outcome.BAD_VERSION, op.key))
            elif response.status == pb.OK:
                results.append(WriteResult(Outcome.OK, op.key))
            elif response.status == pb.KEY_NOT_FOUND:
                results.append(WriteResult(Outcome.NOT_FOUND, op.key))
            else:  # UNEXPECTED_VERSION_ID
                results.append(WriteResult(Outcome.BAD_VERSION, op.key))
        return results

    async def _send(self, ops: Sequence[Put | Delete]) -> list[pb.PutResponse | pb.DeleteResponse]:
        """Encode, route, submit all (one event-loop step, so they batch together), then wait for all.

        Raises :class:`StoreUnavailableError` if any of them failed, timed out or was answered with
        a status other than those in ``_PUT_STATUSES`` / ``_DELETE_STATUSES`` (the others' outcomes
        are then reported through that error only: unknown)."""
        # Every request is encoded before anything is queued: one that cannot be would otherwise
        # leave the operations before it sent.
        requests = [self._request(op) for op in ops]
        routed = [(op, self._route(op.key, op.partition_key)) for op in ops]
        # Sessions first, so that no await separates the submissions below. They are per shard, but
        # only an ephemeral put carries one: a durable put with a session id would be ephemeral too.
        sessions: dict[int, int] = {}
        for (op, info), request in zip(routed, requests, strict=True):
            if isinstance(op, Put) and op.ephemeral and isinstance(request, pb.PutRequest):
                if info.shard not in sessions:
                    sessions[info.shard] = await self._sessions.session_for(info.shard)
                request.session_id = sessions[info.shard]
                request.client_identity = self._sessions.client_identity
        self._check_open()
        # Every writer before any submission: a shard gone meanwhile (split) fails the whole call.
        writers = [self._writer(info.shard) for _, info in routed]
        futures = [writer.put(request) if isinstance(request, pb.PutRequest) else writer.delete(request)
                   for writer, request in zip(writers, requests, strict=True)]
        try:
            async with asyncio.timeout(self._timeout):
                done = await asyncio.gather(*futures, return_exceptions=True)
        except TimeoutError:
            raise StoreUnavailableError(f"write of {len(ops)} operation(s): no answer within "
                                        f"{self._timeout}s") from None
        return [self._checked(op, info, result, sessions) for (op, info), result in zip(routed, done, strict=True)]

    def _checked(self, op: Put | Delete, info: ShardInfo, result: object,
                 sessions: dict[int, int]) -> pb.PutResponse | pb.DeleteResponse:
        """The answer of one operation of :meth:`_send` or :meth:`_put_one`, or the exception it means
        (see :meth:`_send`). ``sessions``: the session id each ephemeral put's shard was sent with."""
        if isinstance(result, StoreError):
            # An exception of its own per operation: the writer fails a whole batch with one object, which
            # raised in many places would collect every one of their tracebacks.
            raise (StoreClosedError if isinstance(result, StoreClosedError) else StoreUnavailableError)(str(result))
        if isinstance(result, BaseException):
            raise StoreUnavailableError(f"write failed: {result!r}") from result
        assert isinstance(result, pb.PutResponse | pb.DeleteResponse)
        if isinstance(result, pb.PutResponse) and result.status == pb.SESSION_DOES_NOT_EXIST:
            self._sessions.forget(info.shard, sessions.get(info.shard, -1))
            raise StoreUnavailableError(f"shard {info.shard}: the session expired; retry")
        if result.status not in (_PUT_STATUSES if isinstance(op, Put) else _DELETE_STATUSES):
            raise StoreUnavailableError(
                f"shard {info.shard}: {type(op).__name__.lower()} of {op.key!r} answered "
                f"{reads.status_name(result.status)}; its outcome is unknown")
        if isinstance(op, Put) and op.sequential and result.status == pb.OK and not result.HasField("key"):
            # Applied, but under a key only the server knows: the prefix is not the record's key.
            raise StoreUnavailableError(
                f"shard {info.shard}: sequential put under {op.key!r} was answered without its key")
        if isinstance(op, Put) and op.ephemeral and isinstance(result, pb.PutResponse) and result.status == pb.OK:
            # So that close() can wait for the notification of its deletion (the Protocol: a
            # closing stream ends after it). A later delete or durable put ends that by its own
            # notification, like anyone else's.
            key = result.key if result.HasField("key") else op.key
            self._pump.note_own_ephemeral(info.shard, key, result.version.version_id)
        return result

    @staticmethod
    def _request(op: Put | Delete) -> pb.PutRequest | pb.DeleteRequest:
        """The request of ``op``, without a session (:meth:`_send` adds it). Raises
        :class:`InvalidOperationError` for what protobuf cannot encode (a value that is not bytes,
        a key with a lone surrogate)."""
        try:
            if isinstance(op, Delete):
                delete = pb.DeleteRequest(key=op.key)
                if op.expected_version is not None:
                    delete.expected_version_id = op.expected_version
                if op.partition_key is not None:
                    delete.partition_key = op.partition_key
                return delete
            put = pb.PutRequest(key=op.key, value=op.value)
            if op.expected_version is not None:
                put.expected_version_id = op.expected_version
            if op.partition_key is not None:
                put.partition_key = op.partition_key
            if op.sequential:
                put.sequence_key_delta.append(1)
            for name, secondary in op.secondary_indexes.items():
                put.secondary_indexes.add(index_name=name, secondary_key=secondary)
            return put
        except (TypeError, ValueError) as e:
            raise InvalidOperationError(f"{type(op).__name__} of {op.key!r} cannot be encoded: {e}") from e

    @staticmethod
    def _record(op: Put, response: pb.PutResponse) -> Record:
        return reads.versioned_record(response.key if response.HasField("key") else op.key, bytes(op.value),
                                      response.version)

    def scan_prefix(self, prefix: str, *, partition_key: str | None = None) -> AsyncIterator[Record]:
        """The children of ``prefix`` (see the module docstring for the key range). With a partition
        key: one shard, in key order; without: every shard, one after the other."""
        self._check_open()
        return self._scan(*children_range(prefix), partition_key, None, prefix)

    def scan_index(
        self,
        index_name: str,
        start_inclusive: str,
        end_exclusive: str,
        *,
        partition_key: str | None = None,
    ) -> AsyncIterator[Record]:
        """Records by secondary key in ``[start_inclusive, end_exclusive)``. Oxia's indexes are per
        shard (docs/oxia-client.md), so without a partition key every shard is scanned."""
        self._check_open()
        return self._scan(start_inclusive, end_exclusive, partition_key, index_name, None)

    async def _scan(self, start: str, end: str, partition_key: str | None, index_name: str | None,
                    children_of: str | None) -> AsyncIterator[Record]:
        for info in self._shards(partition_key):
            self._check_open()
            async for record in reads.range_scan(self._pool.stub(info.leader), info.shard, start, end,
                                                 self._timeout, secondary_index_name=index_name):
                if children_of is None or is_child(record.key, children_of):
                    yield record

    async def index_has(self, index_name: str, secondary_key: str, *, partition_key: str | None = None) -> bool:
        """See :meth:`MetadataStore.index_has`: a get on the index of the shard (every shard, one after the
        other, without a partition key), sent with the other probes of this turn (index_probes.py); a
        scan on a server that does not answer gets on an index (:meth:`_check_index_gets`)."""
        self._check_open()
        if self._index_gets is None:
            # The check started with the store, or again after it failed. Those who ask meanwhile go on
            # together, so their probes share a Read.
            self._start_index_check()
            assert self._index_check is not None
            await asyncio.shield(self._index_check)
        if not self._index_gets:
            return await index_has_by_scan(self, index_name, secondary_key, partition_key=partition_key)
        for info in self._shards(partition_key):
            if await self._probes.has(info.shard, index_name, secondary_key):
                return True
        return False

    async def _check_index_gets(self) -> None:
        """Learn whether the server answers a get on a secondary index: Oxia does from v0.13. An older server
        takes it for a get of the key itself and answers KEY_NOT_FOUND, so index_has would say "no" to
        everything and Pulsar 5's participants would never hear a decision. Asked once per store (a
        failure is raised, like a failed scan, and asked again next time): a record of this client's own
        with an entry in an index of its own is written, looked up through that index, and deleted. Its
        secondary key is no record's key: an older server looks that up as a key, and finds nothing."""
        key = f"{INDEX_CHECK_PREFIX}{self._sessions.client_identity}"
        secondary = f"index-get-check-{self._sessions.client_identity}"
        await self.put(key, b"", partition_key=key, secondary_indexes={INDEX_CHECK_INDEX: secondary})
        try:
            found = await self._probes.has(self._route(key, key).shard, INDEX_CHECK_INDEX, secondary)
        finally:
            # Not waited for: the answer is known, and a slow delete held up those who wait for it.
            cleanup = asyncio.get_running_loop().create_task(self._delete_quietly(key))
            self._closing.add(cleanup)
            cleanup.add_done_callback(self._closing.discard)
        if not found:
            log.warning("oxia_index_gets_unsupported", address=self.address,
                        detail="the server does not answer gets on a secondary index (Oxia before v0.13): "
                               "END_TXN scans idx:ops-by-txn instead, one call each")
        self._index_gets = found

    async def _delete_quietly(self, key: str) -> None:
        """Delete the index check's record; one left behind (the store closed, Oxia unreachable) is a
        stray empty record under INDEX_CHECK_PREFIX, logged, and nothing reads it."""
        try:
            await self.delete(key, partition_key=key)
        except StoreError as exc:
            log.info("oxia_index_check_record_left", key=key, error=str(exc))

    @property
    def index_gets_known(self) -> bool:
        """Whether the check of _check_index_gets is done (it starts with the store's first write)."""
        return self._index_gets is not None

    def notifications(self, key_prefix: str = "") -> OxiaSubscription:
        """Changes committed after the call on every shard to keys starting with ``key_prefix``
        (notifications.py says how exactly)."""
        self._check_open()
        return self._pump.subscribe(key_prefix)

    async def close(self) -> None:
        """Close the sessions (Oxia deletes their ephemeral records), deliver the notifications of
        this session's own writes and of those deletes to open subscriptions (the two within
        CLOSE_WAIT_S), then end the subscriptions and release every connection. Never raises."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_WAIT_S
        await self._sessions.close(CLOSE_WAIT_S)
        if self._pump.has_subscribers:
            await self._pump.drain(max(0.0, deadline - loop.time()))
        for writer in list(self._writers.values()):
            await writer.close()
        self._writers.clear()
        await self._probes.close()
        await self._pump.close()
        await self._assignments.close()
        await self._pool.close()


async def connect(
    address: str,
    *,
    namespace: str = "default",
    session_timeout_ms: int = 15_000,
    request_timeout_s: float = 10.0,
) -> OxiaStore:
    """Open a store session on the Oxia cluster reachable at ``address`` (``host:port`` of any
    server; it tells where each shard's leader is).

    Raises :class:`StoreUnavailableError` when no shard assignment for ``namespace`` arrives within
    ``request_timeout_s``, :class:`ValueError` for a session timeout Oxia would refuse (outside
    [2 s, 5 min])."""
    store = OxiaStore(address, namespace=namespace, session_timeout_ms=session_timeout_ms,
                      request_timeout_s=request_timeout_s)
    try:
        await store._start()
    except BaseException:
        await store.close()
        raise
    return store


def _withdraw_if_cancelled(sent: asyncio.Future[Answer], outcome: asyncio.Future[Any]) -> None:
    """put()'s caller stopped waiting (its request's deadline): an operation not sent yet is never sent."""
    if outcome.cancelled():
        sent.cancel()
