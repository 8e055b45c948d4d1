"""Request deadlines with one timer per tick of starts, not per request.

``asyncio.timeout()`` costs a Timeout object, a timer pushed on the loop's heap, its cancellation and
the async context-manager protocol: ~5 us per use on uvloop, several percent of the server's CPU per
transaction under load (profiled, docs/performance.md). Here the deadlines that start within one tick
(100 ms) share one timer, which fires between ``timeout_s`` and ``timeout_s + tick_s`` after each of
them started and cancels the tasks still inside theirs; each then sees :class:`TimeoutError`, as it
would from ``asyncio.timeout()``. Used for the request timeout (--request-timeout-s) of client requests
(tc_server/server/dispatch.py) and of tc-server's own requests to brokers (tc_server/participants/).

    with deadlines.bound("NEW_TXN"):
        await ...          # TimeoutError("NEW_TXN not finished within 10.0 s") once past it
"""

from __future__ import annotations

import asyncio
import functools
from types import TracebackType
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
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first bound()

    def bound(self, what: str) -> Deadline:
        """The current task's deadline, as a (synchronous, so cheap) context manager: inside it, the task
        is cancelled once past the deadline and the ``with`` raises TimeoutError naming ``what``; a
        cancellation from elsewhere (a shutdown) stays a CancelledError. Outside a task: RuntimeError.
        Not nested within one task on one instance (a task is in a tick's set once): use them one after
        the other, as the delivery does for a lookup and then the request."""
        # The loop is looked up once: asyncio.get_running_loop() (also inside current_task() without
        # a loop) makes a getpid() system call per call in CPython 3.11 (issue 13, profiled).
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("RequestDeadlines.bound() outside a task")
        return Deadline(self, task, what)

    async def wait(self, future: asyncio.Future[Any], what: str) -> None:
        """Return once ``future`` is done, or raise TimeoutError at the deadline; never cancels ``future``
        (what ``asyncio.shield()`` inside ``asyncio.timeout()`` does, for ~8 us more, profiled): the
        deadline cancels a waiter of this call's own."""
        if future.done():
            return
        waiter = future.get_loop().create_future()
        future.add_done_callback(functools.partial(_wake, waiter))
        with self.bound(what):
            await waiter

    def expire_all(self) -> None:
        """Every deadline is reached now: each task inside one sees its TimeoutError (a stop that cannot
        wait for them)."""
        for tick in list(self._buckets):
            self._expire(tick)

    def _leave_expired(self, task: asyncio.Task[Any], cancelling: int) -> bool:
        """``task``, which this class cancelled, leaves (Deadline.__exit__ took it out of its bucket): whether
        its deadline cancelled it and nothing else did (the deadline's cancellation is then withdrawn).
        ``cancelling``: the task's pending cancellations on entry."""
        self._expired.discard(task)
        # More cancellations than on entry once the deadline's is withdrawn: someone else cancelled the
        # task too (a shutdown, in the same turn as the deadline), and theirs must stay a CancelledError.
        return task.uncancel() <= cancelling

    def _expire(self, tick: int) -> None:
        for task in self._buckets.pop(tick, ()):
            if not task.done():
                self._expired.add(task)
                task.cancel()


class Deadline:
    """One task's stay inside a deadline of :class:`RequestDeadlines` (from its ``bound()``)."""

    __slots__ = ("_deadlines", "_task", "_what", "_bucket", "_cancelling")
    _bucket: set[asyncio.Task[Any]]  # the tick's set this task entered, set by __enter__
    _cancelling: int  # the task's pending cancellations when it entered (asyncio.timeout() keeps the same)

    def __init__(self, deadlines: RequestDeadlines, task: asyncio.Task[Any], what: str) -> None:
        self._deadlines = deadlines
        self._task = task
        self._what = what

    def __enter__(self) -> None:
        # RequestDeadlines._enter and _leave, inlined: a call less each per request (issue 13).
        task = self._task
        self._cancelling = task.cancelling()
        deadlines = self._deadlines
        loop = deadlines._loop
        assert loop is not None
        tick = int(loop.time() / deadlines._tick_s)
        bucket = deadlines._buckets.get(tick)
        if bucket is None:
            bucket = deadlines._buckets[tick] = set()
            loop.call_at((tick + 1) * deadlines._tick_s + deadlines.timeout_s, deadlines._expire, tick)
        bucket.add(task)
        self._bucket = bucket

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        task = self._task
        self._bucket.discard(task)
        expired = self._deadlines._expired
        if task not in expired:
            return
        if self._deadlines._leave_expired(task, self._cancelling) and exc_type is asyncio.CancelledError:
            raise TimeoutError(f"{self._what} not finished within {self._deadlines.timeout_s} s") from None


def _wake(waiter: asyncio.Future[None], _done: asyncio.Future[Any]) -> None:
    if not waiter.done():  # cancelled at its deadline: nobody waits any more
        waiter.set_result(None)
