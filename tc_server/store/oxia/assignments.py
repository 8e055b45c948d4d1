"""The shard -> leader map, kept current by Oxia's ``GetShardAssignments`` stream (docs/oxia-client.md).

Each message on the stream is complete for the namespace (a split arrives as one message with all
the new shards), so every message simply replaces the map. The stream is re-opened with backoff
whenever it ends; the last map stays in use meanwhile, which is what lets requests keep going to
leaders that are still up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import structlog

from tc_server._proto import oxia_client_pb2 as pb
from tc_server.backoff import Backoff
from tc_server.store.api import StoreUnavailableError
from tc_server.store.oxia.connections import ConnectionPool
from tc_server.store.oxia.routing import ShardInfo, ShardMap

log = structlog.get_logger(__name__)

Listener = Callable[[ShardMap], None]


def parse_assignments(message: pb.ShardAssignments, namespace: str) -> ShardMap | None:
    """The namespace's map from one stream message, or None when the message does not name it.

    Raises :class:`ValueError` when the server uses a router other than XXH3 or the ranges overlap.
    """
    if namespace not in message.namespaces:
        return None
    ns = message.namespaces[namespace]
    if ns.shard_key_router not in (pb.UNKNOWN, pb.XXHASH3):
        raise ValueError(f"unsupported shard key router {ns.shard_key_router}")
    return ShardMap(
        ShardInfo(
            shard=a.shard,
            leader=a.leader,
            min_hash=a.int32_hash_range.min_hash_inclusive,
            max_hash=a.int32_hash_range.max_hash_inclusive,
        )
        for a in ns.assignments
    )


class AssignmentWatcher:
    """Follows the assignments stream of one namespace from a bootstrap address."""

    def __init__(self, pool: ConnectionPool, address: str, namespace: str) -> None:
        self._pool = pool
        self._address = address
        self._namespace = namespace
        self._current: ShardMap | None = None
        self._ready = asyncio.Event()
        self._listeners: list[Listener] = []
        self._task: asyncio.Task[None] | None = None
        self._last_error: str | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="oxia-assignments")

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(new_map)`` (synchronously, on the loop) whenever the map changes."""
        self._listeners.append(listener)

    @property
    def current(self) -> ShardMap:
        """The latest map. Raises :class:`StoreUnavailableError` if none has arrived yet."""
        if self._current is None:
            raise StoreUnavailableError(
                f"no shard assignments for namespace {self._namespace!r} from {self._address}"
                + (f" ({self._last_error})" if self._last_error else ""))
        return self._current

    async def wait_ready(self, timeout_s: float) -> ShardMap:
        """Wait for the first map. Raises :class:`StoreUnavailableError` after ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._ready.wait()
        except TimeoutError:
            raise StoreUnavailableError(
                f"no shard assignments for namespace {self._namespace!r} from {self._address} "
                f"within {timeout_s}s" + (f" ({self._last_error})" if self._last_error else "")
            ) from None
        return self.current

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                stub = self._pool.stub(self._address)
                call = stub.GetShardAssignments(pb.ShardAssignmentsRequest(namespace=self._namespace))
                async for message in call:
                    new = parse_assignments(message, self._namespace)
                    if new is None:
                        self._last_error = f"namespace {self._namespace!r} not in the assignments"
                        continue
                    backoff.reset()
                    self._install(new)
                self._last_error = "assignments stream ended"
            except grpc.aio.AioRpcError as e:
                self._last_error = f"{e.code().name}: {e.details()}"
            except ValueError as e:
                self._last_error = str(e)
            log.info("oxia_assignments_reconnect", address=self._address, error=self._last_error)
            await asyncio.sleep(backoff.next_delay())

    def _install(self, new: ShardMap) -> None:
        if new == self._current:
            return
        log.info("oxia_assignments", namespace=self._namespace,
                 shards={s.shard: s.leader for s in new.shards})
        self._current = new
        self._ready.set()
        for listener in self._listeners:
            listener(new)
