"""What telling the brokers costs END_TXN: END_TXN with one participant against END_TXN without any.

    python -m tc_server.bench.delivery [--txns 300] [--store embedded]

Starts a real Pulsar 4.2.4 standalone broker (tc_server/bench/pulsar_broker.py, `make pulsar-broker`)
and one tc-server with ``--upstream-url`` naming it, creates a 4-partition topic, then runs, one at a
time with our wire client (tc_server.client): NEW_TXN + END_TXN(commit) without participants, and
NEW_TXN + ADD_PARTITION_TO_TXN + END_TXN(commit) with one partition. With a participant, ADD writes
its record and END_TXN answers only after the broker acknowledged END_TXN_ON_PARTITION
(docs/participants.md): a lookup (cached after the first), the broker's commit marker, the record's
deletion. Prints p50 / p99 in ms for each.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

from tc_server.bench.process import TcServerProcess
from tc_server.bench.pulsar_broker import PulsarBroker
from tc_server.client import TcClient, connect
from tc_server.logs import configure_command_logging

PARTITIONS = 4
COORDINATORS = 16


def percentile_ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def one_kind(client: TcClient, txns: int, topic: str | None) -> tuple[list[float], list[float]]:
    """(ADD latencies, END_TXN latencies) in seconds; no ADD without a topic."""
    adds: list[float] = []
    ends: list[float] = []
    for i in range(txns):
        opened = await client.new_txn(tc_id=i % COORDINATORS)
        if opened.error is not None:
            raise RuntimeError(f"NEW_TXN failed: {opened}")
        if topic is not None:
            started = time.perf_counter()
            added = await client.add_partition(opened.most, opened.least, f"{topic}-partition-{i % PARTITIONS}")
            adds.append(time.perf_counter() - started)
            if added.error is not None:
                raise RuntimeError(f"ADD_PARTITION_TO_TXN failed: {added}")
        started = time.perf_counter()
        ended = await client.end_txn(opened.most, opened.least, commit=True)
        ends.append(time.perf_counter() - started)
        if ended.error is not None:
            raise RuntimeError(f"END_TXN failed: {ended}")
    return adds, ends


async def measure(server: TcServerProcess, topic: str, txns: int) -> None:
    client = await connect("127.0.0.1", server.port)
    try:
        for label, participant in (("no participant", None), ("one partition", topic)):
            adds, ends = await one_kind(client, txns, participant)
            line = f"{label:>15}: END_TXN p50 {percentile_ms(ends, .5):.2f} / p99 {percentile_ms(ends, .99):.2f} ms"
            if adds:
                line += (f"; ADD_PARTITION_TO_TXN p50 {percentile_ms(adds, .5):.2f}"
                         f" / p99 {percentile_ms(adds, .99):.2f} ms")
            print(line, flush=True)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = argparse.ArgumentParser(prog="python -m tc_server.bench.delivery", description=__doc__.split("\n")[0])
    parser.add_argument("--txns", type=int, default=300, help="transactions of each kind, one at a time")
    parser.add_argument("--store", default="embedded", help="tc-server's --store")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tc-bench-delivery-") as tmp:
        work = Path(tmp)
        broker = PulsarBroker(work / "broker")
        broker.start()
        try:
            topic = f"persistent://public/default/bench-delivery-{uuid.uuid4().hex[:8]}"
            broker.create_topic(topic, PARTITIONS)
            broker.wait_partitions_ready(topic, PARTITIONS)
            server = TcServerProcess(work / "data", "--upstream-url", broker.url,
                                     "--coordinators", str(COORDINATORS), store=args.store)
            server.start()
            try:
                print(f"{args.txns} txns of each kind, one at a time, --store {args.store}, "
                      f"Pulsar 4.2.4 standalone on the same machine", flush=True)
                asyncio.run(measure(server, topic, args.txns))
            finally:
                server.stop()
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
