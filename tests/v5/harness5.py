"""Runs the v5 SDK harness (tests/v5/java, pulsar-client-v5 5.0.0-M1) and reads its JSON lines.

``make pulsar-broker5`` (mk/broker5.mk) builds it next to the broker's jars, with the same Java 21+
(tests/v5/broker5.py's find_java21): target/classes and target/lib/*.jar, then target/harness.stamp.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.v5.broker5 import MAKE_COMMAND, find_java21

HARNESS_DIR = Path(__file__).resolve().parent / "java" / "target"
HARNESS_STAMP = HARNESS_DIR / "harness.stamp"
MAIN_CLASS = "org.tcserver.v5.Harness"


class HarnessMissing(RuntimeError):
    pass


@dataclass
class HarnessRun:
    """One harness process: its JSON lines (``events``), exit code and stderr (the client's own log)."""

    argv: list[str]
    returncode: int
    events: list[dict[str, Any]]
    stderr: str

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == kind]

    def values(self, kind: str) -> list[str]:
        return [str(e["value"]) for e in self.of(kind)]

    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.of("done"))

    def describe(self) -> str:
        tail = "\n".join(line for line in self.stderr.splitlines() if not line.startswith("WARNING"))[-3000:]
        return f"{' '.join(self.argv[-6:])}: exit {self.returncode}, events {self.events}\nstderr tail:\n{tail}"


def run_harness(*args: str, timeout_s: float = 180.0) -> HarnessRun:
    """``produce URL TOPIC COUNT PREFIX commit|abort|plain`` or ``consume URL TOPIC SUB UNTIL TIMEOUT_S``
    (see Harness.java). Raises HarnessMissing naming the make target when it is not built."""
    if not HARNESS_STAMP.exists():
        raise HarnessMissing(f"the v5 SDK harness is not built ({HARNESS_DIR}): run `{MAKE_COMMAND}`")
    java = find_java21()
    # The client unpacks a native checksum library into java.io.tmpdir at every start and leaves it there.
    with tempfile.TemporaryDirectory(prefix="tc-v5-harness-") as tmp:
        argv = [java, f"-Djava.io.tmpdir={tmp}", "-cp", f"{HARNESS_DIR / 'classes'}:{HARNESS_DIR / 'lib'}/*",
                MAIN_CLASS, *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    events = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            events.append(json.loads(line))
    return HarnessRun(argv, proc.returncode, events, proc.stderr)
