"""What the tests of this package share: a real ``tc-server run`` started as an operator starts it, and the
console script's other subcommands run as Docker (HEALTHCHECK) or a cron job (export) run them."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.logged import json_objects
from tests.support.server_process import TC_SERVER, ServerProcess

START_TIMEOUT_S = 30.0


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any TC_SERVER_* variable (a developer's shell must not change the test),
    plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TC_SERVER_")}
    return {**env, **extra}


@dataclass
class Outcome:
    """How a start ended: ``code`` None while it runs (it logged "started"), else its exit code."""

    code: int | None
    output: str

    def log_lines(self) -> list[dict[str, Any]]:
        return json_objects(self.output.splitlines())

    def warnings(self) -> list[dict[str, Any]]:
        return [line for line in self.log_lines() if line.get("level") in ("warning", "error")]


@contextmanager
def started(tmp_path: Path, *flags: str,
            env: Mapping[str, str] | None = None) -> Iterator[tuple[ServerProcess, Outcome]]:
    """``tc-server run --store memory`` on free loopback ports with ``flags`` and ``env`` (nothing else from
    TC_SERVER_*): yields once it logged "started" or exited (Outcome.code), then stops it."""
    server = ServerProcess(tmp_path / "data", *flags, store="memory", base_env=clean_env(), env=dict(env or {}),
                           log_path=tmp_path / "tc-server.log")
    server.start(wait=False)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = server.log_path.read_text(errors="replace")
            if not server.running():
                yield server, Outcome(server.proc.returncode if server.proc else None, text)
                return
            if '"event": "started"' in text:
                yield server, Outcome(None, text)
                return
            time.sleep(0.1)
        raise AssertionError(f"tc-server neither started nor exited in {START_TIMEOUT_S:.0f} s\n{server.log_tail()}")
    finally:
        if server.running():
            server.stop()


def start_outcome(tmp_path: Path, *flags: str, env: Mapping[str, str] | None = None) -> Outcome:
    with started(tmp_path, *flags, env=env) as (_, outcome):
        pass
    # Lines logged while it stopped are part of what the operator saw.
    return Outcome(outcome.code, (tmp_path / "tc-server.log").read_text(errors="replace"))


def tc_server(args: Sequence[str], env: Mapping[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """The console script with ``args``, in exactly the environment ``env``."""
    return subprocess.run([TC_SERVER, *args], env=dict(env), capture_output=True, text=True, timeout=timeout_s,
                          check=False)
