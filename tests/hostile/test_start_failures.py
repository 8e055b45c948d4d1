"""Bad settings and unusable files stop ``tc-server run`` with ONE line naming the setting or the file,
exit code 2 and no traceback (issue 15, "Settings without bounds"). Real processes."""

from __future__ import annotations

import hashlib
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tc_server.app import RESERVED_DESCRIPTORS
from tc_server.bench.process import TcServerProcess
from tc_server.config import ConfigError, Settings

# A start that fails must fail long before this; a start that wrongly succeeds is killed by it.
RUN_BOUND_S = 30.0


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "import sys; from tc_server.cli import main; sys.exit(main())", "run",
               "--log-format", "json", "--admin-listen", "127.0.0.1:0", *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=RUN_BOUND_S, cwd=cwd)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tc-server {' '.join(args)} started instead of refusing to")


def assert_one_line(done: subprocess.CompletedProcess[str], *names: str) -> None:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2, lines
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    for name in names:
        assert name in lines[0], lines


@pytest.mark.parametrize(("flag", "value", "named"), [
    # CONNECTED's max_message_size is an int32, and a frame (a uint32 size) adds 10,240 bytes.
    ("--max-message-size", "3000000000", "max_message_size"),
    ("--max-message-size", "0", "max_message_size"),
    # A block reserves ids of a Java long; 2e19 used to work until a restart, then NEW_TXN hung.
    ("--id-block-size", "20000000000000000000", "id_block_size"),
    ("--id-block-size", "0", "id_block_size"),
    ("--listen", "999.1.1.1:6650", "listen"),
    ("--listen", "1.2.3:6650", "listen"),
    ("--admin-listen", "[::zz]:8080", "admin_listen"),
    ("--listen", "bad host:6650", "listen"),
    ("--keepalive-s", "inf", "keepalive_s"),
    ("--keepalive-s", "nan", "keepalive_s"),
    ("--request-timeout-s", "1e300", "request_timeout_s"),
    ("--gc-interval-s", "99999999999999", "gc_interval_s"),
    ("--max-txn-timeout-ms", "9223372036854775807", "max_txn_timeout_ms"),
    ("--max-requests-in-flight", "100000000000", "max_requests_in_flight"),
])
def test_a_value_out_of_range_is_one_line_naming_the_setting(tmp_path: Path, flag: str, value: str,
                                                              named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        from tc_server.config import load_settings
        load_settings(flags={flag[2:].replace("-", "_"): value}, environ={})
    done = run("--store", "embedded", "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:0", flag, value,
               cwd=tmp_path)
    assert_one_line(done, named)


def test_a_file_as_data_dir_is_one_line_naming_it(tmp_path: Path) -> None:
    a_file = tmp_path / "not-a-directory"
    a_file.write_text("")
    done = run("--store", "embedded", "--data-dir", str(a_file), "--listen", "127.0.0.1:0", cwd=tmp_path)
    assert_one_line(done, str(a_file))


def test_an_unresolvable_listen_host_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    done = run("--store", "embedded", "--data-dir", str(tmp_path / "data"), "--listen", "no-such-host.invalid:0",
               cwd=tmp_path)
    assert_one_line(done, "no-such-host.invalid", "--listen")
    assert "unknown error" not in done.stderr


def test_a_damaged_database_file_is_one_line_naming_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "tc-server.sqlite3").write_bytes(b"this is not a database" * 100)
    done = run("--store", "embedded", "--data-dir", str(data), "--listen", "127.0.0.1:0", cwd=tmp_path)
    assert_one_line(done, str(data))


def test_the_defaults_are_within_the_bounds() -> None:
    Settings().validate()


# Sets the descriptor limit, then becomes the command after it: not a preexec_fn, which runs Python between fork
# and exec in this process, whose other threads (gRPC's, from an earlier Oxia test in the same pytest process)
# left the child aborting with SIGABRT before it ran tc-server (a fresh-clone CI run, 2026-12-04).
_WITH_NOFILE = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), "
                "int(sys.argv[2]))); os.execvp(sys.argv[3], sys.argv[3:])")


def _with_nofile(soft: int, hard: int, argv: list[str]) -> list[str]:
    """``argv`` run with a descriptor limit of ``soft`` and ``hard``."""
    return [sys.executable, "-c", _WITH_NOFILE, str(soft), str(hard), *argv]


