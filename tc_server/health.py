"""What /readyz reports besides reachability: failures the server has actually seen (issue 15: the probe
stayed 200 while every write failed on a full disk, and while recovery failed forever on a damaged
database).

Each component reports its failures here. A failure the component keeps retrying by itself (the recovery
scan) stands until it reports its success; a failure seen by requests (store writes failing or not finishing
within the request timeout) stands until a request that surely wrote succeeds (a NEW_TXN: requests that
write nothing succeed while every write fails), and at most FRESH_S after the last one, so an instance
taken out of service, which then gets no requests, is tried again instead of staying out for good."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# How long a request-driven failure keeps the instance unready after it was last seen.
FRESH_S = 30.0


@dataclass
class _Failure:
    since: float
    last: float
    message: str
    sticky: bool

    def stands(self, now: float) -> bool:
        """Whether it still makes the instance unready: until recovered, or FRESH_S after it was last seen."""
        return self.sticky or now - self.last <= FRESH_S


class Health:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._failures: dict[str, _Failure] = {}

    def failed(self, component: str, message: str, *, until_recovered: bool = False) -> None:
        """``component`` failed just now; ``until_recovered``: it stands until :meth:`recovered`."""
        now = self._clock()
        previous = self._failures.get(component)
        # A failure that no longer stood (aged out unseen) is not the start of this one: /readyz said
        # "failing for an hour" of a store that had been healthy and ready in between (a review).
        since = previous.since if previous is not None and previous.stands(now) else now
        self._failures[component] = _Failure(since, now, message[:300], until_recovered)

    def recovered(self, component: str) -> None:
        """``component``'s failure that stands until recovered (``until_recovered``) is over."""
        if self._failures:  # the common case costs one check
            self._failures.pop(component, None)

    def problems(self) -> list[str]:
        """One line per failing component, naming it, for how long, and the last error."""
        now = self._clock()
        return [f"{component} failing for {now - failure.since:.0f} s: {failure.message}"
                for component, failure in sorted(self._failures.items())
                if failure.stands(now)]
