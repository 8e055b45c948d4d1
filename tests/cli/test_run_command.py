"""What a person running ``tc-server run`` sees: a quiet orderly stop, bind errors that name the address and
the setting, and /metrics without ``*_created`` series. Real processes on loopback ports."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tc_server.bench.process import free_port

# Starting (imports, SQLite, 16 elections) takes about a second; a loaded 2-core machine needs more.
START_BOUND_S = 30.0


def tc_server(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from tc_server.cli import main; sys.exit(main())", *args]


@pytest.fixture
def held_port() -> Iterator[str]:
    """A loopback address some other program is listening on (outside the ephemeral range, of which
    tc-server warns: free_port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
        sock.listen()
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def log_events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def wait_for_event(proc: subprocess.Popen[bytes], path: Path, event: str) -> dict[str, object]:
    deadline = time.monotonic() + START_BOUND_S
    while time.monotonic() < deadline:
        found = [e for e in log_events(path) if e.get("event") == event]
        if found:
            return found[0]
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"no {event!r} log line; output:\n{path.read_text()}")


def test_orderly_stop_logs_its_start_and_its_end_and_metrics_have_no_created_series(tmp_path: Path) -> None:
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            tc_server("run", "--store", "embedded", "--data-dir", str(tmp_path / "data"),
                      "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json"),
            stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_event(proc, log_path, "started")
        admin = next(e["address"] for e in log_events(log_path) if e.get("event") == "admin listening")
        with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as response:
            exposition = response.read().decode()
        names = {line.split("{")[0].split(" ")[0] for line in exposition.splitlines() if not line.startswith("#")}
        assert "pulsar_txn_created_total" in names
        assert not [name for name in names if name.endswith("_created")]
        before = len(log_events(log_path))
        proc.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    after = log_events(log_path)[before:]
    # The signal's line at once (a stop can take seconds; it says a second signal exits at once), then
    # one line when done: nothing per coordinator or connection.
    assert [e["event"] for e in after] == ["stopping", "stopped"], log_path.read_text()



# tc-server whose embedded store's close fails with EIO after closing (a disk that failed as the stop ended).
FAILING_CLOSE = """
import errno, sys
from tc_server.store.embedded import EmbeddedStore
closed = EmbeddedStore.close
async def close_then_fail(self):
    await closed(self)
    raise OSError(errno.EIO, "Input/output error")
EmbeddedStore.close = close_then_fail
from tc_server.cli import main
sys.exit(main())
"""


def test_a_stop_that_fails_is_said_as_such_not_as_a_failure_to_start(tmp_path: Path) -> None:
    # A step of the stop failing on a system call: the line said "cannot start: [Errno 5] Input/output error" with
    # exit code 2, which says a setting or file is wrong.
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", FAILING_CLOSE, "run", "--store", "embedded", "--data-dir", str(tmp_path / "data"),
             "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_event(proc, log_path, "started")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 1, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    last = log_events(log_path)[-1]
    assert last["level"] == "error" and last["event"] == (
        "tc-server: the stop did not finish: OSError: [Errno 5] Input/output error"), log_path.read_text()


@pytest.mark.parametrize(("flag", "env"), [("--listen", "TC_SERVER_LISTEN"),
                                           ("--admin-listen", "TC_SERVER_ADMIN_LISTEN")])
def test_address_in_use_names_the_address_and_the_setting(tmp_path: Path, held_port: str, flag: str,
                                                          env: str) -> None:
    ports = {"--listen": "127.0.0.1:0", "--admin-listen": "127.0.0.1:0", flag: held_port}
    done = subprocess.run(
        tc_server("run", "--store", "embedded", "--data-dir", str(tmp_path / "data"), "--log-format", "json",
                  *[word for pair in ports.items() for word in pair]),
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 2  # every failure to start (issue 15)
    assert f"tc-server: cannot start: address already in use: {held_port} ({flag} / {env})" in done.stderr
    # Nothing a person would take for a second problem: no warning, no traceback.
    assert '"warning"' not in done.stderr and "Traceback" not in done.stderr, done.stderr
