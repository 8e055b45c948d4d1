"""Open transactions per principal, across every coordinator this instance leads (issue 15).

One principal (an authenticated role) must not fill the instance with open txns and starve the others:
past ``--max-open-transactions-per-principal`` its NEW_TXN is refused as the per-coordinator limit
refuses it. The count is this instance's view: the OPEN txns of the coordinators led here, rebuilt from
the adopted headers' ``owner`` when a coordinator is (re)led and released when its leadership ends.
Without authentication a txn has no owner and no per-principal limit applies (docs/security.md).

A principal's decided txns whose brokers have not all acknowledged (the outbox) count toward the same limit,
as they count toward a coordinator's (Pulsar counts a txn until its brokers acknowledged): a role committing
txns that name topics no broker serves could otherwise fill ``--max-undelivered-decisions`` and so deny
every other role new txns (a review's). That server-wide bound refuses only the principals that owe some.
"""

from __future__ import annotations

import sys

from tc_server.coordinator.errors import NotAllowed


class OpenByPrincipal:
    """principal -> open txns counted for it here, and undelivered decisions; ``limit`` 0: no limit (still
    counted, for the message)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}
        self._undelivered: dict[str, int] = {}

    def count(self, principal: str) -> int:
        return self._counts.get(principal, 0)

    def owes(self, principal: str) -> bool:
        """Whether ``principal`` has decided txns here whose brokers have not all acknowledged."""
        return principal in self._undelivered

    def check(self, principal: str | None) -> None:
        """Raise NotAllowed when ``principal`` is at its limit (never for no principal)."""
        if principal is None or self.limit <= 0:
            return
        held, owed = self._counts.get(principal, 0), self._undelivered.get(principal, 0)
        if held + owed >= self.limit:
            # The same error as the per-coordinator limit (partition.py new_txn): a client does not retry it.
            raise NotAllowed(f"principal {principal!r} has {held} open transactions and {owed} decided ones its "
                             "brokers have not all acknowledged on this instance, its limit "
                             "(--max-open-transactions-per-principal); end some first, or see "
                             "/admin/v3/transactions/undelivered")

    def add(self, principal: str) -> str:
        """Count one more open txn; returns the principal interned, which the caller keeps per txn: 500,000
        recovered txns of a few principals then share a few strings (each header parse makes a new one)."""
        principal = sys.intern(principal)
        self._counts[principal] = self._counts.get(principal, 0) + 1
        return principal

    def remove(self, principal: str) -> None:
        _take_one(self._counts, principal)

    def add_undelivered(self, principal: str) -> str:
        """Count one more undelivered decision; returns the principal interned (see add)."""
        principal = sys.intern(principal)
        self._undelivered[principal] = self._undelivered.get(principal, 0) + 1
        return principal

    def remove_undelivered(self, principal: str) -> None:
        _take_one(self._undelivered, principal)

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)


def _take_one(counts: dict[str, int], principal: str) -> None:
    left = counts.get(principal, 0) - 1
    if left > 0:
        counts[principal] = left
    else:
        counts.pop(principal, None)  # a principal with none held has no entry
