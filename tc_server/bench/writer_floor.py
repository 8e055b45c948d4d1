"""What the embedded store's writer costs per transaction on its own: the SQLite floor under tc-server.

    python -m tc_server.bench.writer_floor [--pairs N] [--group 4 --group 32 ...]

The writer process (tc_server/store/sqlite_writer.py) applies each group of writes in one transaction
with one fsync. Here its ``Writer.commit_group`` runs in this process on a file made by the embedded
store, with no channel, no pickling and no event loop: per pair, a group of header creates (NEW_TXN,
with its ``idx:txn-by-deadline`` entry) then a group of the same headers' CAS to COMMITTED (END_TXN,
``idx:txn-by-final-state``), as tc-server writes them, the txns spread over ``--coordinators`` (16 by
default, as a cluster has: each coordinator's headers are a key range of their own, so a group dirties
pages in each of them; one coordinator's alone cost a third less). Prints the CPU per pair (this process: SQLite's
work and the writer's Python) and the wall time per pair, for each group size. tc-server's groups hold
what arrived while the previous one committed (``tc_server_store_batch_size``).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from tc_server.coordinator import layout
from tc_server.coordinator.layout import TxnHeader, TxnState
from tc_server.store.api import EXPECT_ABSENT
from tc_server.store.embedded import DB_FILENAME, EmbeddedStore
from tc_server.store.sqlite_writer import PUT, Request, Writer

CREATED_MS = 1_795_447_209_230
TIMEOUT_MS = 60_000


def _put(most: int, least: int, header: TxnHeader, expected_version: int) -> tuple[Any, ...]:
    path = layout.header_path(most, least)
    return (PUT, path, header.to_json(), expected_version, layout.txn_key(most, least), False, False,
            header.index_entries())


def run(directory: Path, pairs: int, group: int, coordinators: int = 16) -> tuple[float, float]:
    """(CPU us per pair, wall us per pair) of ``pairs`` pairs in groups of ``group``, txn ``n`` of
    coordinator ``n % coordinators``."""
    asyncio.run(_create(directory))
    conn = sqlite3.connect(directory / DB_FILENAME, isolation_level=None)
    conn.execute("PRAGMA synchronous=FULL")  # as the writer process sets it
    writer = Writer(conn, max_group_ops=group)
    request_id = 0
    cpu, wall = time.process_time(), time.perf_counter()
    for first in range(0, pairs, group):
        ids = range(first, min(first + group, pairs))
        opened = TxnHeader(TxnState.OPEN, CREATED_MS, TIMEOUT_MS)
        requests: list[Request] = []
        for least in ids:
            request_id += 1
            requests.append((request_id, [_put(least % coordinators, least, opened, EXPECT_ABSENT)]))
        answer = writer.commit_group(requests)
        versions = {outcomes[0][0]: outcomes[0][1] for _, outcomes in answer[2]}
        ended = TxnHeader(TxnState.COMMITTED, CREATED_MS, TIMEOUT_MS, CREATED_MS + 5)
        requests = []
        for least in ids:
            request_id += 1
            most = least % coordinators
            requests.append((request_id, [_put(most, least, ended, versions[layout.header_path(most, least)])]))
        writer.commit_group(requests)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    conn.close()
    return cpu / pairs * 1e6, wall / pairs * 1e6


async def _create(directory: Path) -> None:
    store = await EmbeddedStore.open(directory)  # the schema, exactly as tc-server makes it
    await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--group", type=int, action="append", help="pairs per group (repeatable)")
    parser.add_argument("--coordinators", type=int, default=16, help="coordinators the txns are spread over")
    args = parser.parse_args(argv)
    groups = args.group or [4, 8, 16, 32, 64, 128]
    print(f"# the embedded store's writer alone, {args.pairs} pairs (create, then CAS to COMMITTED) of "
          f"{args.coordinators} coordinators, per group size")
    print(f"{'group':>6} {'CPU/pair':>10} {'wall/pair':>10}")
    for group in groups:
        with tempfile.TemporaryDirectory(prefix="tc-writer-floor-") as tmp:
            cpu_us, wall_us = run(Path(tmp), args.pairs, group, args.coordinators)
        print(f"{group:>6} {cpu_us:>8.1f}us {wall_us:>8.1f}us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
