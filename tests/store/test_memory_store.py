"""The memory store's own property beyond the conformance suite: what it retains costs Python's cyclic
garbage collector nothing per record (docs/performance.md, "Memory store under sustained load": with ~100,000
retained headers, ~300,000 tracked objects made every full collection take 250-450 ms)."""

from __future__ import annotations

import gc

from tc_server.store.api import Put, Record
from tc_server.store.memory import MemoryStore

RECORDS = 2_000


async def test_retained_records_add_no_objects_for_the_cyclic_gc_and_read_back_unchanged() -> None:
    store = MemoryStore()
    gc.collect()
    tracked_before = len(gc.get_objects())
    for n in range(RECORDS):
        await store.write_batch([Put(f"/txn/{n:06d}", f"header {n}".encode(), ephemeral=n % 2 == 0,
                                     secondary_indexes={"idx:by-n": f"{n:06d}", "idx:by-parity": str(n % 2)})])
    written = [await store.get(f"/txn/{n:06d}") for n in range(RECORDS)]
    del written[:]
    gc.collect()
    # The store's containers grow (sorted-list chunks: one per ~1,000 entries), its records do not count.
    grown = len(gc.get_objects()) - tracked_before
    assert grown < RECORDS // 20, f"{grown} more objects tracked by the cyclic GC after {RECORDS} records"

    # The records, and their index entries, are as written.
    first = await store.get("/txn/000007")
    assert isinstance(first, Record)
    assert (first.key, first.value, first.created_ms <= first.modified_ms) == ("/txn/000007", b"header 7", True)
    odd = [record.key async for record in store.scan_index("idx:by-parity", "1", "2")]
    assert odd == [f"/txn/{n:06d}" for n in range(1, RECORDS, 2)]
    assert [record.value async for record in store.scan_index("idx:by-n", "000010", "000012")] == \
        [b"header 10", b"header 11"]
    await store.close()
    # Closing the session deleted its ephemeral (even-numbered) records and their index entries.
    other = MemoryStore(store.backend)
    assert await other.get("/txn/000008") is None
    assert [record.key async for record in other.scan_index("idx:by-n", "000008", "000010")] == ["/txn/000009"]
