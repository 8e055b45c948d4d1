"""GC micro-benchmark: the CPU one GC pass costs per collected header.

    python -m tc_server.bench.gc_pass [--headers N] [--store memory|embedded]

Writes N ended headers (half COMMITTED, half ABORTED, over 16 coordinators, no participant or op
records: what sustained pairs leave behind) into a fresh store, then runs one
:func:`~tc_server.coordinator.sweeps.collect_garbage` pass past their retention and prints its wall
time and its CPU time (this process's, the embedded store's writer process included) per deleted header. The
server-level view of the same cost is ``python -m tc_server.bench --rounds R
--server-arg=--gc-retention-s=60`` (docs/performance.md, "Memory store under sustained load").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from tc_server.bench.process import tree_cpu_seconds
from tc_server.coordinator import layout
from tc_server.coordinator.layout import TxnHeader, TxnState
from tc_server.coordinator.sweeps import collect_garbage
from tc_server.logs import configure_command_logging
from tc_server.metrics import Metrics
from tc_server.store import LOCAL_STORE_KINDS, open_store
from tc_server.store.api import MetadataStore, Put

COORDINATORS = 16
RETENTION_S = 60
# Headers written per write_batch while filling the store.
FILL_BATCH = 500


async def fill(store: MetadataStore, headers: int) -> None:
    batch: list[Put] = []
    for number in range(headers):
        most, least = number % COORDINATORS, number // COORDINATORS
        state = TxnState.COMMITTED if number % 2 else TxnState.ABORTED
        header = TxnHeader(state, created_ms=1_000, timeout_ms=60_000, finalized_ms=2_000 + number)
        batch.append(Put(layout.header_path(most, least), header.to_json(), partition_key=layout.txn_key(most, least),
                         secondary_indexes=header.index_entries()))
        if len(batch) == FILL_BATCH:
            await store.write_batch(batch)
            batch = []
    if batch:
        await store.write_batch(batch)


async def run(kind: str, headers: int) -> str:
    with tempfile.TemporaryDirectory(prefix="tc-bench-gc-") as data_dir:
        store = await open_store(kind, data_dir=data_dir)
        try:
            await fill(store, headers)
            after_retention_ms = 2_000 + headers + RETENTION_S * 1000 + 1
            wall, cpu = time.perf_counter(), tree_cpu_seconds(os.getpid())
            result = await collect_garbage(store, Metrics("gc-bench"), after_retention_ms, RETENTION_S)
            wall, cpu = time.perf_counter() - wall, tree_cpu_seconds(os.getpid()) - cpu
        finally:
            await store.close()
    per_header_us = cpu / max(result.deleted, 1) * 1e6
    return (f"{kind:<9} {headers:>9} headers  deleted {result.deleted:>9}  pass {wall:7.2f} s  "
            f"CPU {cpu:7.2f} s  {per_header_us:7.1f} us CPU per deleted header")


def main() -> None:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = argparse.ArgumentParser(prog="python -m tc_server.bench.gc_pass", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--headers", type=int, default=50_000, help="ended headers to collect")
    parser.add_argument("--store", action="append", choices=sorted(LOCAL_STORE_KINDS),
                        help="store kind (repeatable; default memory)")
    args = parser.parse_args()
    if args.headers < 1:
        parser.error("--headers must be at least 1")
    for kind in args.store or ["memory"]:
        print(asyncio.run(run(kind, args.headers)), flush=True)


if __name__ == "__main__":
    main()
