"""The STAND-IN Oxia server (tests/oxia_standin) in its own process.

For tests whose own thread blocks (waiting on a JVM, a tc-server subprocess): the in-process form
(``StandinOxia`` on the test's event loop) would stall while they wait. It is the stand-in, not Oxia:
the real server cannot be installed here (the Go module proxy refuses github.com/oxia-db/oxia).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A Python process that imports grpc and binds one port per shard; seconds on a loaded machine.
START_TIMEOUT_S = 30.0


class StandinStartError(RuntimeError):
    """The stand-in exited or printed no ``listening HOST:PORT`` line in time; the message holds its log."""


@contextmanager
def standin_oxia_process(log_path: Path, shards: int = 3) -> Iterator[str]:
    """Run ``python -m tests.oxia_standin --shards N``; yields its ``HOST:PORT``, SIGTERM on exit.

    Raises StandinStartError when it does not come up.
    """
    with standin_oxia_and_process(log_path, shards) as (address, _):
        yield address


@contextmanager
def standin_oxia_and_process(log_path: Path, shards: int = 3) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """:func:`standin_oxia_process`, also yielding the process (a test that stops it, as a partition would)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        # Output to a file, not a pipe: a pipe nobody reads after the first line would fill up and block it.
        proc = subprocess.Popen([sys.executable, "-m", "tests.oxia_standin", "--shards", str(shards)],
                                stdout=log, stderr=log, cwd=REPO, start_new_session=True)
    try:
        yield _wait_listening(proc, log_path), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # one a test stopped takes the SIGTERM at once
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _wait_listening(proc: subprocess.Popen[bytes], log_path: Path) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in log_path.read_text(errors="replace").splitlines():
            words = line.split()
            if len(words) == 2 and words[0] == "listening":
                return words[1]
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait(10)
    raise StandinStartError(f"the Oxia stand-in did not start (exit {proc.returncode}); its output:\n"
                            + log_path.read_text(errors="replace")[-3000:])
