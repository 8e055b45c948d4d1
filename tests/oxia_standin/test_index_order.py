"""The STAND-IN Oxia's secondary indexes are laid out and ordered as real Oxia's (docs/oxia-client.md).

Real Oxia keeps one internal key per index entry, ``__oxia/idx/<name>/<secondaryKey>\\x01<url.PathEscape(
primaryKey)>``, in the record's shard, and answers a ``[start, end)`` index scan by comparing
``__oxia/idx/<name>/<start>`` and ``…/<end>`` with those keys under its hierarchical order
(CompareWithSlash: segment by segment, a key with no further ``/`` before any deeper one). Pulsar 5's
secondary keys carry a parent path (``/txn/op/1_0``), so these details decide what a scan returns; the
stand-in must not be kinder than the real server. These tests pin where that order differs from a plain
(secondary, primary) tuple order, which the memory and SQLite stores use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tc_server.store.oxia import OxiaStore, connect
from tests.oxia_standin.server import StandinOxia, compare_with_slash, index_entry_key, path_escape


@pytest.fixture
async def store() -> AsyncIterator[OxiaStore]:
    oxia = StandinOxia(shards=1)
    await oxia.start()
    client = await connect(oxia.address, request_timeout_s=10.0)
    yield client
    await client.close()
    await oxia.stop()


async def keys(store: OxiaStore, start: str, end: str) -> list[str]:
    return [r.key async for r in store.scan_index("n", start, end, partition_key="p")]


@pytest.mark.parametrize("raw, escaped", [
    ("/txn/op/1_0-00000000000000000001", "%2Ftxn%2Fop%2F1_0-00000000000000000001"),
    ("a b", "a%20b"),
    ("!'()*,;?", "%21%27%28%29%2A%2C%3B%3F"),  # escaped by Go's PathEscape
    ("$&+:=@~-._", "$&+:=@~-._"),  # kept by Go's PathEscape
    ("\u00e9", "%C3%A9"),
])
def test_primary_key_escape_is_gos_path_escape(raw: str, escaped: str) -> None:
    assert path_escape(raw) == escaped


def test_index_entry_key_of_a_pulsar_op_record() -> None:
    assert index_entry_key("idx:ops-by-txn", "/txn/op/1_0", "/txn/op/1_0-00000000000000000001") == (
        "__oxia/idx/idx:ops-by-txn//txn/op/1_0\x01%2Ftxn%2Fop%2F1_0-00000000000000000001")


def test_compare_with_slash_puts_deeper_keys_after() -> None:
    assert compare_with_slash("a0", "a/b") < 0  # plain byte order says the opposite
    assert compare_with_slash("a/b", "a/c") < 0
    assert compare_with_slash("a", "a/b") < 0


async def test_a_range_ending_at_key_plus_nul_misses_the_key(store: OxiaStore) -> None:
    # "<k>\x01…" sorts after "<k>\x00": only an end past \x01 takes in k's entries.
    await store.put("/r/a", b"", partition_key="p", secondary_indexes={"n": "/txn/op/1_1"})
    await store.put("/r/b", b"", partition_key="p", secondary_indexes={"n": "/txn/op/1_10"})
    assert await keys(store, "/txn/op/1_1", "/txn/op/1_1\x00") == []
    assert await keys(store, "/txn/op/1_1", "/txn/op/1_1\x02") == ["/r/a"]


async def test_one_secondary_key_orders_by_escaped_primary_key(store: OxiaStore) -> None:
    # "/" escapes to "%2F", which sorts before ".": "/c/a/b" comes before "/c/a.b" here, after it in
    # plain key order.
    await store.put("/c/a.b", b"", partition_key="p", secondary_indexes={"n": "k"})
    await store.put("/c/a/b", b"", partition_key="p", secondary_indexes={"n": "k"})
    assert await keys(store, "k", "k\x02") == ["/c/a/b", "/c/a.b"]


async def test_secondary_keys_with_a_slash_sit_one_level_deeper(store: OxiaStore) -> None:
    # A range without "/" never takes in a secondary key with one (and the other way round): this is
    # why tc-server's earlier index keys and Pulsar 5's prefixed ones are scanned as two ranges.
    await store.put("/r/old", b"", partition_key="p", secondary_indexes={"n": "00000001795447269230"})
    await store.put("/r/new", b"", partition_key="p", secondary_indexes={"n": "/txn/id/00000001795447269230"})
    await store.put("/r/deep", b"", partition_key="p", secondary_indexes={"n": "0/x"})
    assert await keys(store, "00000000000000000000", "~") == ["/r/old"]
    assert await keys(store, "/txn/id/00000000000000000000", "/txn/id/~") == ["/r/new"]
    assert await keys(store, "0", "1") == ["/r/old"]  # not "0/x": it is deeper than "0" … "1"
    assert await keys(store, "0/", "0/~") == ["/r/deep"]
