"""``tc-audit``: run the audit job, or generate a synthetic snapshot.

    tc-audit --input DIR --output DIR [--master URL] [--now-ms T] [--retention-s S] [--gc-interval-s I] [--grace-s G]
    tc-audit generate --txns N --out DIR [--seed S] [--anomalies open_past_deadline=5,orphan_ops=3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tc_server.audit import job

GENERATE = "generate"


def _generate(argv: list[str], prog: str) -> int:
    # Imported here: the job itself does not need the generator, nor the generator Spark.
    from tc_server.audit import generate

    parser = argparse.ArgumentParser(
        prog=f"{prog} {GENERATE}",
        description="Write a synthetic snapshot with an exact number of each anomaly.",
    )
    parser.add_argument("--txns", type=int, required=True, help="headers in total (normal + anomalous)")
    parser.add_argument("--out", type=Path, required=True, help="snapshot directory to create")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--anomalies",
        default="",
        help=f"NAME=COUNT,... with NAME in {', '.join(generate.ANOMALIES)} (default: none)",
    )
    parser.add_argument("--now-ms", type=int, default=generate.DEFAULT_NOW_MS, help="the snapshot's time")
    parser.add_argument("--coordinators", type=int, default=generate.DEFAULT_COORDINATORS)
    args = parser.parse_args(argv)
    if args.txns < 0:
        print(f"{prog} {GENERATE}: --txns must be >= 0", file=sys.stderr)
        return job.EXIT_BAD_INPUT
    try:
        anomalies = generate.parse_spec(args.anomalies)
        doc = generate.generate_snapshot(
            args.out,
            txns=args.txns,
            anomalies=anomalies,
            seed=args.seed,
            now_ms=args.now_ms,
            coordinators=args.coordinators,
        )
    except (ValueError, FileExistsError) as exc:
        print(f"{prog} {GENERATE}: {exc}", file=sys.stderr)
        return job.EXIT_BAD_INPUT
    rows = doc["row_counts"]
    print(
        f"generated {rows['headers']:,} headers, {rows['ops']:,} ops, {rows['tc_seq']:,} tc-seq rows "
        f"in {args.out}"
    )
    return job.EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tc-audit`` and ``python -m tc_server.audit``; returns the exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    prog = "tc-audit"
    if args and args[0] == GENERATE:
        return _generate(args[1:], prog)
    return job.main(args, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
