"""Open transactions per principal, across every coordinator this instance leads (issue 15).

One principal (an authenticated role) must not fill the instance with open txns and starve the others:
past ``--max-open-transactions-per-principal`` its NEW_TXN is refused as the per-coordinator limit
refuses it. The count is this instance's view: the OPEN txns of the coordinators led here, rebuilt from
the adopted headers' ``owner`` when a coordinator is (re)led and released when its leadership ends.
Without authentication a txn has no owner and no per-principal limit applies (docs/security.md).
"""

from __future__ import annotations

import sys

from tc_server.coordinator.errors import NotAllowed


class OpenByPrincipal:
    """principal -> open txns counted for it here; ``limit`` 0: no limit (still counted, for the message)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}

    def count(self, principal: str) -> int:
        return self._counts.get(principal, 0)

    def check(self, principal: str | None) -> None:
        """Raise NotAllowed when ``principal`` is at its limit (never for no principal)."""
        if principal is None or self.limit <= 0:
            return
        held = self._counts.get(principal, 0)
        if held >= self.limit:
            # The same error as the per-coordinator limit (partition.py new_txn): a client does not retry it.
            raise NotAllowed(f"principal {principal!r} has {held} open transactions on this instance, its limit "
                             f"(--max-open-transactions-per-principal); end some first")

    def add(self, principal: str) -> str:
        """Count one more open txn; returns the principal interned, which the caller keeps per txn: 500,000
        recovered txns of a few principals then share a few strings (each header parse makes a new one)."""
        principal = sys.intern(principal)
        self._counts[principal] = self._counts.get(principal, 0) + 1
        return principal

    def remove(self, principal: str) -> None:
        left = self._counts.get(principal, 0) - 1
        if left > 0:
            self._counts[principal] = left
        else:
            self._counts.pop(principal, None)  # a principal with none open holds no entry

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)
