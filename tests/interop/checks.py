"""Assertions shared by the Java and Go drivers: both clients must see the same coordinator."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from tc_server.bench.process import TcServerProcess
from tests.interop.conftest import COORDINATORS, Harness, HarnessRun, RunningHarness, TcServer, txn_header

# Minimum commits on each side of the kill; a few hundred milliseconds of work at local speed.
COMMITS_PER_PHASE = 50
# Bound on how many headers the kill/restart check reads back through the admin API.
MAX_HEADERS_CHECKED = 2000


def check_concurrent(run: HarnessRun, server: TcServerProcess, count: int) -> None:
    result = run.result
    txns = run.events("txn")
    assert len(txns) == count, run.stderr_tail()
    failures = [t for t in txns if t["outcome"] != "ok"]
    assert not failures, f"{len(failures)} of {count} failed, e.g. {failures[:5]}\n{server.log_tail()}"
    assert result["failed"] == 0
    ids = [(t["most"], t["least"]) for t in txns]
    assert len(set(ids)) == count, "a txn id was handed out twice"
    # NEW_TXN is spread round-robin over every handler, so with count >> 16 each coordinator is used.
    assert {most for most, _ in ids} == set(range(COORDINATORS))
    wrong = []
    for t in txns:
        want = "COMMITTED" if t["action"] == "commit" else "ABORTED"
        code, body = txn_header(server, t["most"], t["least"])
        if code != 200 or body["status"] != want or body["txnId"] != f"({t['most']},{t['least']})":
            wrong.append((t["most"], t["least"], want, code, body))
    assert not wrong, f"{len(wrong)} headers differ from what the client was told, e.g. {wrong[:5]}"


def kill_restart(harness: Harness, server: TcServer, running: list[RunningHarness],
                 tmp_path: Path) -> dict[str, Any]:
    """Commit in a loop, SIGKILL the server, restart it on the same data dir and ports, keep committing.

    Returns what the driver may want to print: the counts and the errors the client saw in the outage.
    """
    stop = tmp_path / "stop-commit-loop"
    loop = harness.spawn("commit-loop", service_url=server.url, until_file=stop, op_timeout_ms=20_000)
    running.append(loop)
    loop.wait_for("ready", 1, 60)
    loop.wait_for("committed", COMMITS_PER_PHASE, 60)
    server.kill()
    killed_at = len(loop.lines)
    time.sleep(1.0)
    server.start()
    restarted_at = len(loop.lines)
    loop.wait_for("committed", COMMITS_PER_PHASE, 90, after=restarted_at)
    stop.touch()
    assert loop.finish(60) == 0, loop.stderr_tail()
    assert loop.lines[-1]["event"] == "result", loop.lines[-1]

    committed = [(c["most"], c["least"]) for c in loop.lines if c["event"] == "committed"]
    assert len(set(committed)) == len(committed), "a txn id was handed out twice across the restart"
    before = [(c["most"], c["least"]) for c in loop.lines[:killed_at] if c["event"] == "committed"]
    after = [(c["most"], c["least"]) for c in loop.lines[restarted_at:] if c["event"] == "committed"]
    highest_before: dict[int, int] = defaultdict(lambda: -1)
    for most, least in before:
        highest_before[most] = max(highest_before[most], least)
    reused = [(most, least) for most, least in after if least <= highest_before[most]]
    assert not reused, f"ids after the restart not above the pre-kill ones: {reused[:5]}\n{server.log_tail()}"

    lost = []
    for most, least in committed[:MAX_HEADERS_CHECKED]:
        code, body = server.txn(most, least)
        if code != 200 or body["status"] != "COMMITTED":
            lost.append((most, least, code, body))
    assert not lost, f"{len(lost)} acknowledged commits not COMMITTED after SIGKILL: {lost[:5]}"
    errors = [line for line in loop.lines if line["event"] == "error"]
    return {"committed": len(committed), "before_kill": len(before), "after_restart": len(after),
            "errors": len(errors), "first_errors": [(e["stage"], e["error"]) for e in errors[:3]]}