def test_too_few_descriptors_lower_max_connections_with_one_warning(tmp_path: Path) -> None:
    # A hard limit of 1024 descriptors cannot hold the default 4096 connections: past the descriptor
    # limit accept() fails for everyone, the probes included, so the connection limit is lowered.
    log_path = tmp_path / "server.log"
    server = TcServerProcess(tmp_path / "data", log_path=log_path)  # its log_tail() reads what the run wrote
    with log_path.open("wb") as out:
        proc = subprocess.Popen(_with_nofile(1024, 1024, server.argv), stdout=out, stderr=subprocess.STDOUT)
    try:
        server.proc = proc
        server.wait_ready(RUN_BOUND_S)
    finally:
        proc.kill()
        proc.wait()
    warnings = [line for line in log_path.read_text().splitlines() if "max_connections lowered" in line]
    # What fits beside the descriptors kept for the rest (the admin port's budget, the store, brokers).
    assert len(warnings) == 1 and f'"lowered_to": {1024 - RESERVED_DESCRIPTORS}' in warnings[0], warnings


def test_a_low_soft_descriptor_limit_is_raised_to_fit_max_connections(tmp_path: Path) -> None:
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4096 + 256:
        pytest.fail("this test needs a hard descriptor limit of at least 4352 (ulimit -Hn)")
    log_path = tmp_path / "server.log"
    server = TcServerProcess(tmp_path / "data", log_path=log_path)  # its log_tail() reads what the run wrote
    with log_path.open("wb") as out:
        proc = subprocess.Popen(_with_nofile(1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1], server.argv),
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        server.proc = proc
        server.wait_ready(RUN_BOUND_S)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        soft = next(line.split()[3] for line in limits.splitlines() if line.startswith("Max open files"))
        assert int(soft) >= 4096 + 256
    finally:
        proc.kill()
        proc.wait()


def test_a_workers_record_that_is_not_text_is_one_line_naming_it(tmp_path: Path) -> None:
    """`<data-dir>/workers` holding bytes that are not UTF-8 (a damaged disk block, a stray binary) gave a
    20-line traceback ending in UnicodeDecodeError, exit code 1, no file named (a review's). Now the one line
    the same file with text in it gives ("<data-dir>/workers does not hold a number of workers ...")."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "workers").write_bytes(b"\xff\xfe2\n")
    done = run("--store", "embedded", "--data-dir", str(data), "--listen", "127.0.0.1:0", cwd=tmp_path)
    assert_one_line(done, str(data / "workers"))


def test_a_workers_record_that_is_a_directory_is_named(tmp_path: Path) -> None:
    """`<data-dir>/workers` is a directory: the line said "--data-dir <dir>: Is a directory", false of the
    data directory (a review's); it names <data-dir>/workers now."""
    data = tmp_path / "data"
    (data / "workers").mkdir(parents=True)
    done = run("--store", "embedded", "--data-dir", str(data), "--listen", "127.0.0.1:0", cwd=tmp_path)
    assert_one_line(done, str(data / "workers"))


def test_an_sqlite_file_of_another_program_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    """`<data-dir>/tc-server.sqlite3` is another program's database (a table `people` with a row; a mistyped
    --data-dir, a restored backup of the wrong volume). tc-server started, created its own tables in that file
    and set its user_version (a review's): the other program's file changed, and nothing said so. Refused now
    in one line naming the file, as the read-only open (export) refuses it, the file unchanged."""
    data = tmp_path / "data"
    data.mkdir()
    db = data / "tc-server.sqlite3"
    conn = sqlite3.connect(db)
    conn.executescript("CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT); "
                       "INSERT INTO people VALUES (1, 'ada');")
    conn.close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    done = run("--store", "embedded", "--data-dir", str(data), "--listen", "127.0.0.1:0", cwd=tmp_path)
    assert_one_line(done, str(db))
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_a_deeply_nested_config_file_is_one_line_naming_it(tmp_path: Path) -> None:
    """A --config file holding `a = [[[[...` 3,000 levels deep (a damaged or generated file) gave a traceback
    hundreds of lines long ending in RecursionError, exit code 1 (a review's); one line naming it now."""
    config = tmp_path / "tc-server.toml"
    config.write_text("a = " + "[" * 3000 + "\n")
    done = run("--config", str(config), "--store", "memory", "--listen", "127.0.0.1:0", cwd=tmp_path)
    assert_one_line(done, str(config))
