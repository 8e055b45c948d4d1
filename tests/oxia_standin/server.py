"""STAND-IN Oxia server: a Python imitation of Oxia's client API, for tests only.

This is NOT Oxia. It exists because the real server cannot be installed on the machines these tests
were written on (the Go module proxy refuses every version of github.com/oxia-db/oxia), and a mock
is used "only where the real thing cannot run here". It implements the subset of the client API in
protocol/oxia_client.proto that tc_server's client uses, with the semantics docs/oxia-client.md records
for the real server; what it cannot tell us is whether those notes are right. Everything proven
against it still has to be proven against a real ``oxia standalone``.

Semantics imitated (docs/oxia-client.md, "Oxia facts the client relies on"):

* ``N`` shards with ids ``0..N-1`` splitting ``[0, 2^32-1]`` evenly; every leader is this server's
  address. Like real Oxia it checks no placement: a write sent with ``shard-id: 2`` lands on shard 2.
* One commit offset counter per shard (one per batch), and a version id counter of its own (one per
  applied put, oxiad's ``versionIdTracker.Add(1)``: a batch of n puts takes one offset and n version
  ids, a delete an offset and none); ``modifications_count`` starts at 0.
* A ``WriteRequest`` is one batch: puts, then deletes, each with its own status (CAS failures do not
  abort the batch). Request-level errors (a sequence put without partition key, with an expected
  version, with a first delta of 0) end the whole stream, as do missing ``shard-id``/``namespace``
  metadata on ``WriteStream``.
* Sequence keys ``prefix-%020d`` (one delta per put only: the client never sends more).
* Secondary indexes are per-record entries ``__oxia/idx/<name>/<secondary>\\x01<escaped primary>``
  in the record's shard; index scans compare those keys. A get on an index (``EQUAL`` only, as
  tc-server sends it) takes the first entry at or after the key, as oxiad does (``Shard.index_get``).
* Keys sort hierarchically (``CompareWithSlash``: segment by segment, a key with no further ``/``
  before any deeper one).
* One notification batch per committed write batch with at least one visible change; at most one
  entry per key (the last change wins), like Oxia's map-shaped batches; sorted by key as newer
  servers do (v0.14 sends them in Go map order, i.e. unordered). Without a
  start offset a subscriber first gets an empty batch at the current commit offset.
* Sessions: timeout within [2 s, 5 min]; expiry or ``CloseSession`` deletes the session's records
  in one batch; a non-ephemeral put makes an ephemeral record persistent.
* ``GetSequenceUpdates`` (not in protocol/oxia_client.proto, coded by hand): the highest sequence key
  of a prefix now and after each change; Pulsar 5's transaction participants wait on it.

Test hooks: request counters (writes, reads), ``hold_writes``/``release_writes`` (keep write batches in flight),
``break_write_streams`` (kill every write stream), ``stop``/``start`` on the same port (data kept,
as a durable server restart would).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import itertools
import re
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from tc_server._proto import oxia_client_pb2 as pb
from tc_server._proto import oxia_client_pb2_grpc as pb_grpc

HASH_MAX = 0xFFFF_FFFF
SEQUENCE_FORMAT = "{}-{:020d}"
INDEX_PREFIX = "__oxia/idx/"
# oxiad's secondaryIdxFormatRegex: an index entry's secondary key and escaped primary key.
INDEX_ENTRY = re.compile("^" + INDEX_PREFIX + "[^/]+/([^\x01]+)\x01(.+)$")
SCAN_CHUNK = 100
MIN_SESSION_MS, MAX_SESSION_MS = 2_000, 300_000
NOTIFICATION_RETENTION = 100_000
# gRPC's C core cancels calls that arrive while more than ``grpc.server.max_pending_requests``
# (default 1000) wait for the Python handler loop to pick them up: a burst of reads from one busy
# client ended with CANCELLED here, where the real (Go) server just queues them.
SERVER_OPTIONS = [("grpc.server.max_pending_requests", 1_000_000),
                  ("grpc.server.max_pending_requests_hard_limit", 1_000_000)]


def compare_with_slash(a: str, b: str) -> int:
    """Oxia's hierarchical key order (segment-wise CompareWithSlash)."""
    while a and b:
        ia, ib = a.find("/"), b.find("/")
        if ia < 0 and ib < 0:
            return (a > b) - (a < b)
        if ia < 0:
            return -1
        if ib < 0:
            return 1
        sa, sb = a[:ia], b[:ib]
        if sa != sb:
            return (sa > sb) - (sa < sb)
        a, b = a[ia + 1:], b[ib + 1:]
    return (len(a) > len(b)) - (len(a) < len(b))


