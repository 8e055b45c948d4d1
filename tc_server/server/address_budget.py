"""How many of something are under way, per client address and in all: client connections, TLS handshakes
not yet done, the admin port's connections. Past either bound a new one is turned away at once."""

from __future__ import annotations

from collections.abc import Callable


class AddressBudget:
    """At most ``per_address`` under way from one client address and ``total`` in all. ``refused(address)`` is
    told of each one turned away (the caller's metric and log line)."""

    def __init__(self, total: int, per_address: int, refused: Callable[[str], None] | None = None) -> None:
        self.total = total
        self.per_address = per_address
        self.count = 0
        self.by_address: dict[str, int] = {}
        self._refused = refused

    def admit(self, address: str) -> bool:
        count = self.by_address.get(address, 0)
        if self.count >= self.total or count >= self.per_address:
            if self._refused is not None:
                self._refused(address)
            return False
        self.by_address[address] = count + 1
        self.count += 1
        return True

    def full_for_others_than(self, address: str) -> bool:
        """Whether the bound in all is reached while ``address`` is under its own."""
        return self.count >= self.total and self.by_address.get(address, 0) < self.per_address

    def release(self, address: str) -> None:
        self.count -= 1
        left = self.by_address[address] - 1
        if left:
            self.by_address[address] = left
        else:
            del self.by_address[address]
