"""The callgrind plumbing of ``python -m tc_server.bench.instructions`` (make bench-instructions), on a
real valgrind: counters zeroed and dumped on request in a running process, the dump read back. (The whole
benchmark runs tc-server under callgrind, about a minute per start: not part of the suite.)"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tc_server.bench import instructions
from tc_server.bench.instructions import Dump, dump_counters, parse_dump, zero_counters

BUSY = "import itertools\nfor i in itertools.count():\n    sum(range(100))\n"


def test_a_running_process_is_zeroed_then_dumped_under_a_name(tmp_path: Path) -> None:
    instructions.check_valgrind()  # fails, never skips, where valgrind is missing
    proc = subprocess.Popen([*instructions.callgrind_command(tmp_path), sys.executable, "-c", BUSY],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:  # callgrind_control finds the process once valgrind has started it
            status = subprocess.run(["callgrind_control", "--stat", str(proc.pid)], capture_output=True, text=True)
            if "Events collected" in status.stdout or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        zero_counters([proc.pid])
        (dump,) = dump_counters([proc.pid], tmp_path, "counted-test")
    finally:
        proc.terminate()  # not SIGKILL: valgrind removes its vgdb pipes from /tmp as it exits
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert dump.pid == proc.pid and dump.role == "event loop" and sys.executable in dump.command
    assert dump.instructions > 0


def test_parse_dump_reads_the_header_and_names_what_is_missing() -> None:
    header = ("# callgrind format\nversion: 1\ncmd:  /usr/bin/python3 -I -S -c import sys; "
              "from tc_server.store.sqlite_writer import main\npart: 1\n\ndesc: Trigger: dump counted-x\n\n"
              "events: Ir\nsummary: 784487607\n\nfn=(1) main\n")
    command, trigger, total = parse_dump(header)
    assert (trigger, total) == ("dump counted-x", 784_487_607)
    assert Dump(1, command, total).role == "store writer"
    with pytest.raises(ValueError, match="'summary'"):
        parse_dump(header.replace("summary:", "totals:"))