hierarchical = functools.cmp_to_key(compare_with_slash)


def in_range(key: str, start: str, end: str) -> bool:
    return compare_with_slash(start, key) <= 0 and compare_with_slash(key, end) < 0


def path_escape(key: str) -> str:
    """Go's ``url.PathEscape`` (``shouldEscape`` in mode ``encodePathSegment``): letters, digits,
    ``-_.~`` and the reserved ``$&+:=@`` stay; ``/;,?`` and everything else (``!'()*`` and space
    too) become ``%XX`` of the UTF-8 bytes, upper-case hex."""
    return urllib.parse.quote(key, safe="-._~$&+:=@")


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class Entry:
    value: bytes
    version_id: int
    modifications: int
    created: int
    modified: int
    session_id: int | None
    indexes: list[tuple[str, str]]

    def version(self) -> pb.Version:
        v = pb.Version(version_id=self.version_id, modifications_count=self.modifications,
                       created_timestamp=self.created, modified_timestamp=self.modified)
        if self.session_id is not None:
            v.session_id = self.session_id
        return v


@dataclass(slots=True)
class Session:
    shard: int
    timeout_ms: int
    identity: str
    last_beat: float


class RequestError(Exception):
    """A request-level error: ends the stream, as in Oxia."""


def index_entry_key(name: str, secondary: str, primary: str) -> str:
    return f"{INDEX_PREFIX}{name}/{secondary}\x01{path_escape(primary)}"


