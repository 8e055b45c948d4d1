"""The commands beside the server (``tc-server export``, ``upgrade-store``) and the benchmarks log warnings and
errors to stderr (tc_server/logs.py, configure_command_logging): their stdout is what they print. Unconfigured,
structlog writes to stdout, and a store's warning landed among a benchmark's table (the test that read that table
failed)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from tc_server.cli import main
from tc_server.store.embedded import EmbeddedStore

COMMAND = """
import structlog
from tc_server.logs import configure_command_logging
configure_command_logging()
log = structlog.get_logger("tc_server.store")
log.info("an info line a command leaves out")
log.warning("a warning the operator must see", path="/data")
print("the command's table")
"""


def test_a_command_prints_on_stdout_and_logs_warnings_on_stderr() -> None:
    done = subprocess.run([sys.executable, "-c", COMMAND], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == "the command's table\n"
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr  # stderr is no terminal: JSON lines, as tc-server run's
    line = json.loads(lines[0])
    assert (line["event"], line["level"], line["path"], line["logger"]) == \
        ("a warning the operator must see", "warning", "/data", "tc_server.store")


def test_tc_server_export_logs_as_a_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def write() -> None:
        store = await EmbeddedStore.open(tmp_path / "data")
        await store.close()

    asyncio.run(write())
    assert main(["export", "--store", "embedded", "--data-dir", str(tmp_path / "data"), "--out",
                 str(tmp_path / "snap")]) == 0
    capsys.readouterr()
    structlog.get_logger("tc_server.store").warning("after the export")
    structlog.get_logger("tc_server.store").info("left out")
    out, err = capsys.readouterr()
    assert out == "" and "after the export" in err and "left out" not in err, (out, err)
    # Loggers are not cached under a command's configuration: a later structlog.configure (capture_logs, the
    # tests') still reaches them.
    with structlog.testing.capture_logs() as captured:
        structlog.get_logger("tc_server.store").warning("captured")
    assert [entry["event"] for entry in captured] == ["captured"]
