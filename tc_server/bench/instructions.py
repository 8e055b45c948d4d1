"""tc-server's CPU per transaction as instructions, which a noisy shared machine does not move.

    python -m tc_server.bench.instructions [--pairs 2000] [--concurrency 32] [--store embedded]
                                           [--baseline-src DIR] [--server-arg FLAG]

Runs tc-server under valgrind's callgrind (``--trace-children=yes``: the embedded store's writer process
too), drives it with the project's own load (``python -m tc_server.bench``'s: NEW_TXN then END_TXN, half
commit, half abort, ``--concurrency`` pairs in flight on one connection per coordinator), and prints the
instructions each process executed per pair across exactly the counted pairs (callgrind_control zeroes
the counters after a warm-up and dumps them after the last pair).

Why: on this project's machine kind the speed of the same code moved by ~45 % within minutes (issue 13),
so a change of a few percent in CPU time per pair is lost among alternated runs of the Java benchmarks.
Instruction counts of the same code and load repeat within ~0.5 %. They are not time: a system call or a
cache miss counts as little, and the load's batching differs from the Java load's (tc-server runs ~50x
slower under valgrind, so its requests arrive in full batches). Use this to compare two versions of the
code (``--baseline-src DIR``, e.g. ``git archive <commit> tc_server | tar -x -C DIR``), and the Java
benchmarks (``make bench-vs-pulsar``) for time and for Pulsar.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tc_server.bench.__main__ import run_load
from tc_server.bench.process import (
    ServerStartError,
    TcServerProcess,
    baseline_env,
    baseline_src,
    descendants_of,
    keep_or_remove,
)
from tc_server.bench.pulsar_broker import REPO
from tc_server.logs import configure_command_logging

# tc-server's start under callgrind takes about a minute on the 2-core machine (imports at ~50x).
READY_TIMEOUT_S = 600.0
# How long a dump may take to appear after callgrind_control asked for it.
DUMP_TIMEOUT_S = 120.0
WRITER_MARK = "sqlite_writer"  # in the writer process's command line (tc_server/store/sqlite_writer.py)


@dataclass(frozen=True)
class Dump:
    """One callgrind dump of one process: its command line and the instructions it counted."""

    pid: int
    command: str
    instructions: int

    @property
    def role(self) -> str:
        return "store writer" if WRITER_MARK in self.command else "event loop"


def check_valgrind() -> None:
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (Debian: `apt-get install valgrind`)")


def callgrind_command(out_dir: Path) -> list[str]:
    """The valgrind prefix: callgrind on the process and its children, one dump file per process and dump."""
    return ["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={out_dir}/callgrind.%p"]


def parse_dump(text: str) -> tuple[str, str, int]:
    """A callgrind dump's (command line, trigger, total instructions), from its header lines
    (``cmd:``, ``desc: Trigger:``, ``summary:``). Raises ValueError naming what is missing."""
    found = {}
    for name, pattern in (("cmd", r"^cmd:\s*(.*)$"), ("trigger", r"^desc: Trigger: (.*)$"),
                          ("summary", r"^summary: (\d+)$")):
        match = re.search(pattern, text, re.MULTILINE)
        if match is None:
            raise ValueError(f"callgrind dump without a '{name}' line")
        found[name] = match.group(1)
    return found["cmd"], found["trigger"], int(found["summary"])


def zero_counters(pids: list[int]) -> None:
    subprocess.run(["callgrind_control", "--zero", *map(str, pids)], check=True, capture_output=True)


def dump_counters(pids: list[int], out_dir: Path, hint: str) -> list[Dump]:
    """Ask each process for a dump named ``hint``; its instructions since the last zero."""
    subprocess.run(["callgrind_control", f"--dump={hint}", *map(str, pids)], check=True, capture_output=True)
    deadline = time.monotonic() + DUMP_TIMEOUT_S
    dumps: dict[int, Dump] = {}
    while len(dumps) < len(pids):
        for pid in pids:
            for path in out_dir.glob(f"callgrind.{pid}.*"):
                try:
                    command, trigger, total = parse_dump(path.read_text(errors="replace")[:8192])
                except ValueError:
                    continue  # still being written
                if trigger == f"dump {hint}":
                    dumps[pid] = Dump(pid, command, total)
        if len(dumps) < len(pids):
            if time.monotonic() > deadline:
                raise SystemExit(f"callgrind wrote no dump '{hint}' for {sorted(set(pids) - set(dumps))} "
                                 f"within {DUMP_TIMEOUT_S:.0f} s")
            time.sleep(0.5)
    return [dumps[pid] for pid in pids]


def measure(name: str, args: argparse.Namespace, workdir: Path, env: dict[str, str]) -> tuple[int, list[Dump]]:
    """Start tc-server under callgrind, warm it up, count ``args.pairs``: (pairs done, a dump per process)."""
    out_dir = workdir / f"callgrind-{name}"
    out_dir.mkdir()
    # -P: no current directory on sys.path, so the tree on PYTHONPATH is what runs.
    command = [*callgrind_command(out_dir), sys.executable, "-P", "-c",
               "import sys; from tc_server.cli import main; sys.exit(main())"]
    server = TcServerProcess(workdir / f"data-{name}", "--log-level", "warning", "--coordinators",
                             str(args.coordinators), *args.server_arg, store=args.store, env=env, command=command,
                             log_path=workdir / f"{name}.log")
    try:
        try:
            server.start(timeout_s=READY_TIMEOUT_S)
        except ServerStartError as exc:
            raise SystemExit(str(exc)) from None
        assert server.proc is not None
        if args.warmup:
            asyncio.run(run_load(server.port, args.warmup, 1, args.concurrency, args.coordinators))
        pids = [server.proc.pid, *descendants_of(server.proc.pid)]
        zero_counters(pids)
        result = asyncio.run(run_load(server.port, args.pairs, 1, args.concurrency, args.coordinators))
        dumps = dump_counters(pids, out_dir, f"counted-{name}")
        if result["errors"]:
            raise SystemExit(f"{name}: {result['errors']} pairs failed; see {server.log_path}")
        return int(result["pairs"]), dumps
    finally:
        server.stop(timeout_s=120)


def main(argv: list[str] | None = None) -> int:
    configure_command_logging()  # stdout is the table's (tc_server/logs.py)
    parser = argparse.ArgumentParser(prog="python -m tc_server.bench.instructions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=2_000, help="counted pairs")
    parser.add_argument("--warmup", type=int, default=200, help="uncounted pairs first")
    parser.add_argument("--concurrency", type=int, default=32, help="pairs in flight")
    parser.add_argument("--coordinators", type=int, default=16)
    parser.add_argument("--store", choices=["embedded", "memory"], default="embedded")
    parser.add_argument("--baseline-src", type=baseline_src,
                        help="directory holding another tc_server/ package: measured the same way after this one")
    parser.add_argument("--server-arg", action="append", default=[], help="extra tc-server run flag")
    parser.add_argument("--keep-workdir", action="store_true", help="keep logs, data and dumps (printed path)")
    args = parser.parse_args(argv)
    check_valgrind()

    print(f"# tc-server instructions per pair under callgrind: {platform.machine()}, Python "
          f"{platform.python_version()}, store {args.store}; {args.pairs} pairs counted after {args.warmup}, "
          f"{args.concurrency} in flight (NEW_TXN then END_TXN)", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="tc-instructions-"))
    # Each side's tree first on its PYTHONPATH (the -P start keeps the current directory off sys.path).
    trees: list[tuple[str, dict[str, str]]] = [("this tree", baseline_env(REPO))]
    if args.baseline_src is not None:
        trees.append(("baseline", baseline_env(args.baseline_src)))
    totals: dict[str, float] = {}
    try:
        print(f"{'code':<10} {'process':<13} {'instructions/pair':>18}")
        for name, env in trees:
            pairs, dumps = measure(name.replace(" ", "-"), args, workdir, env)
            for dump in dumps:
                print(f"{name:<10} {dump.role:<13} {dump.instructions / pairs:>18,.0f}")
            totals[name] = sum(dump.instructions for dump in dumps) / pairs
            print(f"{name:<10} {'all':<13} {totals[name]:>18,.0f}", flush=True)
        if "baseline" in totals:
            print(f"this tree / baseline: {totals['this tree'] / totals['baseline']:.3f}")
    finally:
        keep_or_remove(workdir, args.keep_workdir, "logs, data and callgrind dumps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
