"""The request timeout (--request-timeout-s) with one timer per tick of request starts, not per request.

``asyncio.timeout()`` per request costs a Timeout object, a timer pushed on the loop's heap and its
cancellation: several percent of the server's CPU per transaction under load (profiled, README
*Performance*). Here the requests that start within one tick (100 ms) share one timer, which fires
between ``timeout_s`` and ``timeout_s + tick_s`` after each of them started and cancels those still
running; the request then sees :class:`TimeoutError`, as it would from ``asyncio.timeout()``.
"""

from __future__ import annotations

import asyncio
from typing import Any

TICK_S = 0.1


class RequestDeadlines:
    def __init__(self, timeout_s: float, tick_s: float = TICK_S) -> None:
        self.timeout_s = timeout_s
        self._tick_s = tick_s
        # Tick number -> the tasks that entered during it and have not left yet.
        self._buckets: dict[int, set[asyncio.Task[Any]]] = {}
        # Tasks this class cancelled whose CancelledError has not been turned into a TimeoutError yet.
        self._expired: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first enter()

    def enter(self) -> tuple[asyncio.Task[Any], set[asyncio.Task[Any]]]:
        """Start the deadline of the current task; pass the result to :meth:`leave` in a ``finally``."""
        # The loop is looked up once: asyncio.get_running_loop() (also inside current_task() without
        # a loop) makes a getpid() system call per call in CPython 3.11 (issue 13, profiled).
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("RequestDeadlines.enter() outside a task")
        tick = int(loop.time() / self._tick_s)
        bucket = self._buckets.get(tick)
        if bucket is None:
            bucket = self._buckets[tick] = set()
            loop.call_at((tick + 1) * self._tick_s + self.timeout_s, self._expire, tick)
        bucket.add(task)
        return task, bucket

    def leave(self, entered: tuple[asyncio.Task[Any], set[asyncio.Task[Any]]]) -> None:
        task, bucket = entered
        bucket.discard(task)
        self._expired.discard(task)

    def timed_out(self, task: asyncio.Task[Any]) -> bool:
        """Whether the CancelledError ``task`` just caught came from its deadline (then the
        cancellation is withdrawn and the caller raises TimeoutError), rather than from elsewhere
        (a shutdown: the caller re-raises it)."""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        task.uncancel()
        return True

    def _expire(self, tick: int) -> None:
        for task in self._buckets.pop(tick, ()):
            if not task.done():
                self._expired.add(task)
                task.cancel()
