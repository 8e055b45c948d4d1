"""Start an installed tc-server briefly on the memory store and check its admin endpoints.

    python deploy/smoke.py PATH/TO/bin/tc-server

Used by `make image-check` (on the venv deploy/install.sh built, as the image's builder stage does) and
by tests/deploy. It runs with that venv's Python, where tc_server is installed, and starts the server
with the project's one launcher (tc_server/bench/process.py), which needs nothing beyond the standard
library.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tc_server.bench.process import STOP_TIMEOUT_S, TcServerProcess, free_port

__all__ = ["STOP_TIMEOUT_S", "check_endpoints", "check_graceful_stop", "free_port", "get", "run_server"]


def get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET url; returns (status, body). Raises OSError when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - http://127.0.0.1 only
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


@contextmanager
def run_server(command: Sequence[str], extra_args: Sequence[str] = (),
               env: dict[str, str] | None = None) -> Iterator[TcServerProcess]:
    """Start ``command run --store memory`` on free loopback ports (not waiting for it); SIGTERM on exit.

    The settings are given as flags, and TC_SERVER_* variables of the caller's environment are dropped,
    so that a developer's shell cannot change what is checked.
    """
    clean_env = {k: v for k, v in (env or os.environ).items() if not k.startswith("TC_SERVER_")}
    with tempfile.TemporaryDirectory(prefix="tc-smoke-") as workdir:
        server = TcServerProcess(Path(workdir) / "data", *extra_args, store="memory", command=command,
                                 base_env=clean_env)
        server.start(wait=False)
        try:
            yield server
        finally:
            server.stop()


def check_endpoints(server: TcServerProcess) -> None:
    """/readyz and /healthz answer 200 and /metrics has the coordinator series. Raises RuntimeError."""
    server.wait_ready()
    status, _ = get(server.admin_url + "/healthz")
    if status != 200:
        raise RuntimeError(f"/healthz answered {status} while /readyz answered 200\n{server.log_tail()}")
    status, body = get(server.admin_url + "/metrics")
    if status != 200 or b"pulsar_txn_active_count" not in body:
        raise RuntimeError(f"/metrics answered {status} without pulsar_txn_active_count\n{server.log_tail()}")


def check_graceful_stop(server: TcServerProcess) -> None:
    """SIGTERM stops it with exit code 0 within the launcher's bound. Raises RuntimeError."""
    code = server.stop()
    if code not in (0, -signal.SIGTERM):
        raise RuntimeError(f"tc-server exited with {code} on SIGTERM\n{server.log_tail()}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tc_server", help="path of the tc-server console script to check")
    ns = parser.parse_args(argv)
    subprocess.run([ns.tc_server, "--help"], check=True, stdout=subprocess.DEVNULL)
    try:
        with run_server([ns.tc_server]) as server:
            check_endpoints(server)
            check_graceful_stop(server)
    except (RuntimeError, OSError) as exc:  # every message above carries the server's log tail
        print(f"smoke: {exc}", file=sys.stderr)
        return 1
    print(f"smoke: {ns.tc_server} served /healthz, /readyz and /metrics and stopped on SIGTERM")
    return 0


if __name__ == "__main__":
    sys.exit(main())
