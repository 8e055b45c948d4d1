"""Waiting in a test for what the code under test does in its own time: poll a condition until it holds, with a
bound far above what it takes on a quiet machine. A fixed sleep followed by an assertion that something HAS
happened fails on a loaded machine (CI runs the suite ~2x slower than a quiet one, with stalls of hundreds of
milliseconds); a fixed sleep before asserting that something has NOT happened is fine. This is the one poller of
the tests: a bound of its own per module (5 s in some) was a flake waiting for a slow CI run."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from tc_server.wire import ServerError

BOUND_S = 60.0
# A poll every 50 ms: soon enough after an in-process state changes. A condition that asks another process (over
# HTTP, or its log file) passes 0.2 s, so as not to add load to the process under test.
STEP_S = 0.05


def _described(condition: Callable[[], object], what: str) -> str:
    """``what``, or else the condition's own source line (a lambda in the test)."""
    if what:
        return what
    try:
        return inspect.getsource(condition).strip()
    except (OSError, TypeError):
        return repr(condition)


def _attempts(condition: Callable[[], object], what: str, bound_s: float) -> Iterator[None]:
    """One turn per poll until ``bound_s`` has passed, then AssertionError naming ``what``."""
    deadline = time.monotonic() + bound_s
    while True:
        yield
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound_s:g} s: {_described(condition, what)}")


async def async_wait_for(condition: Callable[[], object], what: str = "", bound_s: float = BOUND_S,
                         step_s: float = STEP_S) -> object:
    """``condition()``'s first true value, polled every ``step_s``; AssertionError naming ``what`` (by default the
    condition's source) past ``bound_s``. A condition may be a coroutine function (one that asks the store or a
    server): what it returns is awaited."""
    for _ in _attempts(condition, what, bound_s):
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(step_s)
    raise AssertionError("unreachable")


def wait_for(condition: Callable[[], object], what: str = "", bound_s: float = BOUND_S,
             step_s: float = STEP_S) -> object:
    """:func:`async_wait_for` for a test without an event loop (it sleeps the thread)."""
    for _ in _attempts(condition, what, bound_s):
        if value := condition():
            return value
        time.sleep(step_s)
    raise AssertionError("unreachable")


async def until_served(ask: Callable[[], Awaitable[Any]], bound_s: float = BOUND_S) -> Any:
    """``ask()``'s first answer other than TransactionCoordinatorNotFound, asked again every 0.1 s as a Pulsar client
    retries that error (a store that did not answer within a short request timeout, or a writer behind by half of
    it: a stall of a loaded machine), or the last answer once ``bound_s`` has passed."""
    deadline = time.monotonic() + bound_s
    while True:
        answer = await ask()
        if answer.error is not ServerError.TransactionCoordinatorNotFound or time.monotonic() > deadline:
            return answer
        await asyncio.sleep(0.1)