@dataclass
class Shard:
    id: int
    min_hash: int
    max_hash: int
    kv: dict[str, Entry] = field(default_factory=dict)
    # Secondary index entries, kept in hierarchical order so that an index scan is a bisection
    # (a scan over every record made the coordinator's per-END_TXN index query O(records)).
    index_keys: list[str] = field(default_factory=list)
    index_primary: dict[str, str] = field(default_factory=dict)
    commit_offset: int = -1
    last_version_id: int = -1  # oxiad's last-version-id: the first put gets 0
    batches: list[pb.NotificationBatch] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def _check_version(self, existing: Entry | None, expected: int | None) -> bool:
        if expected is None:
            return True
        if existing is None:
            return expected == -1
        return existing.version_id == expected

    def _set(self, key: str, entry: Entry | None) -> None:
        """Replace (or with None delete) the record at ``key``, keeping the index entries in step."""
        old = self.kv.pop(key, None)
        for name, secondary in old.indexes if old else ():
            internal = index_entry_key(name, secondary, key)
            i = bisect.bisect_left(self.index_keys, hierarchical(internal), key=hierarchical)
            if i < len(self.index_keys) and self.index_keys[i] == internal:
                del self.index_keys[i]
                del self.index_primary[internal]
        if entry is None:
            return
        self.kv[key] = entry
        for name, secondary in entry.indexes:
            internal = index_entry_key(name, secondary, key)
            if internal not in self.index_primary:
                bisect.insort(self.index_keys, internal, key=hierarchical)
                self.index_primary[internal] = key

    def _highest_sequence(self, prefix: str) -> int:
        head = prefix + "-"
        best = 0
        for key in self.kv:
            digits = key[len(head):]
            if key.startswith(head) and len(digits) == 20 and digits.isdigit():
                best = max(best, int(digits))
        return best

    def apply(self, request: pb.WriteRequest, sessions: dict[int, Session]) -> pb.WriteResponse:
        for put in request.puts:
            if put.sequence_key_delta:
                if not put.HasField("partition_key"):
                    raise RequestError("sequence keys require a partition key")
                if put.HasField("expected_version_id"):
                    raise RequestError("sequence keys cannot have an expected version")
                if put.sequence_key_delta[0] == 0 or len(put.sequence_key_delta) != 1:
                    raise RequestError("the stand-in takes exactly one non-zero sequence delta")
        offset = self.commit_offset + 1
        now = now_ms()
        notes: dict[str, pb.Notification] = {}
        response = pb.WriteResponse()
        for put in request.puts:
            result = response.puts.add()
            if put.HasField("session_id") and put.session_id not in sessions:
                result.status = pb.SESSION_DOES_NOT_EXIST
                continue
            key = put.key
            if put.sequence_key_delta:
                number = self._highest_sequence(put.key) + put.sequence_key_delta[0]
                key = SEQUENCE_FORMAT.format(put.key, number)
                result.key = key
            existing = self.kv.get(key)
            expected = put.expected_version_id if put.HasField("expected_version_id") else None
            if not self._check_version(existing, expected):
                result.status = pb.UNEXPECTED_VERSION_ID
                continue
            self.last_version_id += 1
            entry = Entry(
                value=put.value, version_id=self.last_version_id,
                modifications=existing.modifications + 1 if existing else 0,
                created=existing.created if existing else now, modified=now,
                session_id=put.session_id if put.HasField("session_id") else None,
                indexes=[(i.index_name, i.secondary_key) for i in put.secondary_indexes])
            self._set(key, entry)
            result.status = pb.OK
            result.version.CopyFrom(entry.version())
            notes[key] = pb.Notification(
                type=pb.KEY_MODIFIED if entry.modifications else pb.KEY_CREATED, version_id=entry.version_id)
        for delete in request.deletes:
            deleted = response.deletes.add()
            existing = self.kv.get(delete.key)
            expected = delete.expected_version_id if delete.HasField("expected_version_id") else None
            if not self._check_version(existing, expected):
                deleted.status = pb.UNEXPECTED_VERSION_ID
            elif existing is None:
                deleted.status = pb.KEY_NOT_FOUND
            else:
                self._set(delete.key, None)
                deleted.status = pb.OK
                notes[delete.key] = pb.Notification(type=pb.KEY_DELETED)
        self._commit(offset, notes)
        return response

    def delete_session_records(self, session_id: int) -> None:
        owned = sorted(k for k, e in self.kv.items() if e.session_id == session_id)
        if not owned:
            return
        for key in owned:
            self._set(key, None)
        self._commit(self.commit_offset + 1, {k: pb.Notification(type=pb.KEY_DELETED) for k in owned})

    def _commit(self, offset: int, notes: dict[str, pb.Notification]) -> None:
        self.commit_offset = offset
        if notes:
            batch = pb.NotificationBatch(shard=self.id, offset=offset, timestamp=now_ms())
            for key in sorted(notes):
                batch.notifications.add(key=key, value=notes[key])
            self.batches.append(batch)
            del self.batches[:-NOTIFICATION_RETENTION]
        asyncio.get_running_loop().create_task(self._wake())

    async def _wake(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def index_get(self, index: str, secondary: str) -> tuple[str, Entry] | None:
        """oxiad's secondaryIndexGet with EQUAL: the first index entry at or after ``<index>/<secondary>``
        (of every index: oxiad's iterator does not stop at the index's end), answered only if it parses
        as an index entry whose secondary key compares equal to ``secondary``."""
        search = f"{INDEX_PREFIX}{index}/{secondary}"
        i = bisect.bisect_left(self.index_keys, hierarchical(search), key=hierarchical)
        if i == len(self.index_keys):
            return None
        found = INDEX_ENTRY.match(self.index_keys[i])
        if found is None or compare_with_slash(secondary, found.group(1)) != 0:
            return None
        primary = self.index_primary[self.index_keys[i]]
        return primary, self.kv[primary]

    def scan(self, start: str, end: str, index: str | None) -> list[tuple[str, Entry]]:
        if index is None:
            hits = [(k, e) for k, e in self.kv.items() if in_range(k, start, end)]
            return sorted(hits, key=lambda h: hierarchical(h[0]))
        low, high = f"{INDEX_PREFIX}{index}/{start}", f"{INDEX_PREFIX}{index}/{end}"
        found: list[tuple[str, Entry]] = []
        i = bisect.bisect_left(self.index_keys, hierarchical(low), key=hierarchical)
        while i < len(self.index_keys) and compare_with_slash(self.index_keys[i], high) < 0:
            key = self.index_primary[self.index_keys[i]]
            found.append((key, self.kv[key]))
            i += 1
        return found


class StandinOxia:
    """The stand-in server (see the module docstring). ``await start()``, use ``address``,
    ``await stop()``; ``start()`` again comes back on the same port with the same data."""

    def __init__(self, shards: int = 1, namespace: str = "default", index_gets: bool = True) -> None:
        self.namespace = namespace
        # False: a get naming a secondary index is taken for a get of the key itself, as by servers
        # before v0.13, whose GetRequest had no secondary_index_name (field 4 unknown to them).
        self.index_gets = index_gets
        span = (HASH_MAX + 1) // shards
        self.shards = [
            Shard(i, i * span, HASH_MAX if i == shards - 1 else (i + 1) * span - 1) for i in range(shards)]
        self.sessions: dict[int, Session] = {}
        self._session_ids = itertools.count(1)
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._expiry: asyncio.Task[None] | None = None
        # Test hooks and counters.
        self.write_requests = 0
        self.read_requests = 0  # Read calls (point and index gets)
        self.write_ops = 0
        self.write_streams_opened = 0
        self.notification_requests: list[pb.NotificationsRequest] = []
        self._writes_released = asyncio.Event()
        self._writes_released.set()
        self._kill_streams = asyncio.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server(options=SERVER_OPTIONS)
        pb_grpc.add_OxiaClientServicer_to_server(_Servicer(self), server)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(OXIA_SERVICE, {
            "GetSequenceUpdates": grpc.unary_stream_rpc_method_handler(
                functools.partial(get_sequence_updates, self))}),))
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        self._server = server
        for session in self.sessions.values():
            session.last_beat = time.monotonic()
        self._expiry = asyncio.get_running_loop().create_task(self._expire_sessions())

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    def hold_writes(self) -> None:
        """Keep received write batches unanswered (in flight) until :meth:`release_writes`."""
        self._writes_released.clear()

    def release_writes(self) -> None:
        self._writes_released.set()

    def break_write_streams(self) -> None:
        """End every open WriteStream with UNAVAILABLE (the batches they hold are not applied)."""
        self._kill_streams.set()
        self._kill_streams = asyncio.Event()

    def shard(self, shard_id: int) -> Shard:
        return self.shards[shard_id]

    def visible_keys(self) -> set[str]:
        return {k for s in self.shards for k in s.kv}

    async def _expire_sessions(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for session_id, session in list(self.sessions.items()):
                if now - session.last_beat > session.timeout_ms / 1000:
                    self.close_session(session_id)

    def close_session(self, session_id: int) -> None:
        session = self.sessions.pop(session_id)
        self.shards[session.shard].delete_session_records(session_id)


class _Servicer(pb_grpc.OxiaClientServicer):
    def __init__(self, oxia: StandinOxia) -> None:
        self.oxia = oxia

    def _shard(self, shard_id: int) -> Shard:
        if not 0 <= shard_id < len(self.oxia.shards):
            raise RequestError(f"no shard {shard_id}")
        return self.oxia.shards[shard_id]

    async def GetShardAssignments(self, request, context):
        if request.namespace != self.oxia.namespace:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"namespace {request.namespace!r} not found")
        message = pb.ShardAssignments()
        ns = message.namespaces[self.oxia.namespace]
        ns.shard_key_router = pb.XXHASH3
        for shard in self.oxia.shards:
            a = ns.assignments.add(shard=shard.id, leader=self.oxia.address)
            a.int32_hash_range.min_hash_inclusive = shard.min_hash
            a.int32_hash_range.max_hash_inclusive = shard.max_hash
        yield message
        await asyncio.Event().wait()  # the stream stays open, as the real one does

    async def WriteStream(self, request_iterator, context):
        metadata = dict(context.invocation_metadata())
        if "shard-id" not in metadata or "namespace" not in metadata:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing shard-id or namespace metadata")
        if metadata["namespace"] != self.oxia.namespace:
            await context.abort(grpc.StatusCode.NOT_FOUND, "namespace not found")
        try:
            shard = self._shard(int(metadata["shard-id"]))
        except (ValueError, RequestError) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        self.oxia.write_streams_opened += 1
        kill = self.oxia._kill_streams
        requests = aiter(request_iterator)
        while True:
            killed = asyncio.ensure_future(kill.wait())
            received = asyncio.ensure_future(anext(requests, None))
            await asyncio.wait([killed, received], return_when=asyncio.FIRST_COMPLETED)
            if killed.done():
                received.cancel()
                await context.abort(grpc.StatusCode.UNAVAILABLE, "stand-in: write stream broken")
            killed.cancel()
            request = received.result()
            if request is None:
                return
            self.oxia.write_requests += 1
            self.oxia.write_ops += len(request.puts) + len(request.deletes)
            released = asyncio.ensure_future(self.oxia._writes_released.wait())
            killed = asyncio.ensure_future(kill.wait())
            await asyncio.wait([released, killed], return_when=asyncio.FIRST_COMPLETED)
            released.cancel()
            if killed.done():
                await context.abort(grpc.StatusCode.UNAVAILABLE, "stand-in: write stream broken")
            killed.cancel()
            try:
                yield shard.apply(request, self.oxia.sessions)
            except RequestError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    async def Read(self, request, context):
        self.oxia.read_requests += 1
        shard = self.oxia.shards[request.shard]
        response = pb.ReadResponse()
        for get in request.gets:
            result = response.gets.add()
            if get.comparison_type != pb.EQUAL:
                result.status = pb.KEY_NOT_FOUND
                continue
            if get.HasField("secondary_index_name") and self.oxia.index_gets:
                hit = shard.index_get(get.secondary_index_name, get.key)
                if hit is None:
                    result.status = pb.KEY_NOT_FOUND
                    continue
                key, entry = hit
                result.key, result.secondary_index_key = key, get.key
            else:  # also a get on an index when imitating a server before v0.13 (index_gets=False)
                entry = shard.kv.get(get.key)
                if entry is None:
                    result.status = pb.KEY_NOT_FOUND
                    continue
            result.status = pb.OK
            result.version.CopyFrom(entry.version())
            if get.include_value:
                result.value = entry.value
        yield response

    async def List(self, request, context):
        shard = self.oxia.shards[request.shard]
        index = request.secondary_index_name if request.HasField("secondary_index_name") else None
        keys = [k for k, _ in shard.scan(request.start_inclusive, request.end_exclusive, index)]
        for i in range(0, len(keys), SCAN_CHUNK):
            yield pb.ListResponse(keys=keys[i:i + SCAN_CHUNK])

    async def RangeScan(self, request, context):
        shard = self.oxia.shards[request.shard]
        index = request.secondary_index_name if request.HasField("secondary_index_name") else None
        hits = shard.scan(request.start_inclusive, request.end_exclusive, index)
        for i in range(0, len(hits), SCAN_CHUNK):
            response = pb.RangeScanResponse()
            for key, entry in hits[i:i + SCAN_CHUNK]:
                response.records.add(status=pb.OK, key=key, value=entry.value, version=entry.version())
            yield response

    async def GetNotifications(self, request, context):
        self.oxia.notification_requests.append(request)
        shard = self.oxia.shards[request.shard]
        if request.HasField("start_offset_exclusive"):
            last = request.start_offset_exclusive
        else:
            last = shard.commit_offset
            yield pb.NotificationBatch(shard=shard.id, offset=last, timestamp=now_ms())
        while True:
            # Batches are in offset order: start after ``last`` instead of filtering all of them.
            pending = shard.batches[bisect.bisect_right(shard.batches, last, key=lambda b: b.offset):]
            for batch in pending:
                yield batch
                last = batch.offset
            async with shard.changed:
                if not shard.batches or shard.batches[-1].offset <= last:
                    await shard.changed.wait()

    async def CreateSession(self, request, context):
        self._shard(request.shard)
        if not MIN_SESSION_MS <= request.session_timeout_ms <= MAX_SESSION_MS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "invalid session timeout")
        session_id = next(self.oxia._session_ids)
        self.oxia.sessions[session_id] = Session(
            request.shard, request.session_timeout_ms, request.client_identity, time.monotonic())
        return pb.CreateSessionResponse(session_id=session_id)

    async def KeepAlive(self, request, context):
        session = self.oxia.sessions.get(request.session_id)
        if session is None or session.shard != request.shard:
            return await context.abort(grpc.StatusCode.NOT_FOUND, "session not found")  # raises
        session.last_beat = time.monotonic()
        return pb.KeepAliveResponse()

    async def CloseSession(self, request, context):
        session = self.oxia.sessions.get(request.session_id)
        if session is None or session.shard != request.shard:
            await context.abort(grpc.StatusCode.NOT_FOUND, "session not found")
        self.oxia.close_session(request.session_id)
        return pb.CloseSessionResponse()


