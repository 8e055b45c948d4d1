"""What every MetadataStore backend must do (docs/architecture.md §9; Oxia's semantics, docs/oxia-client.md).

Scans without a partition key may come back in any order (Oxia fans out to every shard), so those
results are compared as sets; with a partition key they are ordered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tc_server.store.api import (
    EXPECT_ABSENT,
    BadVersionError,
    Delete,
    InvalidOperationError,
    MetadataStore,
    Notification,
    NotificationType,
    Outcome,
    Put,
    Record,
    StoreClosedError,
    WriteResult,
    sequence_key,
)

# The `open_session` fixture (conftest.py): another session on this test's data set.
OpenSession = Callable[[], Awaitable[MetadataStore]]

# Generous: only there so that a missing notification fails the test instead of hanging it.
WAIT = 10.0


async def collect(records: AsyncIterator[Record]) -> list[Record]:
    return [record async for record in records]


async def keys_of(records: AsyncIterator[Record]) -> list[str]:
    return [record.key for record in await collect(records)]


async def take(stream: AsyncIterator[Notification], count: int) -> list[Notification]:
    return [await asyncio.wait_for(anext(stream), WAIT) for _ in range(count)]


def test_implements_protocol(store: MetadataStore) -> None:
    assert isinstance(store, MetadataStore)


# -- get / put / CAS ---------------------------------------------------------------------------------


async def test_get_absent(store: MetadataStore) -> None:
    assert await store.get("/c/none") is None


async def test_put_then_get(store: MetadataStore) -> None:
    written = await store.put("/c/a", b"\x00value\xff")
    assert written.key == "/c/a"
    assert written.value == b"\x00value\xff"
    assert await store.get("/c/a") == written
    assert written.created_ms > 0
    assert written.modified_ms >= written.created_ms


async def test_empty_value(store: MetadataStore) -> None:
    await store.put("/c/empty", b"")
    record = await store.get("/c/empty")
    assert record is not None
    assert record.value == b""


async def test_versions_change_on_every_modification_and_differ_across_keys(store: MetadataStore) -> None:
    # Oxia's version id is its shard's commit offset: unique among the keys of one shard (one
    # partition key), not across shards, so only that much is promised.
    a1 = await store.put("/c/a", b"1", partition_key="p")
    b1 = await store.put("/c/b", b"1", partition_key="p")
    a2 = await store.put("/c/a", b"2", partition_key="p")
    a3 = await store.put("/c/a", b"2", partition_key="p")  # the same value is still a modification
    assert len({a1.version, b1.version, a2.version, a3.version}) == 4
    assert a3.created_ms == a1.created_ms
    assert a3.modified_ms >= a1.modified_ms
    assert await store.get("/c/a", partition_key="p") == a3


async def test_put_expect_absent(store: MetadataStore) -> None:
    first = await store.put("/c/k", b"1", expected_version=EXPECT_ABSENT)
    with pytest.raises(BadVersionError) as info:
        await store.put("/c/k", b"2", expected_version=EXPECT_ABSENT)
    assert info.value.key == "/c/k"
    assert await store.get("/c/k") == first


async def test_put_matching_version(store: MetadataStore) -> None:
    first = await store.put("/c/k", b"1")
    second = await store.put("/c/k", b"2", expected_version=first.version)
    assert second.version != first.version
    assert await store.get("/c/k") == second


async def test_put_mismatching_version(store: MetadataStore) -> None:
    first = await store.put("/c/k", b"1")
    await store.put("/c/k", b"2")
    with pytest.raises(BadVersionError):
        await store.put("/c/k", b"3", expected_version=first.version)
    record = await store.get("/c/k")
    assert record is not None
    assert record.value == b"2"


async def test_start_put_gives_the_record_or_the_failed_condition(store: MetadataStore) -> None:
    # NEW_TXN's header write (partition.py): the future says what put() would return or raise.
    indexes = {"idx:n": "1"}
    first = await store.start_put("/c/k", b"1", expected_version=EXPECT_ABSENT, partition_key="p",
                                  secondary_indexes=indexes)
    assert await store.get("/c/k", partition_key="p") == first
    assert [r.key async for r in store.scan_index("idx:n", "0", "9", partition_key="p")] == ["/c/k"]
    with pytest.raises(BadVersionError) as info:
        await store.start_put("/c/k", b"2", expected_version=EXPECT_ABSENT, partition_key="p")
    assert info.value.key == "/c/k"
    second = await store.start_put("/c/k", b"3", expected_version=first.version, partition_key="p")
    with pytest.raises(BadVersionError):
        await store.start_put("/c/k", b"4", expected_version=first.version, partition_key="p")
    assert await store.get("/c/k", partition_key="p") == second
    assert second.value == b"3" and second.created_ms == first.created_ms


async def test_start_put_refuses_what_put_refuses(store: MetadataStore) -> None:
    with pytest.raises(InvalidOperationError):
        await store.start_put("/c/k", b"", secondary_indexes={"": "1"})


async def test_a_nul_in_an_index_name_or_secondary_key_is_refused(store: MetadataStore) -> None:
    # The embedded store lists a record's entries joined by NUL: one store contract, refused by all.
    for indexes in ({"i\x00j": "1"}, {"i": "1\x002"}):
        with pytest.raises(InvalidOperationError, match="NUL"):
            await store.put("/c/nul", b"", secondary_indexes=indexes)
    assert await store.get("/c/nul") is None


async def test_a_key_that_is_not_text_is_refused(store: MetadataStore) -> None:
    # A caller's bug, refused before anything is written (the embedded store used to commit it and then
    # fail while describing it, leaving the other callers of its group unanswered).
    with pytest.raises(InvalidOperationError, match="must be a str"):
        await store.put(b"/c/k", b"")  # type: ignore[arg-type]
    with pytest.raises(InvalidOperationError, match="must be a str"):
        await store.write_batch([Put("/c/ok", b""), Put(b"/c/k", b"")])  # type: ignore[arg-type]
    assert await store.get("/c/ok") is None


async def test_the_record_a_put_returns_is_what_was_written(store: MetadataStore) -> None:
    buffer = bytearray(b"old")
    pending = store.start_put("/c/k", buffer)  # type: ignore[arg-type]
    buffer[:] = b"new"  # the caller reuses its buffer before the answer
    record = await pending
    stored = await store.get("/c/k")
    assert record.value == b"old" and stored is not None and stored.value == b"old"


async def test_put_expected_version_on_absent_key_fails(store: MetadataStore) -> None:
    other = await store.put("/c/other", b"x")
    with pytest.raises(BadVersionError):
        await store.put("/c/k", b"1", expected_version=other.version)
    assert await store.get("/c/k") is None


async def test_stale_version_of_recreated_key_fails(store: MetadataStore) -> None:
    old = await store.put("/c/k", b"1")
    await store.delete("/c/k")
    await store.put("/c/k", b"2")
    with pytest.raises(BadVersionError):
        await store.put("/c/k", b"3", expected_version=old.version)


# -- delete --------------------------------------------------------------------------------------------


async def test_delete_absent_returns_false(store: MetadataStore) -> None:
    assert await store.delete("/c/none") is False


async def test_delete_present(store: MetadataStore) -> None:
    await store.put("/c/k", b"1")
    assert await store.delete("/c/k") is True
    assert await store.get("/c/k") is None
    assert await store.delete("/c/k") is False


async def test_delete_matching_version(store: MetadataStore) -> None:
    record = await store.put("/c/k", b"1")
    assert await store.delete("/c/k", expected_version=record.version) is True
    assert await store.get("/c/k") is None


async def test_delete_mismatching_version(store: MetadataStore) -> None:
    record = await store.put("/c/k", b"1")
    await store.put("/c/k", b"2")
    with pytest.raises(BadVersionError):
        await store.delete("/c/k", expected_version=record.version)
    assert await store.get("/c/k") is not None


async def test_delete_expecting_absent_on_present_key_fails(store: MetadataStore) -> None:
    await store.put("/c/k", b"1")
    with pytest.raises(BadVersionError):
        await store.delete("/c/k", expected_version=EXPECT_ABSENT)
    assert await store.get("/c/k") is not None


async def test_delete_with_version_on_absent_key(store: MetadataStore) -> None:
    # Oxia's checkExpectedVersionId: a version (>= 0) on a missing key is a version mismatch;
    # "expect absent" on a missing key passes the check and the delete reports not found.
    other = await store.put("/c/other", b"x")
    with pytest.raises(BadVersionError):
        await store.delete("/c/none", expected_version=other.version)
    assert await store.delete("/c/none", expected_version=EXPECT_ABSENT) is False


# -- sequential keys -----------------------------------------------------------------------------------


async def test_sequential_keys_start_at_one_and_increase(store: MetadataStore) -> None:
    first = await store.put_sequential("/c/seq/p", b"a", partition_key="p")
    second = await store.put_sequential("/c/seq/p", b"b", partition_key="p")
    third = await store.put_sequential("/c/seq/p", b"c", partition_key="p")
    assert first.key == "/c/seq/p-00000000000000000001"
    assert [second.key, third.key] == [sequence_key("/c/seq/p", 2), sequence_key("/c/seq/p", 3)]
    assert await store.get(second.key, partition_key="p") == second
    assert second.value == b"b"


async def test_sequential_keys_are_per_prefix(store: MetadataStore) -> None:
    await store.put_sequential("/c/seq/a", b"", partition_key="p")
    await store.put_sequential("/c/seq/a", b"", partition_key="p")
    other = await store.put_sequential("/c/seq/b", b"", partition_key="p")
    assert other.key == sequence_key("/c/seq/b", 1)


async def test_sequential_key_follows_highest_existing(store: MetadataStore) -> None:
    keys = [(await store.put_sequential("/c/seq/x", b"", partition_key="x")).key for _ in range(3)]
    await store.delete(keys[0], partition_key="x")
    nxt = await store.put_sequential("/c/seq/x", b"", partition_key="x")
    assert nxt.key == sequence_key("/c/seq/x", 4)


async def test_sequential_ignores_keys_of_other_shapes(store: MetadataStore) -> None:
    await store.put(sequence_key("/c/seq/y", 7) + "/child", b"", partition_key="y")
    await store.put("/c/seq/y-zzz", b"", partition_key="y")
    first = await store.put_sequential("/c/seq/y", b"", partition_key="y")
    assert first.key == sequence_key("/c/seq/y", 1)


async def test_sequential_puts_in_one_batch(store: MetadataStore) -> None:
    results = await store.write_batch([
        Put("/c/seq/b", b"1", partition_key="b", sequential=True),
        Put("/c/seq/b", b"2", partition_key="b", sequential=True),
    ])
    assert [r.key for r in results] == [sequence_key("/c/seq/b", 1), sequence_key("/c/seq/b", 2)]
    assert all(r.outcome is Outcome.OK for r in results)


async def test_sequential_with_secondary_index(store: MetadataStore) -> None:
    record = await store.put_sequential("/c/seq/i", b"v", partition_key="i", secondary_indexes={"by": "k1"})
    assert await keys_of(store.scan_index("by", "k0", "k2", partition_key="i")) == [record.key]


async def test_sequential_requires_partition_key(store: MetadataStore) -> None:
    with pytest.raises(InvalidOperationError):
        await store.put_sequential("/c/seq/n", b"", partition_key="")
    with pytest.raises(InvalidOperationError):
        await store.write_batch([Put("/c/seq/n", b"", sequential=True)])
    assert await keys_of(store.scan_prefix("/c/seq/")) == []


async def test_sequential_rejects_expected_version(store: MetadataStore) -> None:
    with pytest.raises(InvalidOperationError):
        await store.write_batch(
            [Put("/c/seq/n", b"", partition_key="n", sequential=True, expected_version=EXPECT_ABSENT)])


async def test_invalid_batch_applies_nothing(store: MetadataStore) -> None:
    with pytest.raises(InvalidOperationError):
        await store.write_batch([Put("/c/ok", b""), Put("/c/seq/n", b"", sequential=True)])
    assert await store.get("/c/ok") is None


async def test_invalid_index_name_rejected(store: MetadataStore) -> None:
    with pytest.raises(InvalidOperationError):
        await store.put("/c/k", b"", secondary_indexes={"a/b": "x"})
    with pytest.raises(InvalidOperationError):
        await store.put("/c/k", b"", secondary_indexes={"": "x"})
    assert await store.get("/c/k") is None


# -- secondary indexes ---------------------------------------------------------------------------------


async def test_index_scan_range_bounds(store: MetadataStore) -> None:
    for i in range(5):
        await store.put(f"/c/r{i}", b"", partition_key="p", secondary_indexes={"n": f"{i:03d}"})
    found = await keys_of(store.scan_index("n", "001", "003", partition_key="p"))
    assert found == ["/c/r1", "/c/r2"]  # start inclusive, end exclusive
    assert await keys_of(store.scan_index("n", "005", "999", partition_key="p")) == []
    assert await keys_of(store.scan_index("n", "002", "002", partition_key="p")) == []


async def test_index_scan_returns_full_records(store: MetadataStore) -> None:
    written = await store.put("/c/a", b"payload", partition_key="p", secondary_indexes={"n": "1"})
    assert await collect(store.scan_index("n", "0", "2", partition_key="p")) == [written]


async def test_index_scan_ordered_by_secondary_then_primary_key(store: MetadataStore) -> None:
    await store.put("/c/b", b"", partition_key="p", secondary_indexes={"n": "2"})
    await store.put("/c/c", b"", partition_key="p", secondary_indexes={"n": "1"})
    await store.put("/c/a", b"", partition_key="p", secondary_indexes={"n": "2"})
    assert await keys_of(store.scan_index("n", "0", "9", partition_key="p")) == ["/c/c", "/c/a", "/c/b"]


async def test_index_has_exactly_the_secondary_key(store: MetadataStore) -> None:
    # Pulsar 5's op records' shape (docs/record-layout.md): a secondary key with slashes, shared by
    # every op of one txn, next to a txn whose key extends it (1_5 and 1_50).
    # Entries one level deeper and shallower too: Oxia seeks to the first entry at or after the key
    # and compares that one only (oxiad's secondaryIndexGet, imitated by the stand-in).
    for key, secondary in (("/c/1_5-01", "/txn/op/1_5"), ("/c/1_5-02", "/txn/op/1_5"), ("/c/1_50-01", "/txn/op/1_50"),
                           ("/c/deeper", "/txn/op/1_6/x"), ("/c/shallower", "/txn/op")):
        await store.put(key, b"", partition_key="p", secondary_indexes={"idx:ops": secondary})
    assert await store.index_has("idx:ops", "/txn/op/1_5", partition_key="p")
    assert await store.index_has("idx:ops", "/txn/op/1_50", partition_key="p")
    assert await store.index_has("idx:ops", "/txn/op/1_6/x", partition_key="p")
    assert await store.index_has("idx:ops", "/txn/op", partition_key="p")
    assert await store.index_has("idx:ops", "/txn/op/1_50")  # every shard, without a partition key
    for absent in ("/txn/op/1_", "/txn/op/1_4", "/txn/op/1_51", "/txn/op/1_500", "/txn/op/1_6", "/txn/op/1_6/",
                   "/txn/op/1_5/x", "/txn", "/txn/o"):
        assert not await store.index_has("idx:ops", absent, partition_key="p"), absent
    assert not await store.index_has("idx:other", "/txn/op/1_5", partition_key="p")
    await store.delete("/c/1_50-01", partition_key="p")
    assert not await store.index_has("idx:ops", "/txn/op/1_50", partition_key="p")


async def test_an_index_is_surely_empty_only_while_no_record_has_an_entry_in_it(store: MetadataStore) -> None:
    # The hot path skips END_TXN's op-record query on its word (CoordinatorPartition._decided): a store may
    # not know (False: ask), but it may never call an index empty that holds an entry.
    await store.put("/c/other", b"", partition_key="p", secondary_indexes={"idx:other": "1"})
    assert not store.index_surely_empty("idx:other")
    await store.put("/c/op", b"", partition_key="p", secondary_indexes={"idx:ops": "/txn/op/1_5"})
    assert not store.index_surely_empty("idx:ops")
    assert await store.index_has("idx:ops", "/txn/op/1_5", partition_key="p")


async def test_index_has_answers_many_at_once(store: MetadataStore) -> None:
    # As END_TXNs of the same moment ask (on Oxia: one Read per shard, index_probes.py), each its own answer.
    await store.put("/c/hit", b"", partition_key="p", secondary_indexes={"n": "k7"})
    answers = await asyncio.gather(*(store.index_has("n", f"k{i}", partition_key="p") for i in range(20)))
    assert answers == [i == 7 for i in range(20)]


async def test_put_replaces_index_entries(store: MetadataStore) -> None:
    await store.put("/c/a", b"", partition_key="p", secondary_indexes={"n": "1", "m": "x"})
    await store.put("/c/a", b"", partition_key="p", secondary_indexes={"n": "5"})
    assert await keys_of(store.scan_index("n", "0", "2", partition_key="p")) == []
    assert await keys_of(store.scan_index("n", "5", "6", partition_key="p")) == ["/c/a"]
    assert await keys_of(store.scan_index("m", "", "~", partition_key="p")) == []
    await store.put("/c/a", b"", partition_key="p")
    assert await keys_of(store.scan_index("n", "", "~", partition_key="p")) == []


async def test_failed_cas_keeps_index_entries(store: MetadataStore) -> None:
    await store.put("/c/a", b"", partition_key="p", secondary_indexes={"n": "1"})
    with pytest.raises(BadVersionError):
        await store.put("/c/a", b"", expected_version=EXPECT_ABSENT, partition_key="p",
                        secondary_indexes={"n": "9"})
    assert await keys_of(store.scan_index("n", "", "~", partition_key="p")) == ["/c/a"]


async def test_delete_removes_index_entries(store: MetadataStore) -> None:
    await store.put("/c/a", b"", partition_key="p", secondary_indexes={"n": "1"})
    await store.put("/c/b", b"", partition_key="p", secondary_indexes={"n": "1"})
    await store.delete("/c/a", partition_key="p")
    assert await keys_of(store.scan_index("n", "", "~", partition_key="p")) == ["/c/b"]


async def test_indexes_are_separate_by_name(store: MetadataStore) -> None:
    await store.put("/c/a", b"", partition_key="p", secondary_indexes={"n": "1", "m": "7"})
    assert await keys_of(store.scan_index("n", "7", "8", partition_key="p")) == []
    assert await keys_of(store.scan_index("m", "7", "8", partition_key="p")) == ["/c/a"]
    assert await keys_of(store.scan_index("other", "", "~", partition_key="p")) == []


async def test_index_scan_scoped_and_across_partition_keys(store: MetadataStore) -> None:
    expected: dict[str, set[str]] = {}
    for pk in ("pa", "pb", "pc"):
        for i in range(3):
            key = f"/c/{pk}/{i}"
            await store.put(key, b"", partition_key=pk, secondary_indexes={"n": f"{i}"})
            expected.setdefault(pk, set()).add(key)
    everything = set().union(*expected.values())
    assert set(await keys_of(store.scan_index("n", "0", "9"))) == everything
    for pk, mine in expected.items():
        # Scoped to one shard: it holds every record of this partition key, maybe others' too (Oxia
        # routes several partition keys to one shard), ordered by secondary key, then key.
        scoped = await collect(store.scan_index("n", "0", "9", partition_key=pk))
        keys = [r.key for r in scoped]
        assert mine <= set(keys) <= everything
        assert len(keys) == len(set(keys))
        order = [(f"{k.rsplit('/', 1)[1]}", k) for k in keys]
        assert order == sorted(order)


# -- scan_prefix ---------------------------------------------------------------------------------------


async def test_scan_prefix_children_only(store: MetadataStore) -> None:
    for key in ("/c/d/x", "/c/d/y", "/c/d/y/z", "/c/d/w/q", "/c/dd", "/c/d", "/c/e/x"):
        await store.put(key, b"")
    assert sorted(await keys_of(store.scan_prefix("/c/d/"))) == ["/c/d/x", "/c/d/y"]
    assert sorted(await keys_of(store.scan_prefix("/c/d/w/"))) == ["/c/d/w/q"]
    assert await keys_of(store.scan_prefix("/c/none/")) == []


async def test_scan_prefix_with_partition_key_is_ordered(store: MetadataStore) -> None:
    for key in ("/c/s/3", "/c/s/1", "/c/s/2"):
        await store.put(key, key.encode(), partition_key="s")
    records = await collect(store.scan_prefix("/c/s/", partition_key="s"))
    assert [r.key for r in records] == ["/c/s/1", "/c/s/2", "/c/s/3"]
    assert [r.value for r in records] == [b"/c/s/1", b"/c/s/2", b"/c/s/3"]


async def test_scan_prefix_of_sequential_keys(store: MetadataStore) -> None:
    keys = [(await store.put_sequential("/c/ev/seg", b"", partition_key="seg")).key for _ in range(12)]
    assert await keys_of(store.scan_prefix("/c/ev/seg-", partition_key="seg")) == keys


async def test_scan_prefix_survives_writes_while_iterating(store: MetadataStore) -> None:
    for i in range(20):
        await store.put(f"/c/it/{i:02d}", b"", partition_key="it")
    seen = []
    async for record in store.scan_prefix("/c/it/", partition_key="it"):
        seen.append(record.key)
        await store.delete(record.key, partition_key="it")
    assert seen == [f"/c/it/{i:02d}" for i in range(20)]


# -- write_batch ---------------------------------------------------------------------------------------


async def test_write_batch_mixed_outcomes(store: MetadataStore) -> None:
    a = await store.put("/c/a", b"1")
    await store.put("/c/b", b"1")
    results = await store.write_batch([
        Put("/c/a", b"2", expected_version=a.version),
        Put("/c/b", b"2", expected_version=EXPECT_ABSENT),
        Delete("/c/none"),
        Delete("/c/b"),
        Put("/c/new", b"n", expected_version=EXPECT_ABSENT),
    ])
    assert [r.outcome for r in results] == [
        Outcome.OK, Outcome.BAD_VERSION, Outcome.NOT_FOUND, Outcome.OK, Outcome.OK]
    assert [r.key for r in results] == ["/c/a", "/c/b", "/c/none", "/c/b", "/c/new"]
    a2 = await store.get("/c/a")
    assert a2 is not None
    assert (a2.value, a2.version) == (b"2", results[0].version)
    assert results[3] == WriteResult(Outcome.OK, "/c/b", -1)
    assert await store.get("/c/b") is None
    new = await store.get("/c/new")
    assert new is not None
    assert new.version == results[4].version


async def test_write_batch_empty(store: MetadataStore) -> None:
    assert await store.write_batch([]) == []


async def test_write_batch_delete_bad_version(store: MetadataStore) -> None:
    a = await store.put("/c/a", b"1")
    await store.put("/c/a", b"2")
    (result,) = await store.write_batch([Delete("/c/a", expected_version=a.version)])
    assert result.outcome is Outcome.BAD_VERSION
    assert await store.get("/c/a") is not None


async def test_concurrent_cas_has_one_winner(store: MetadataStore) -> None:
    base = await store.put("/c/cas", b"0")
    attempts = [store.put("/c/cas", str(i).encode(), expected_version=base.version) for i in range(20)]
    outcomes = await asyncio.gather(*attempts, return_exceptions=True)
    winners = [o for o in outcomes if isinstance(o, Record)]
    assert len(winners) == 1
    assert all(isinstance(o, BadVersionError) for o in outcomes if not isinstance(o, Record))
    assert await store.get("/c/cas") == winners[0]


# -- notifications -------------------------------------------------------------------------------------


async def test_notifications_types_and_order(store: MetadataStore) -> None:
    await store.put("/c/before", b"")
    stream = store.notifications()
    created = await store.put("/c/n", b"1")
    modified = await store.put("/c/n", b"2")
    await store.delete("/c/n")
    assert await take(stream, 3) == [
        Notification(NotificationType.CREATED, "/c/n", created.version),
        Notification(NotificationType.MODIFIED, "/c/n", modified.version),
        Notification(NotificationType.DELETED, "/c/n"),
    ]


async def test_notifications_of_a_key_prefix_only(store: MetadataStore) -> None:
    leaders = store.notifications("/c/leader/")
    everything = store.notifications()
    await store.put("/c/header/1", b"")
    created = await store.put("/c/leader/1", b"")
    await store.write_batch([Put("/c/header/2", b""), Delete("/c/header/1"), Delete("/c/leader/1")])
    last = await store.put("/c/leader/2", b"")
    assert await take(leaders, 3) == [
        Notification(NotificationType.CREATED, "/c/leader/1", created.version),
        Notification(NotificationType.DELETED, "/c/leader/1"),
        Notification(NotificationType.CREATED, "/c/leader/2", last.version),
    ]
    # The same writes in full for a subscriber of every key (the filter is per subscriber).
    assert len(await take(everything, 6)) == 6


async def test_notifications_of_a_batch_in_order(store: MetadataStore) -> None:
    stream = store.notifications()
    results = await store.write_batch([
        Put("/c/x", b""), Put("/c/y", b"", expected_version=12345), Put("/c/z", b""), Delete("/c/x")])
    notes = await take(stream, 3)
    # Order is promised per key only: Oxia v0.14 reports the keys of one write batch in no
    # particular order (newer servers sort them by key).
    assert sorted((n.key, n.type.value) for n in notes) == [
        ("/c/x", NotificationType.CREATED.value), ("/c/x", NotificationType.DELETED.value),
        ("/c/z", NotificationType.CREATED.value)]
    assert [n.type for n in notes if n.key == "/c/x"] == [NotificationType.CREATED, NotificationType.DELETED]
    assert next(n for n in notes if n.key == "/c/z").version == results[2].version


async def test_notifications_of_sequential_put_name_the_generated_key(store: MetadataStore) -> None:
    stream = store.notifications()
    record = await store.put_sequential("/c/q", b"", partition_key="q")
    assert await take(stream, 1) == [Notification(NotificationType.CREATED, record.key, record.version)]


async def test_every_subscriber_sees_every_change(store: MetadataStore) -> None:
    first, second = store.notifications(), store.notifications()
    record = await store.put("/c/k", b"")
    expected = [Notification(NotificationType.CREATED, "/c/k", record.version)]
    assert await take(first, 1) == expected
    assert await take(second, 1) == expected


# -- ephemeral records and sessions --------------------------------------------------------------------


async def test_ephemeral_records_end_with_the_session(open_session: OpenSession) -> None:
    first = await open_session()
    await first.put("/c/leader", b"me", ephemeral=True)
    await first.put("/c/kept", b"")
    # Made persistent by a later non-ephemeral put, as in Oxia.
    await first.put("/c/converted", b"", ephemeral=True)
    await first.put("/c/converted", b"")
    stream = first.notifications()
    assert await first.get("/c/leader") is not None
    await first.close()
    assert [(n.type, n.key) for n in await collect_notes(stream)] == [(NotificationType.DELETED, "/c/leader")]

    second = await open_session()
    assert await second.get("/c/leader") is None
    assert await second.get("/c/kept") is not None
    assert await second.get("/c/converted") is not None


async def collect_notes(stream: AsyncIterator[Notification]) -> list[Notification]:
    return await asyncio.wait_for(_drain(stream), WAIT)


async def _drain(stream: AsyncIterator[Notification]) -> list[Notification]:
    return [note async for note in stream]


async def test_a_batch_makes_only_its_ephemeral_puts_ephemeral(open_session: OpenSession) -> None:
    first = await open_session()
    # One partition key: on Oxia all three go to one shard in one WriteRequest.
    results = await first.write_batch([
        Put("/c/durable-before", b"", partition_key="p"),
        Put("/c/ephemeral", b"", partition_key="p", ephemeral=True),
        Put("/c/durable-after", b"", partition_key="p"),
    ])
    assert [r.outcome for r in results] == [Outcome.OK] * 3
    await first.close()
    second = await open_session()
    assert await second.get("/c/ephemeral", partition_key="p") is None
    assert await second.get("/c/durable-before", partition_key="p") is not None
    assert await second.get("/c/durable-after", partition_key="p") is not None


async def test_ephemeral_index_entries_end_with_the_session(open_session: OpenSession) -> None:
    first = await open_session()
    await first.put("/c/e", b"", partition_key="p", ephemeral=True, secondary_indexes={"n": "1"})
    await first.close()
    second = await open_session()
    assert await keys_of(second.scan_index("n", "", "~", partition_key="p")) == []


# -- closing -------------------------------------------------------------------------------------------


async def test_closed_store_raises(store: MetadataStore) -> None:
    await store.put("/c/k", b"")
    await store.close()
    await store.close()  # closing again is harmless
    with pytest.raises(StoreClosedError):
        await store.get("/c/k")
    with pytest.raises(StoreClosedError):
        await store.put("/c/k", b"")
    with pytest.raises(StoreClosedError):
        await store.put_sequential("/c/s", b"", partition_key="s")
    with pytest.raises(StoreClosedError):
        await store.delete("/c/k")
    with pytest.raises(StoreClosedError):
        await store.write_batch([Put("/c/k", b"")])
    with pytest.raises(StoreClosedError):
        await collect(store.scan_prefix("/c/"))
    with pytest.raises(StoreClosedError):
        await collect(store.scan_index("n", "", "~"))
    with pytest.raises(StoreClosedError):
        store.notifications()


async def test_notification_stream_ends_on_close(store: MetadataStore) -> None:
    stream = store.notifications()
    await store.put("/c/k", b"")
    await store.close()
    assert [n.key for n in await collect_notes(stream)] == ["/c/k"]


# -- Pulsar 5's key forms (docs/record-layout.md) --------------------------------------------------------
#
# The records and index keys a Pulsar 5 broker and tc-server write on a shared store, literally: index
# keys carry the record's parent path ("/txn/id/…", "/txn/op/…"), so a secondary key holds "/", which
# moves it one level deeper under Oxia's hierarchical order. Every store must give the same answers.

DEADLINE = "idx:txn-by-deadline"
OPS_BY_TXN = "idx:ops-by-txn"


async def test_header_index_both_key_forms_stay_apart(store: MetadataStore) -> None:
    # Pulsar 5's deadline keys and tc-server's earlier ones (no parent path), side by side: a scan
    # of one form never returns the other, and each returns exactly the deadlines before its end.
    for least, deadline in ((1, 1795447269230), (2, 1795447269231), (3, 1795447300000)):
        await store.put(f"/txn/id/0_{least}", b"", partition_key=f"0_{least}",
                        secondary_indexes={DEADLINE: f"/txn/id/{deadline:020d}"})
    await store.put("/txn/id/0_4", b"", partition_key="0_4", secondary_indexes={DEADLINE: f"{1795447269230:020d}"})
    before = f"{1795447269231:020d}"
    assert set(await keys_of(store.scan_index(DEADLINE, "/txn/id/" + "0" * 20, "/txn/id/" + before))) == {
        "/txn/id/0_1"}
    assert set(await keys_of(store.scan_index(DEADLINE, "/txn/id/" + "0" * 20, "/txn/id/~"))) == {
        "/txn/id/0_1", "/txn/id/0_2", "/txn/id/0_3"}
    assert set(await keys_of(store.scan_index(DEADLINE, "0" * 20, "~"))) == {"/txn/id/0_4"}
    assert set(await keys_of(store.scan_index(DEADLINE, "0" * 20, before))) == {"/txn/id/0_4"}


async def test_final_state_index_with_parent_path(store: MetadataStore) -> None:
    final = "idx:txn-by-final-state"
    await store.put("/txn/id/0_1", b"", partition_key="0_1",
                    secondary_indexes={final: f"/txn/id/COMMITTED:{1795447210114:020d}"})
    await store.put("/txn/id/0_2", b"", partition_key="0_2",
                    secondary_indexes={final: f"/txn/id/ABORTED:{1795447210114:020d}"})
    await store.put("/txn/id/0_3", b"", partition_key="0_3",
                    secondary_indexes={final: f"/txn/id/COMMITTED:{1795447999999:020d}"})
    found = await keys_of(store.scan_index(final, "/txn/id/COMMITTED:", f"/txn/id/COMMITTED:{1795447210115:020d}"))
    assert set(found) == {"/txn/id/0_1"}
    assert set(await keys_of(store.scan_index(final, "/txn/id/ABORTED:", "/txn/id/ABORTED:~"))) == {"/txn/id/0_2"}


async def test_ops_by_txn_exact_key_with_parent_path(store: MetadataStore) -> None:
    # [k, k + "\x02") is one secondary key on every store (Oxia keeps "<k>\x01<primary>", so the end
    # must sort after \x01); txn 1_1's lookup must not return 1_10's op records.
    mine = [(await store.put_sequential("/txn/op/1_1", b"w", partition_key="1_1",
                                        secondary_indexes={OPS_BY_TXN: "/txn/op/1_1"})).key for _ in range(3)]
    await store.put_sequential("/txn/op/1_10", b"w", partition_key="1_10",
                               secondary_indexes={OPS_BY_TXN: "/txn/op/1_10"})
    assert mine == [sequence_key("/txn/op/1_1", i) for i in (1, 2, 3)]
    scoped = await keys_of(store.scan_index(OPS_BY_TXN, "/txn/op/1_1", "/txn/op/1_1\x02", partition_key="1_1"))
    assert scoped == mine  # one shard: ordered by secondary key, then primary key
    assert set(await keys_of(store.scan_index(OPS_BY_TXN, "/txn/op/1_1", "/txn/op/1_1\x02"))) == set(mine)


async def test_op_records_of_one_txn_by_key_range(store: MetadataStore) -> None:
    # GC's check: every op record of txn 1_1 starts with "/txn/op/1_1-", whatever its index entries.
    indexed = await store.put_sequential("/txn/op/1_1", b"a", partition_key="1_1",
                                         secondary_indexes={OPS_BY_TXN: "/txn/op/1_1"})
    bare = await store.put_sequential("/txn/op/1_1", b"b", partition_key="1_1")
    await store.put_sequential("/txn/op/1_10", b"c", partition_key="1_10")
    await store.put("/txn/op", b"")  # the empty parent Pulsar's Oxia store writes
    assert await keys_of(store.scan_prefix("/txn/op/1_1-", partition_key="1_1")) == [indexed.key, bare.key]
    assert await keys_of(store.scan_prefix("/txn/op/1_10-", partition_key="1_10")) == [
        sequence_key("/txn/op/1_10", 1)]


async def test_event_streams_with_encoded_names(store: MetadataStore) -> None:
    segment = "/txn/segment-events/segment%3A%2F%2Fpublic%2Fdefault%2Forders%2F0"
    subscription = "/txn/subscription-events/segment%3A%2F%2Fpublic%2Fdefault%2Forders%2F0:my+sub"
    seg_pk, sub_pk = segment.rsplit("/", 1)[1], subscription.rsplit("/", 1)[1]
    first = await store.put_sequential(segment, b"1", partition_key=seg_pk)
    second = await store.put_sequential(segment, b"2", partition_key=seg_pk)
    sub = await store.put_sequential(subscription, b"3", partition_key=sub_pk)
    assert [first.key, second.key] == [segment + "-00000000000000000001", segment + "-00000000000000000002"]
    assert sub.key == subscription + "-00000000000000000001"
    assert await keys_of(store.scan_prefix(segment + "-", partition_key=seg_pk)) == [first.key, second.key]
