"""Measure the audit job: ``python -m tc_server.audit.bench --txns 10000000 [--workdir DIR]``.

Generates a snapshot of ``--txns`` transactions (~3 ops each, a few of every anomaly) or reuses one
made earlier with the same parameters, audits it, checks the counts against the generator's spec, and
prints the generate time, the audit time and the audit's throughput in rows (headers + ops) per second.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from tc_server.audit import generate, job

DEFAULT_ANOMALIES = "open_past_deadline=10,gc_backlog=10,orphan_ops=10,late_ops=10,id_reuse_risk=10,illegal_headers=12"


def _reusable(snapshot: Path, txns: int, seed: int, anomalies: dict[str, int]) -> bool:
    try:
        doc = json.loads((snapshot / "snapshot.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    gen = doc.get("generator") or {}
    return bool(gen.get("txns") == txns and gen.get("seed") == seed and gen.get("anomalies") == anomalies)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tc_server.audit.bench", description=__doc__)
    parser.add_argument("--txns", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=Path("audit-bench"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--anomalies", default=DEFAULT_ANOMALIES)
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    parser.add_argument("--driver-memory", default=None)
    parser.add_argument("--regenerate", action="store_true", help="do not reuse an existing snapshot")
    args = parser.parse_args(argv)

    anomalies = generate.parse_spec(args.anomalies)
    snapshot = args.workdir / f"snapshot-{args.txns}-seed{args.seed}"
    out = args.workdir / f"audit-{args.txns}"
    if args.regenerate or not _reusable(snapshot, args.txns, args.seed, anomalies):
        shutil.rmtree(snapshot, ignore_errors=True)
        started = time.monotonic()
        doc = generate.generate_snapshot(snapshot, txns=args.txns, anomalies=anomalies, seed=args.seed)
        gen_s = time.monotonic() - started
        print(f"generate: {args.txns:,} txns in {gen_s:.1f} s ({args.txns / gen_s:,.0f} txns/s)", flush=True)
    else:
        doc = json.loads((snapshot / "snapshot.json").read_text())
        print(f"generate: reusing {snapshot}", flush=True)
    size = sum(f.stat().st_size for f in snapshot.rglob("*.parquet"))
    rows = doc["row_counts"]["headers"] + doc["row_counts"]["ops"]
    print(
        f"snapshot: {doc['row_counts']['headers']:,} headers + {doc['row_counts']['ops']:,} ops = {rows:,} rows, "
        f"{size / 2**20:,.0f} MiB of Parquet",
        flush=True,
    )

    shutil.rmtree(out, ignore_errors=True)
    started = time.monotonic()
    spark, owned = job.spark_session(args.master, args.driver_memory)
    spark_s = time.monotonic() - started
    try:
        started = time.monotonic()
        summary = job.run_audit(spark, str(snapshot), str(out))
        audit_s = time.monotonic() - started
        master = spark.sparkContext.master
        memory = spark.sparkContext.getConf().get("spark.driver.memory", "default")
    finally:
        if owned:
            spark.stop()
    print(f"spark:    session start {spark_s:.1f} s (master {master}, driver memory {memory})")
    print(f"audit:    {audit_s:.1f} s, {rows / audit_s:,.0f} rows/s (headers + ops)")
    expected = generate.expected_violations(anomalies)
    ok = summary["violations"] == expected
    print(f"check:    violations {'match' if ok else 'DO NOT match'} the generator's spec: {summary['violations']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