OXIA_SERVICE = "io.streamnative.oxia.proto.OxiaClient"


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise RequestError("truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def decode_sequence_updates_request(data: bytes) -> tuple[int, str]:
    """GetSequenceUpdatesRequest {1: int64 shard, 2: string key}, decoded by hand (see get_sequence_updates)."""
    shard, key, at = 0, "", 0
    while at < len(data):
        tag, at = _varint(data, at)
        if tag & 7 == 0:
            value, at = _varint(data, at)
            shard = value if tag >> 3 == 1 else shard
        elif tag & 7 == 2:
            size, at = _varint(data, at)
            key = data[at:at + size].decode() if tag >> 3 == 2 else key
            at += size
        else:
            raise RequestError(f"unexpected wire type {tag & 7}")
    return shard, key


async def get_sequence_updates(oxia: StandinOxia, request: bytes, context: grpc.aio.ServicerContext
                               ) -> AsyncIterator[bytes]:
    """Oxia's GetSequenceUpdates: the highest sequence key ``<key>-%020d`` now (if any) and after every
    change. tc-server does not use it, so protocol/oxia_client.proto leaves it out and the messages are
    coded by hand; Pulsar 5's transaction participants wait on their event streams with it (Oxia
    client 0.8.0 SequenceUpdates), and without it a broker retries in a tight loop and never applies a
    decision. Response: GetSequenceUpdatesResponse {1: string highest_sequence_key}."""
    try:
        shard_id, key = decode_sequence_updates_request(request)
    except (RequestError, UnicodeDecodeError) as e:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"GetSequenceUpdatesRequest: {e}")
    if not 0 <= shard_id < len(oxia.shards) or not key:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no shard {shard_id} or no key")
    shard = oxia.shards[shard_id]
    sent = 0
    while True:
        async with shard.changed:
            while (highest := shard._highest_sequence(key)) == sent:
                await shard.changed.wait()
        sent = highest
        encoded = SEQUENCE_FORMAT.format(key, highest).encode()
        size = bytearray()
        n = len(encoded)
        while n >= 0x80:
            size.append((n & 0x7F) | 0x80)
            n >>= 7
        size.append(n)
        yield b"\x0a" + bytes(size) + encoded


@contextlib.asynccontextmanager
async def serve(shards: int = 1) -> AsyncIterator[StandinOxia]:
    """``async with serve(3) as oxia:`` runs a stand-in with 3 shards for the block."""
    oxia = StandinOxia(shards)
    await oxia.start()
    try:
        yield oxia
    finally:
        await oxia.stop()
