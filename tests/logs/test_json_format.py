"""--log-format json: every line one JSON object, with the same fields of the same types, whatever process of
tc-server writes it (the supervisor, its workers). Real processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tc_server.bench.process import descendants_of
from tests.logs.support import events, log_lines, not_json
from tests.support.logged import json_objects
from tests.support.server_process import TC_SERVER, ServerProcess, free_port, started

RUN_BOUND_S = 60.0


def run_refused(*args: str) -> list[str]:
    """``tc-server run --log-format json ARGS`` that must refuse to start: its output lines."""
    command = [TC_SERVER, "run", "--log-format", "json", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tc-server {' '.join(args)} started instead of refusing to")
    assert done.returncode != 0, done
    return [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]


def test_a_bad_setting_is_refused_in_a_json_line(tmp_path: Path) -> None:
    # The setting that says JSON was read; the refusal was a plain text line all the same.
    lines = run_refused("--store", "memory", "--admin-listen", "127.0.0.1:0", "--max-frame-size", "0")
    assert not not_json(lines), lines


def test_a_port_in_use_is_refused_in_a_json_line(tmp_path: Path) -> None:
    # By then the logging is configured (JSON lines were written); the refusal was printed as plain text.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        lines = run_refused("--store", "embedded", "--data-dir", str(tmp_path / "data"),
                            "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{free_port()}")
    assert not not_json(lines), lines


def test_a_worker_that_cannot_start_is_said_in_json_lines(tmp_path: Path) -> None:
    # Worker 1's own port (--listen's port + 2) is taken: each of its three tries ended with a plain
    # "tc-server: cannot start: ..." line, passed on by the supervisor, which then ended with a plain
    # "tc-server: worker 1 of 2 failed to start 3 times in a row: ..." line.
    server = ServerProcess(tmp_path / "data", "--coordinators", "2", "--workers", "2")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", server.port + 2))
        taken.listen()
        server.start(wait=False)
        assert server.proc is not None
        code = server.proc.wait(RUN_BOUND_S)
    assert code != 0
    lines = log_lines(server.log_path)
    assert not not_json(lines), not_json(lines)


def test_the_worker_field_has_one_type_in_every_line(tmp_path: Path) -> None:
    # A worker binds worker=<index> (an int) to every line, but its "started" line overrode it with
    # the string "<index> of <N>": one field, two JSON types, which a typed log index (Elasticsearch,
    # Loki's JSON parser into a numeric label, BigQuery) refuses or splits.
    server = started(ServerProcess(tmp_path / "data", "--coordinators", "2", "--workers", "2"))
    try:
        assert server.proc is not None
        workers = [pid for pid in descendants_of(server.proc.pid)
                   if b"--worker-index" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        os.kill(workers[0], signal.SIGKILL)  # a restart: the supervisor's lines about it too
        time.sleep(3)
    finally:
        server.stop()
    found = [e for e in events(server.log_path) if "worker" in e and e["worker"] is not None]
    types = {type(e["worker"]).__name__: e for e in found}
    assert len(types) == 1, {name: json.dumps(e)[:300] for name, e in types.items()}


@pytest.mark.parametrize("level", ["info", "error"])
def test_the_libraries_own_log_lines_are_json_lines_too(level: str) -> None:
    # asyncio's "Task exception was never retrieved", aiohttp's and grpc's lines go through the standard
    # library's logging: with no handler of ours they came out as bare text (logging's last resort),
    # whatever --log-level said. They are JSON lines now, named by logger, at warning and above.
    script = ("import logging; from tc_server.logs import configure_logging; "
              f"configure_logging('json', {level!r}); "
              "logging.getLogger('grpc').info('library chatter'); "
              "logging.getLogger('aiohttp.server').warning('a library warning'); "
              "logging.getLogger('asyncio').error('Task exception was never retrieved', exc_info=ValueError('boom'))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    lines = done.stderr.splitlines()
    assert not not_json(lines), lines
    said = [(line["logger"], line["level"], line["event"]) for line in json_objects(lines)]
    warning = [("aiohttp.server", "warning", "a library warning")] if level == "info" else []
    assert said == [*warning, ("asyncio", "error", "Task exception was never retrieved")], said
    assert "ValueError: boom" in json_objects(lines)[-1]["exception"]
