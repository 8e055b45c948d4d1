"""Which shard holds a key (docs/oxia-client.md, "Routing").

Oxia routes on the low 32 bits of XXH3-64 of the partition key, or of the key when there is none
(``common/hash/hash.go``), and a shard owns the inclusive hash range ``[min, max]``. Routing is the
client's job: the server does not check placement on writes, so a wrong hash (XXH64, as the PyPI
client 0.2.1 uses, docs/oxia-client.md) silently splits the data between clients.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

import xxhash

HASH_SPACE_MAX = 0xFFFF_FFFF


def key_hash(routing_key: str) -> int:
    """The 32-bit routing hash: ``uint32(xxh3_64(routing_key))``."""
    # xxhash >= 4 refuses str (docs/oxia-client.md); Oxia hashes the key's UTF-8 bytes.
    return int(xxhash.xxh3_64_intdigest(routing_key.encode("utf-8"))) & HASH_SPACE_MAX


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard of the namespace: its id, leader ``host:port`` and inclusive hash range."""

    shard: int
    leader: str
    min_hash: int
    max_hash: int


class ShardMap:
    """An immutable snapshot of a namespace's shards, sorted by hash range.

    Raises :class:`ValueError` on construction when the ranges overlap, since routing would then
    be ambiguous.
    """

    def __init__(self, shards: Iterable[ShardInfo]) -> None:
        self._shards = sorted(shards, key=lambda s: s.min_hash)
        self._mins = [s.min_hash for s in self._shards]
        self._by_id = {s.shard: s for s in self._shards}
        for before, after in zip(self._shards, self._shards[1:], strict=False):
            if after.min_hash <= before.max_hash:
                raise ValueError(f"shard ranges overlap: {before} and {after}")

    @property
    def shards(self) -> list[ShardInfo]:
        return list(self._shards)

    def get(self, shard: int) -> ShardInfo | None:
        return self._by_id.get(shard)

    def shard_for_hash(self, h: int) -> ShardInfo | None:
        """The shard whose ``[min, max]`` contains ``h``, or None when no shard covers it (a map
        caught in the middle of a split)."""
        i = bisect.bisect_right(self._mins, h) - 1
        if i < 0:
            return None
        info = self._shards[i]
        return info if h <= info.max_hash else None

    def shard_for(self, key: str, partition_key: str | None = None) -> ShardInfo | None:
        """The shard of a record: the partition key, when given, replaces the key for routing."""
        return self.shard_for_hash(key_hash(partition_key if partition_key is not None else key))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardMap) and self._shards == other._shards

    def __hash__(self) -> int:
        return hash(tuple(self._shards))

    def __repr__(self) -> str:
        return f"ShardMap({self._shards!r})"
