"""tc-server as a real subprocess, for tests that kill it, restart it, or point real Pulsar clients at it.

The launcher is tc_server/bench/process.py, shared with the benchmarks and deploy/smoke.py; the names
below are what the tests import. ``ServerProcess(data_dir, *extra_args, store=..., env=...)`` starts
nothing until ``start()``; ``start()`` raises ServerStartError (a RuntimeError) with the log tail.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from tc_server.bench.process import ServerStartError, TcServerProcess, free_port

# The console script of the test venv, for tests that call its other subcommands (``export``).
TC_SERVER = str(Path(sys.executable).with_name("tc-server"))
ServerProcess = TcServerProcess

__all__ = ["TC_SERVER", "ServerProcess", "ServerStartError", "free_port", "started", "undelivered"]


class _Startable(Protocol):
    def start(self) -> Any: ...
    def kill(self) -> None: ...


P = TypeVar("P", bound=_Startable)


def started(process: P, what: str = "tc-server", errors: type[Exception] = ServerStartError, hint: str = "") -> P:
    """``process`` (a tc-server or a broker), started; one that raises ``errors`` instead is killed and fails
    the test with the error (its log tail) and ``hint``. It never skips (docs/architecture.md §9)."""
    try:
        process.start()
    except errors as exc:
        process.kill()
        pytest.fail(f"{what} did not start: {exc}{hint}")
    return process


def undelivered(server: TcServerProcess, timeout_s: float = 10.0) -> list[Any]:
    """tc-server's outbox (``GET /admin/v3/transactions/undelivered``): the decided txns some participant broker
    has not acknowledged yet. An answer other than 200, or none, fails the test: an outbox not read is not an
    empty one (a loop waiting for it to empty ended early on a 2 s read timeout before)."""
    try:
        status, body = server.get_json("/admin/v3/transactions/undelivered", timeout_s=timeout_s)
    except OSError as exc:
        pytest.fail(f"the outbox not read: {exc}\n{server.log_tail()}")
    assert status == 200 and isinstance(body, list), (status, body)
    return body
