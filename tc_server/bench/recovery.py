"""Recovery benchmark: open N transactions, kill -9 the server, restart it on the same store and
time how long until it is ready and serves again (docs/architecture.md §6: recovery is an index scan
bounded by the open txns, not a log replay).

    python -m tc_server.bench.recovery [--open N] [--store embedded] [--server-arg=...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

from tc_server.bench.__main__ import bench_server
from tc_server.client import connect
from tc_server.store import DURABLE_STORE_KINDS


async def open_txns(port: int, count: int, coordinators: int) -> None:
    client = await connect("127.0.0.1", port)
    in_flight = 512
    for start in range(0, count, in_flight):
        batch = range(start, min(count, start + in_flight))
        answers = await asyncio.gather(*(client.new_txn(tc_id=i % coordinators, ttl_ms=3_600_000) for i in batch))
        assert all(a.error is None for a in answers), answers[0]
    client.close()


async def first_new_txn(port: int) -> float:
    started = time.perf_counter()
    client = await connect("127.0.0.1", port)
    answer = await client.new_txn(tc_id=0)
    assert answer.error is None
    client.close()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tc_server.bench.recovery", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--open", type=int, default=50_000, help="open transactions at the kill")
    parser.add_argument("--store", default="embedded", choices=DURABLE_STORE_KINDS)
    parser.add_argument("--coordinators", type=int, default=16)
    parser.add_argument("--server-arg", action="append", default=[])
    args = parser.parse_args(argv)
    extra = ["--coordinators", str(args.coordinators), *args.server_arg]
    with bench_server(args.store, extra) as server:
        asyncio.run(open_txns(server.port, args.open, args.coordinators))
        server.kill()
        started = time.perf_counter()
        server.start(wait=False)  # the same command: same ports, same store
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
            _, stats = server.get_json("/admin/v3/transactions/coordinatorStats")
            tracked = sum(partition["ongoingTxnSize"] for partition in stats.values())
            if tracked >= args.open:
                recovered = time.perf_counter() - started
                break
            time.sleep(0.05)
    print(f"# recovery after kill -9, {args.store} store, {args.open} open txns, {os.cpu_count()} cores")
    print(f"restart to ready: {ready:.2f} s; to leading all {args.coordinators} coordinators: {leads_all:.2f} s; "
          f"first NEW_TXN after that: {served * 1000:.1f} ms; all {args.open} open txns tracked again: "
          f"{recovered:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
