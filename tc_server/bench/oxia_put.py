"""Raw put throughput and latency of tc-server's Oxia client.

    python -m tc_server.bench.oxia_put --address HOST:PORT [--ops N --concurrency C --value-size B]

Measures what the coordinator's store layer costs at most: C tasks each loop ``put`` on distinct
keys under one prefix until N puts are done. Run it against a real Oxia server to get the baseline
the coordinator's throughput is compared with (as a ratio). The header says what the target claims
to be; the caller must say whether it was the real server or the test stand-in.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid

from tc_server.logs import configure_command_logging
from tc_server.store.oxia import connect


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return sorted_values[index]


async def run(address: str, ops: int, concurrency: int, value_size: int, target: str) -> None:
    store = await connect(address)
    prefix = f"/bench/{uuid.uuid4().hex[:8]}/"
    value = b"v" * value_size
    latencies: list[float] = []
    counter = iter(range(ops))

    async def worker() -> None:
        for i in counter:
            start = time.perf_counter()
            await store.put(f"{prefix}{i:010d}", value)
            latencies.append(time.perf_counter() - start)

    try:
        await store.put(f"{prefix}warmup", value)
        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
        batches = sum(w.batches_sent for w in store.writers.values())
        sent = sum(w.ops_sent for w in store.writers.values())
    finally:
        await store.close()
    latencies.sort()
    print(f"# tc-server Oxia client put benchmark against {target} at {address}")
    print(f"# ops={ops} concurrency={concurrency} value_size={value_size}B")
    print(f"throughput_ops_per_s {ops / elapsed:.0f}")
    print(f"latency_p50_ms {percentile(latencies, 0.50) * 1000:.2f}")
    print(f"latency_p99_ms {percentile(latencies, 0.99) * 1000:.2f}")
    print(f"latency_mean_ms {statistics.fmean(latencies) * 1000:.2f}")
    print(f"write_requests {batches} (mean {sent / max(batches, 1):.1f} ops per WriteRequest)")


def main(argv: list[str] | None = None) -> None:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True, help="host:port of an Oxia server")
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--value-size", type=int, default=64, help="bytes per value (Oxia's benchmark: 64)")
    parser.add_argument("--target", default="an Oxia server (unverified)",
                        help="what runs at --address, printed in the header, e.g. 'the test stand-in'")
    args = parser.parse_args(argv)
    if args.ops <= 0 or args.concurrency <= 0:
        sys.exit("--ops and --concurrency must be positive")
    asyncio.run(run(args.address, args.ops, args.concurrency, args.value_size, args.target))


if __name__ == "__main__":
    main()
