"""Waiting in a test for what the code under test does in its own time: poll a condition until it holds, with a
bound far above what it takes on a quiet machine. A fixed sleep followed by an assertion that something HAS
happened fails on a loaded machine (CI runs the suite ~2x slower than a quiet one, with stalls of hundreds of
milliseconds); a fixed sleep before asserting that something has NOT happened is fine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

BOUND_S = 60.0


def _attempts(what: str, bound_s: float) -> Iterator[None]:
    """One turn per poll until ``bound_s`` has passed, then AssertionError naming ``what``."""
    deadline = time.monotonic() + bound_s
    while True:
        yield
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound_s:g} s: {what}")


async def async_wait_for(condition: Callable[[], object], what: str, bound_s: float = BOUND_S,
                         step_s: float = 0.2) -> object:
    """``condition()``'s first true value, polled every ``step_s``; AssertionError naming ``what`` past ``bound_s``."""
    for _ in _attempts(what, bound_s):
        if value := condition():
            return value
        await asyncio.sleep(step_s)
    raise AssertionError("unreachable")


def wait_for(condition: Callable[[], object], what: str, bound_s: float = BOUND_S, step_s: float = 0.2) -> object:
    """:func:`async_wait_for` for a test without an event loop (it sleeps the thread)."""
    for _ in _attempts(what, bound_s):
        if value := condition():
            return value
        time.sleep(step_s)
    raise AssertionError("unreachable")
