"""The embedded store under more writes than it commits: what succeeds each second, with and without the
queue-delay bound (``EmbeddedStore.open(max_queue_delay_s=...)``, half of ``--request-timeout-s`` in the
server).

    python -m tc_server.bench.overload [--seconds 10] [--load 3] [--timeout-s 1]

The store is opened with one operation per group commit (``max_group_ops=1``: one fsync per write), a
stand-in for a disk slower than the load, so that a 2-core machine can overload it. Its sequential rate is
measured first; then writes are offered at ``--load`` times that rate, each given up after ``--timeout-s``
(as a request's deadline gives it up), and the writes that succeeded in time are counted per second of
offer. Both runs, bounded and unbounded (the store before the bound: every write queued), are in the same
process, one after the other, each on a fresh store.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from tc_server.logs import configure_command_logging
from tc_server.store.embedded import EmbeddedStore

UNBOUNDED_S = 1e9  # a queue delay no run reaches: every write is queued, as before the bound


async def _sequential_rate(store: EmbeddedStore, seconds: float = 1.0) -> float:
    started, count = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        await store.put(f"/rate/{count}", b"x")
        count += 1
    return count / seconds


async def _run(directory: Path, max_queue_delay_s: float, load: float, seconds: int, timeout_s: float) -> list[str]:
    store = await EmbeddedStore.open(directory, max_group_ops=1, max_queue_delay_s=max_queue_delay_s)
    try:
        rate = await _sequential_rate(store)
        per_tick = max(1, round(rate * load / 100))  # offered every 10 ms

        async def write(key: str) -> bool:
            try:
                await asyncio.wait_for(store.put(key, b"v" * 100), timeout_s)
            except Exception:  # noqa: BLE001 - refused, failed or given up: not a success
                return False
            return True

        offered: list[list[asyncio.Task[bool]]] = []
        for second in range(seconds):
            batch: list[asyncio.Task[bool]] = []
            started = time.monotonic()
            while time.monotonic() - started < 1.0:
                batch.extend(asyncio.ensure_future(write(f"/load/{second}/{len(batch)}")) for _ in range(per_tick))
                await asyncio.sleep(0.01)
            offered.append(batch)
        await asyncio.gather(*(task for batch in offered for task in batch))
        left = len(store._pending)
        lines = [f"  sequential rate {rate:,.0f} writes/s; offered {load:g}x, each given up after {timeout_s:g} s"]
        for second, batch in enumerate(offered):
            succeeded = sum(task.result() for task in batch)
            lines.append(f"  second {second:>2}: offered {len(batch):>6,}  succeeded {succeeded:>6,}")
        total = sum(task.result() for batch in offered for task in batch)
        lines.append(f"  succeeded in all {total:,} of {sum(map(len, offered)):,}; "
                     f"writes still queued at the end: {left:,}")
        return lines
    finally:
        await store.close()


async def _main(args: argparse.Namespace) -> None:
    bound = args.max_queue_delay_s if args.max_queue_delay_s is not None else args.timeout_s / 2
    runs = ((f"bounded (max_queue_delay_s={bound:g})", bound), ("unbounded (every write queued)", UNBOUNDED_S))
    for title, delay in runs:
        workdir = Path(tempfile.mkdtemp(prefix="tc-bench-overload-"))
        try:
            print(title)
            for line in await _run(workdir, delay, args.load, args.seconds, args.timeout_s):
                print(line)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = argparse.ArgumentParser(prog="python -m tc_server.bench.overload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10, help="seconds of offered load")
    parser.add_argument("--load", type=float, default=3.0, help="offered rate, times the sequential rate")
    parser.add_argument("--timeout-s", type=float, default=1.0, help="each write is given up after this")
    parser.add_argument("--max-queue-delay-s", type=float, default=None, help="the bound (default: timeout / 2)")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
