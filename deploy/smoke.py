"""Start an installed tc-server briefly on the memory store and check its admin endpoints.

    python deploy/smoke.py PATH/TO/bin/tc-server

Used by `make image-check` (on the venv deploy/install.sh built, as the image's builder stage does) and
by tests/deploy. Standard library only, so any Python 3.11 can run it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

# The server has to bind, open the memory store and lead its coordinators; a cold interpreter start with
# grpc and protobuf imports takes a few seconds on a loaded CI machine.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Running:
    process: subprocess.Popen[bytes]
    pulsar_port: int
    admin_port: int

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"


def get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET url; returns (status, body). Raises OSError when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - http://127.0.0.1 only
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def wait_for(running: Running, path: str, timeout: float = START_TIMEOUT_S) -> bytes:
    """Poll path until it answers 200. Raises RuntimeError (with the server's output) otherwise."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            raise RuntimeError(f"tc-server exited with {running.process.returncode} before {path} answered")
        try:
            status, body = get(running.admin_url + path)
        except OSError as exc:
            last = str(exc)
        else:
            if status == 200:
                return body
            last = f"HTTP {status}: {body[:200]!r}"
        time.sleep(0.2)
    raise RuntimeError(f"{path} did not answer 200 within {timeout:.0f}s (last: {last})")


@contextmanager
def run_server(command: Sequence[str], extra_args: Sequence[str] = (),
               env: dict[str, str] | None = None) -> Iterator[Running]:
    """Run ``command run --store memory`` on free loopback ports; stop it with SIGTERM on exit.

    The settings are given as flags, and TC_SERVER_* variables of the caller's environment are dropped,
    so that a developer's shell cannot change what is checked.
    """
    pulsar_port, admin_port = free_port(), free_port()
    clean_env = {k: v for k, v in (env or os.environ).items() if not k.startswith("TC_SERVER_")}
    args = [*command, "run", "--store", "memory",
            "--listen", f"127.0.0.1:{pulsar_port}", "--admin-listen", f"127.0.0.1:{admin_port}",
            "--log-format", "json", *extra_args]
    process = subprocess.Popen(args, env=clean_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        yield Running(process, pulsar_port, admin_port)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def check_endpoints(running: Running) -> None:
    """/healthz and /readyz answer 200 and /metrics has the coordinator series. Raises RuntimeError."""
    wait_for(running, "/healthz")
    wait_for(running, "/readyz")
    status, body = get(running.admin_url + "/metrics")
    if status != 200 or b"pulsar_txn_active_count" not in body:
        raise RuntimeError(f"/metrics answered {status} without pulsar_txn_active_count")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tc_server", help="path of the tc-server console script to check")
    ns = parser.parse_args(argv)
    subprocess.run([ns.tc_server, "--help"], check=True, stdout=subprocess.DEVNULL)
    with run_server([ns.tc_server]) as running:
        try:
            check_endpoints(running)
        except RuntimeError as exc:
            running.process.send_signal(signal.SIGTERM)
            out = running.process.communicate(timeout=STOP_TIMEOUT_S)[0]
            print(f"smoke: {exc}\n--- tc-server output ---\n{out.decode(errors='replace')}", file=sys.stderr)
            return 1
    code = running.process.returncode
    if code not in (0, -signal.SIGTERM):
        print(f"smoke: tc-server exited with {code} on SIGTERM", file=sys.stderr)
        return 1
    print(f"smoke: {ns.tc_server} served /healthz, /readyz and /metrics and stopped on SIGTERM")
    return 0


if __name__ == "__main__":
    sys.exit(main())
