"""Recovery benchmark: open N transactions, kill -9 the server, restart it on the same store and
time how long until it is ready and serves again (docs/architecture.md §6: recovery is an index scan
bounded by the open txns, not a log replay).

    python -m tc_server.bench.recovery [--open N] [--store embedded] [--memory-limit-mib M] [--server-arg=...]

With ``--memory-limit-mib`` the restarted process runs in a memory cgroup of that limit (the one the
Kubernetes manifests set is 256; tc_server/bench/memory_limit.py), as a pod would after an OOM kill;
the txns are opened before, without it. Past 160,000 open txns raise the per-coordinator limit:
``--server-arg=--max-active-transactions-per-coordinator=0``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from tc_server.bench.__main__ import bench_server
from tc_server.bench.memory_limit import MIB, MemoryLimit, open_memory_limit
from tc_server.bench.process import rss_bytes_of
from tc_server.client import connect
from tc_server.logs import configure_command_logging
from tc_server.store import DURABLE_STORE_KINDS


async def open_txns(port: int, count: int, coordinators: int) -> None:
    client = await connect("127.0.0.1", port)
    in_flight = 512
    started = time.perf_counter()
    for start in range(0, count, in_flight):
        batch = range(start, min(count, start + in_flight))
        answers = await asyncio.gather(*(client.new_txn(tc_id=i % coordinators, ttl_ms=3_600_000) for i in batch))
        failed = [a for a in answers if a.error is not None]
        if failed:
            raise SystemExit(f"NEW_TXN failed after {start} open: {failed[0]}")
        if start and start % 50_000 < in_flight:
            print(f"  {start} open ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    client.close()


async def first_new_txn(port: int) -> float:
    started = time.perf_counter()
    client = await connect("127.0.0.1", port)
    answer = await client.new_txn(tc_id=0)
    assert answer.error is None
    client.close()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = argparse.ArgumentParser(prog="python -m tc_server.bench.recovery", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--open", type=int, default=50_000, help="open transactions at the kill")
    parser.add_argument("--store", default="embedded", choices=DURABLE_STORE_KINDS)
    parser.add_argument("--coordinators", type=int, default=16)
    parser.add_argument("--memory-limit-mib", type=int, default=0,
                        help="restart the killed server in a memory cgroup of this limit (0: none)")
    parser.add_argument("--server-arg", action="append", default=[])
    args = parser.parse_args(argv)
    extra = ["--coordinators", str(args.coordinators), *args.server_arg]
    limit: MemoryLimit | None = open_memory_limit(args.memory_limit_mib * MIB) if args.memory_limit_mib else None
    try:
        return measure(args, extra, limit)
    finally:
        if limit is not None:
            limit.close()


def measure(args: argparse.Namespace, extra: list[str], limit: MemoryLimit | None) -> int:
    with bench_server(args.store, extra) as server:
        asyncio.run(open_txns(server.port, args.open, args.coordinators))
        before_kill = server.rss_bytes()
        server.kill()
        if limit is not None:
            server.command = limit.wrap(server.command)
        started = time.perf_counter()
        server.start(wait=False)  # the same flags: same ports, same store
        ready = leads_all = None
        # On Oxia the dead process's leader records live until its session times out
        # (--oxia-session-timeout-ms), so "ready" (every coordinator has a leader) comes before
        # "leads every coordinator"; on the embedded store they coincide.
        while leads_all is None:
            if not server.running():
                print(f"tc-server exited:\n{server.log_tail()}", file=sys.stderr)
                return 1
            try:
                code, body = server.get_json("/readyz", timeout_s=1)
            except OSError:
                code, body = 0, None
            if code == 200 and isinstance(body, dict):
                ready = ready if ready is not None else time.perf_counter() - started
                if len(body["led"]) == args.coordinators:
                    leads_all = time.perf_counter() - started
            time.sleep(0.02)
        served = asyncio.run(first_new_txn(server.port))
        # The open txns are loaded in the background after winning (their timeouts wait for it).
        while True:
            if not server.running():
                oom = f" (OOM kills in its group: {limit.oom_kills()})" if limit is not None else ""
                print(f"tc-server exited while recovering{oom}:\n{server.log_tail()}", file=sys.stderr)
                return 1
            try:
                _, stats = server.get_json("/admin/v3/transactions/coordinatorStats")
            except OSError:
                time.sleep(0.1)  # killed meanwhile (the OOM killer): the check above says so
                continue
            tracked = sum(partition["ongoingTxnSize"] for partition in stats.values())
            if tracked >= args.open:
                recovered = time.perf_counter() - started
                break
            time.sleep(0.05)
        assert server.proc is not None
        peak_rss, rss_now = rss_bytes_of(server.proc.pid, "VmHWM"), server.rss_bytes()
    print(f"# recovery after kill -9, {args.store} store, {args.open} open txns, {os.cpu_count()} cores")
    print(f"restart to ready: {ready:.2f} s; to leading all {args.coordinators} coordinators: {leads_all:.2f} s; "
          f"first NEW_TXN after that: {served * 1000:.1f} ms; all {args.open} open txns tracked again: "
          f"{recovered:.2f} s")
    print(f"RSS of the process that opened them, at the kill: {before_kill / MIB:.0f} MiB; after the restart: "
          f"peak {peak_rss / MIB:.0f} MiB, {rss_now / MIB:.0f} MiB once all were tracked")
    if limit is not None:
        print(f"under {limit.describe()}: the group's peak charge {limit.peak_bytes() / MIB:.0f} MiB (page cache "
              f"included), OOM kills {limit.oom_kills()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
