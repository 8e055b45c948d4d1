"""What the embedded store's writer costs per transaction on its own: the SQLite floor under tc-server.

    python -m tc_server.bench.writer_floor [--pairs N] [--group 4 --group 32 ...] [--earlier-shape]
                                           [--page-size BYTES]

The writer process (tc_server/store/sqlite_writer.py) applies each group of writes in one transaction
with one fsync. Here its ``Writer.commit_group`` runs in this process on a file made by the embedded
store, with no channel, no pickling and no event loop. Each group holds what one holds under steady
load: header creates (NEW_TXN, with its ``idx:txn-by-deadline`` entry) and the CAS to COMMITTED of the
previous group's headers (END_TXN, ``idx:txn-by-final-state``), as tc-server writes them, the txns spread
over ``--coordinators`` (16 by default, as a cluster has: each coordinator's headers are a key range of
their own, so a group dirties pages in each of them). Prints the CPU per pair (this process: SQLite's work
and the writer's Python), the wall time per pair and the pages written to the WAL per pair, for each group
size; ``--earlier-shape`` makes the file as tc-server did before 2026-11-30 (its records keyed by their
key), which it still serves; ``--page-size`` makes it with SQLite pages of that size (tc-server's files have
SQLite's default, 4,096). tc-server's groups hold what arrived while the previous one committed
(``tc_server_store_batch_size``).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import structlog

from tc_server.coordinator import layout
from tc_server.coordinator.layout import TxnHeader, TxnState
from tc_server.logs import configure_command_logging
from tc_server.store.api import EXPECT_ABSENT
from tc_server.store.embedded import DB_FILENAME, EmbeddedStore
from tc_server.store.sqlite_writer import PUT, Request, Writer

CREATED_MS = 1_795_447_209_230
TIMEOUT_MS = 60_000


def _put(most: int, least: int, header: TxnHeader, expected_version: int) -> tuple[Any, ...]:
    path = layout.header_path(most, least)
    return (PUT, path, header.to_json(), expected_version, layout.txn_key(most, least), False, False,
            header.index_entries())


def run(directory: Path, pairs: int, group: int, coordinators: int = 16,
        earlier_shape: bool = False, page_size: int | None = None) -> tuple[float, float, float]:
    """(CPU us per pair, wall us per pair, pages written to the WAL per pair) of ``pairs`` pairs in groups
    as tc-server's are under steady load: each group creates ``group`` headers (txn ``n`` of coordinator ``n
    % coordinators``, the clock advancing 1 ms per 12 txns) and ends the previous group's."""
    asyncio.run(_create(directory, earlier_shape, page_size))
    conn = sqlite3.connect(directory / DB_FILENAME, isolation_level=None)
    conn.execute("PRAGMA synchronous=FULL")  # as the writer process sets it
    # The WAL's frames are counted at each checkpoint this loop runs itself (wal_checkpoint answers how many
    # it held), instead of at SQLite's own (1,000 pages), which nothing reports.
    conn.execute("PRAGMA wal_autocheckpoint=0")
    writer = Writer(conn, max_group_ops=2 * group)
    request_id = 0
    pages = 0
    ending: list[tuple[int, int, int, int]] = []  # (most, least, created ms, version) of the previous group
    cpu, wall = time.process_time(), time.perf_counter()
    for first in range(0, pairs + group, group):
        requests: list[Request] = []
        opened_ms = CREATED_MS + first // 12
        opened = TxnHeader(TxnState.OPEN, opened_ms, TIMEOUT_MS)
        for least in range(first, min(first + group, pairs)):
            request_id += 1
            requests.append((request_id, [_put(least % coordinators, least, opened, EXPECT_ABSENT)]))
        for most, least, created_ms, version in ending:
            request_id += 1
            ended = TxnHeader(TxnState.COMMITTED, created_ms, TIMEOUT_MS, opened_ms)
            requests.append((request_id, [_put(most, least, ended, version)]))
        answer = writer.commit_group(requests)
        versions = {outcomes[0][0]: outcomes[0][1] for _, outcomes in answer[2]}
        ending = [(least % coordinators, least, opened_ms,
                   versions[layout.header_path(least % coordinators, least)])
                  for least in range(first, min(first + group, pairs))]
        if first // group % 100 == 99:
            pages += conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    pages += conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    conn.close()
    return cpu / pairs * 1e6, wall / pairs * 1e6, pages / pairs


# The records table of files made before 2026-11-30 (tc_server/store/embedded.py, above _SCHEMA), which
# tc-server still serves as they are: created first, EmbeddedStore.open keeps it.
EARLIER_RECORDS: Final = """
CREATE TABLE records (key TEXT PRIMARY KEY, value BLOB NOT NULL, version INTEGER NOT NULL, created_ms INTEGER NOT NULL,
    modified_ms INTEGER NOT NULL, partition_key TEXT, ephemeral INTEGER NOT NULL DEFAULT 0, entries TEXT) WITHOUT ROWID;
CREATE TABLE index_entries (index_name TEXT NOT NULL, secondary_key TEXT NOT NULL, key TEXT NOT NULL,
    PRIMARY KEY (index_name, secondary_key, key)) WITHOUT ROWID;
CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
"""


async def _create(directory: Path, earlier_shape: bool, page_size: int | None) -> None:
    if earlier_shape or page_size is not None:
        first = sqlite3.connect(directory / DB_FILENAME)
        if page_size is not None:  # a new file takes its page size before anything is written, WAL mode included
            first.execute(f"PRAGMA page_size={page_size:d}")
        first.execute("PRAGMA journal_mode=WAL")
        if earlier_shape:
            first.executescript(EARLIER_RECORDS)
        first.close()
    # The rest of the schema, exactly as tc-server makes it. The open's warning about the earlier shape
    # (tc-server upgrade-store) is left out: this file has it on purpose (and run() is called in-process too).
    with structlog.testing.capture_logs():
        store = await EmbeddedStore.open(directory)
    await store.close()


def main(argv: list[str] | None = None) -> int:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--group", type=int, action="append", help="pairs per group (repeatable)")
    parser.add_argument("--coordinators", type=int, default=16, help="coordinators the txns are spread over")
    parser.add_argument("--earlier-shape", action="store_true",
                        help="records keyed by their key (WITHOUT ROWID), as in files made before 2026-11-30")
    parser.add_argument("--page-size", type=int, choices=[512, 1024, 2048, 4096, 8192, 16384, 32768, 65536],
                        help="SQLite page size of the file in bytes (default: SQLite's, 4096)")
    args = parser.parse_args(argv)
    groups = args.group or [4, 8, 16, 32, 64, 128]
    shape = "records WITHOUT ROWID (files before 2026-11-30)" if args.earlier_shape else "records as files are made now"
    if args.page_size is not None:
        shape += f", pages of {args.page_size} bytes"
    print(f"# the embedded store's writer alone, {args.pairs} pairs of {args.coordinators} coordinators (each group: "
          f"the creates of its txns and the CAS to COMMITTED of the previous group's), {shape}, per group size")
    print(f"{'group':>6} {'CPU/pair':>10} {'wall/pair':>10} {'WAL pages/pair':>15}")
    for group in groups:
        with tempfile.TemporaryDirectory(prefix="tc-writer-floor-") as tmp:
            cpu_us, wall_us, pages = run(Path(tmp), args.pairs, group, args.coordinators, args.earlier_shape,
                                         args.page_size)
        print(f"{group:>6} {cpu_us:>8.1f}us {wall_us:>8.1f}us {pages:>15.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
