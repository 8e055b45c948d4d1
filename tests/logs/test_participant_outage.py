"""A participant broker nobody can reach while transactions with participants commit (the upstream URL
that lookups go to is a port nothing listens on): what the log says. Real tc-server processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tc_server.client import connect
from tests.logs.support import events, named
from tests.support.server_process import ServerProcess, free_port, started
from tests.support.waiting import async_wait_for

TXNS = 40
EARLY_ANSWER = "answering END_TXN before every participant acknowledged; delivery continues"


async def commit_with_participants(port: int, count: int) -> None:
    """``count`` transactions, each with one partition participant, committed (answered after
    --participant-wait-s, since no broker acknowledges)."""
    client = await connect("127.0.0.1", port)
    try:
        async def one(i: int) -> None:
            opened = await client.new_txn(tc_id=0)
            assert opened.error is None, opened
            added = await client.add_partition(opened.most, opened.least, f"persistent://public/default/t{i}")
            assert getattr(added, "error", None) is None, added
            ended = await asyncio.wait_for(client.end_txn(opened.most, opened.least, commit=True), 30)
            assert ended.error is None, ended

        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        client.close()


def outage_server(tmp_path: Path, *extra: str) -> ServerProcess:
    nobody = free_port()  # nothing listens there: every lookup of a participant's broker is refused
    return started(ServerProcess(tmp_path / "data", "--coordinators", "1",
                                 "--upstream-url", f"pulsar://127.0.0.1:{nobody}",
                                 "--participant-wait-s", "1", *extra))


async def test_an_unreachable_participant_broker_is_not_one_line_per_transaction(tmp_path: Path) -> None:
    # Every END_TXN waits --participant-wait-s, then was answered with an info line of its own: one
    # line per committed transaction for as long as the broker is down, unlike the delivery failures
    # themselves (LogLimiter, one a second).
    server = outage_server(tmp_path)
    try:
        await commit_with_participants(server.port, TXNS)
    finally:
        server.stop()
    lines = named(server.log_path, EARLY_ANSWER)
    # One a second: the 40 answers come within about a second of each other, over more on a slow machine (CI),
    # never one line each.
    assert len(lines) <= 8, (f"{len(lines)} lines {EARLY_ANSWER!r} for {TXNS} transactions; "
                             f"first: {lines[:1]}")


async def test_an_unreachable_participant_broker_is_said_at_log_level_warning(tmp_path: Path) -> None:
    # With --log-level warning (a production setting), decisions that reach no broker for seconds on end
    # were never said: every delivery failure was an info line.
    server = outage_server(tmp_path, "--log-level", "warning")
    try:
        await commit_with_participants(server.port, 5)
        # The deliveries go on failing: their retries come further apart (0.1 s doubling to 5 s, each up to
        # half shorter), and one comes after FAILING_WARN_AFTER_S (5 s) of failing, ~12 s in on a quiet machine.
        await async_wait_for(lambda: [e for e in events(server.log_path) if e.get("level") in ("warning", "error")],
                             "a warning about decisions undeliverable for seconds on end, at --log-level warning "
                             "(the delivery failures are info lines)", step_s=0.2)
    finally:
        server.stop()
