"""Routing: the hash Oxia uses and the shard ranges (docs/oxia-client.md, "Routing"). No server involved."""

from __future__ import annotations

import pytest
import xxhash

from tc_server.store.oxia.routing import ShardInfo, ShardMap, key_hash


def test_xxh3_vector_from_oxias_hash_test() -> None:
    # common/hash/hash_test.go: uint32(xxh3_64("foo")) = 125730186.
    assert key_hash("foo") == 125730186


def test_not_xxh64() -> None:
    # The PyPI client's mistake (docs/oxia-client.md): XXH64 routes "foo" elsewhere.
    assert xxhash.xxh64_intdigest(b"foo") & 0xFFFFFFFF == 1506064959 != key_hash("foo")


def test_utf8_bytes_are_hashed() -> None:
    assert key_hash("ключ") == xxhash.xxh3_64_intdigest("ключ".encode()) & 0xFFFFFFFF


def three_shards() -> ShardMap:
    return ShardMap([
        ShardInfo(2, "c:1", 0xAAAA_AAAA, 0xFFFF_FFFF),
        ShardInfo(0, "a:1", 0, 0x5555_5554),
        ShardInfo(1, "b:1", 0x5555_5555, 0xAAAA_AAA9),
    ])


def test_inclusive_bounds() -> None:
    shards = three_shards()
    assert shards.shard_for_hash(0).shard == 0  # type: ignore[union-attr]
    assert shards.shard_for_hash(0x5555_5554).shard == 0  # type: ignore[union-attr]
    assert shards.shard_for_hash(0x5555_5555).shard == 1  # type: ignore[union-attr]
    assert shards.shard_for_hash(0xAAAA_AAA9).shard == 1  # type: ignore[union-attr]
    assert shards.shard_for_hash(0xFFFF_FFFF).shard == 2  # type: ignore[union-attr]


def test_partition_key_replaces_key() -> None:
    shards = three_shards()
    assert shards.shard_for("/any/key", "foo") == shards.shard_for_hash(125730186)
    assert shards.shard_for("foo") == shards.shard_for_hash(125730186)


def test_gap_is_none() -> None:
    shards = ShardMap([ShardInfo(0, "a:1", 0, 10), ShardInfo(1, "b:1", 20, 0xFFFF_FFFF)])
    assert shards.shard_for_hash(15) is None


def test_overlap_rejected() -> None:
    with pytest.raises(ValueError, match="overlap"):
        ShardMap([ShardInfo(0, "a:1", 0, 10), ShardInfo(1, "b:1", 10, 20)])
