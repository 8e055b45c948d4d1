"""Whether an index holds a secondary key: the probes of one event-loop turn share one ``Read`` per shard.

Every END_TXN asks whether Pulsar 5's participants wrote op records for its txn (``idx:ops-by-txn``,
docs/participants.md); almost always none did. Asked as a ``RangeScan``, that was one gRPC call per
END_TXN, about two thirds of tc-server's CPU per transaction on Oxia (issue 13: ~750-1,000 us per pair
with it, ~260 without; docs/performance.md). Oxia answers the same question with a get on the index
(``GetRequest.secondary_index_name`` with ``EQUAL``: oxiad's ``secondaryIndexGet``, since v0.13, takes the
first index entry at or after the key and answers it only if its secondary key is the key), and its
``Read`` takes many gets at once. So the probes asked during one turn of the event loop wait for the
turn to end and go to each shard in one call (docs/oxia-client.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tc_server._proto import oxia_client_pb2 as pb
from tc_server._proto import oxia_client_pb2_grpc as pb_grpc
from tc_server.store.api import InvalidOperationError, StoreClosedError, StoreError, StoreUnavailableError
from tc_server.store.oxia import reads

# Gets per Read call: a turn's probes beyond this go in further calls (each get is ~100 bytes).
MAX_GETS_PER_READ = 1_000

_Probe = tuple[pb.GetRequest, "asyncio.Future[bool]"]


class IndexProbes:
    """Batches :meth:`has` per shard; ``stub_of(shard)`` gives the stub of the shard's leader when the
    batch is sent (it may raise :class:`StoreUnavailableError`)."""

    def __init__(self, stub_of: Callable[[int], pb_grpc.OxiaClientStub], timeout_s: float) -> None:
        self._stub_of = stub_of
        self._timeout = timeout_s
        self._waiting: dict[int, list[_Probe]] = {}  # shard -> probes of this turn
        self._calls: set[asyncio.Task[None]] = set()  # Read calls under way (the loop holds tasks weakly)
        self._closed = False

    def has(self, shard: int, index_name: str, secondary_key: str) -> asyncio.Future[bool]:
        """A future of whether ``shard`` holds a record under ``secondary_key`` in ``index_name``; it fails
        with :class:`StoreUnavailableError` as a scan would (the call failed or timed out). Cancelling it
        takes the probe out of a call not yet sent."""
        if self._closed:
            raise StoreClosedError("the Oxia store is closed")
        try:
            get = pb.GetRequest(key=secondary_key, include_value=False, comparison_type=pb.EQUAL,
                                secondary_index_name=index_name)
        except (TypeError, ValueError) as exc:  # e.g. a lone surrogate: what put() refuses the same way
            raise InvalidOperationError(f"index get of {secondary_key!r} in {index_name!r} cannot be encoded: "
                                        f"{exc}") from exc
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        probes = self._waiting.get(shard)
        if probes is None:
            probes = self._waiting[shard] = []
            loop.call_soon(self._send, shard)
        probes.append((get, future))
        return future

    def _send(self, shard: int) -> None:
        probes = [probe for probe in self._waiting.pop(shard, ()) if not probe[1].done()]
        loop = asyncio.get_running_loop()
        for start in range(0, len(probes), MAX_GETS_PER_READ):
            call = loop.create_task(self._call(shard, probes[start:start + MAX_GETS_PER_READ]))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _call(self, shard: int, probes: list[_Probe]) -> None:
        try:
            found = await reads.index_gets(self._stub_of(shard), shard, [get for get, _ in probes], self._timeout)
        except asyncio.CancelledError:
            _fail(probes, StoreClosedError("the Oxia store is closed"))
            raise
        except StoreError as exc:
            _fail(probes, exc)
            return
        except Exception as exc:  # noqa: BLE001 - each waiting request must hear of it
            _fail(probes, StoreUnavailableError(f"index gets on shard {shard}: {exc!r}"))
            return
        for (_, future), hit in zip(probes, found, strict=True):
            if not future.done():
                future.set_result(hit)

    async def close(self) -> None:
        """Fail what waits (StoreClosedError) and end the calls under way."""
        self._closed = True
        for probes in self._waiting.values():
            _fail(probes, StoreClosedError("the Oxia store is closed"))
        self._waiting.clear()
        calls = list(self._calls)
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)


def _fail(probes: list[_Probe], error: StoreError) -> None:
    # An exception of its own per waiting request: one object raised in many places would collect
    # every one of their tracebacks.
    kind = StoreClosedError if isinstance(error, StoreClosedError) else StoreUnavailableError
    for _, future in probes:
        if not future.done():
            future.set_exception(kind(str(error)))
