"""Open transactions per principal (issue 15): one authenticated role at --max-open-transactions-per-principal
gets NotAllowedError (the answer the per-coordinator limit gives) naming its count and the setting, across
every coordinator of the instance, while another role is still served; ending one of its txns makes room.
The count is rebuilt from the headers' owner after a kill -9 (a real process, real token authentication)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

from tc_server.bench.process import TcServerProcess
from tc_server.client import TcClient, connect
from tc_server.wire import ServerError
from tests.security.pki import data_url, make_token
from tests.security.support import token_auth
from tests.support.server_process import started

LIMIT = 3
# Recovery runs in the background after /readyz says 200: how long to wait for the open txns to be tracked.
RECOVERY_WAIT_S = 30.0


async def client_of(port: int, secret: bytes, role: str) -> TcClient:
    return await connect("127.0.0.1", port, auth=token_auth(make_token(secret, "HS256", role)))


def assert_refused_at_limit(answer, role: str, count: int) -> None:
    assert answer.error is ServerError.NotAllowedError, answer
    assert f"principal {role!r} has {count} open transactions" in answer.message
    assert "--max-open-transactions-per-principal" in answer.message


async def test_a_principal_at_its_limit_is_refused_another_is_served(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      max_open_transactions_per_principal=LIMIT)
    alice, bob = await client_of(app.listener.port, secret, "alice"), await client_of(app.listener.port, secret, "bob")
    try:
        # Spread over coordinators: the limit is the instance's, not a coordinator's.
        opened = [await alice.new_txn(tc_id=i, ttl_ms=60_000) for i in range(LIMIT)]
        assert [txn.error for txn in opened] == [None] * LIMIT
        refused = await alice.new_txn(tc_id=3)
        assert_refused_at_limit(refused, "alice", LIMIT)
        assert refused.most == 3  # the Java client routes the answer by it
        assert (await bob.new_txn(tc_id=3)).error is None
        # Ending one (commit, abort or the admin's force-abort alike) gives the slot back.
        assert (await alice.end_txn(opened[0].most, opened[0].least, commit=False)).error is None
        again = await alice.new_txn(tc_id=3)
        assert again.error is None
        assert_refused_at_limit(await alice.new_txn(tc_id=0), "alice", LIMIT)
        assert app.coordinator.open_by_principal.snapshot() == {"alice": LIMIT, "bob": 1}
    finally:
        alice.close()
        bob.close()


async def test_concurrent_new_txns_of_one_principal_do_not_overshoot(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      max_open_transactions_per_principal=LIMIT)
    alice = await client_of(app.listener.port, secret, "alice")
    try:
        answers = await asyncio.gather(*(alice.new_txn(tc_id=i % 4, ttl_ms=60_000) for i in range(4 * LIMIT)))
        assert sum(answer.error is None for answer in answers) == LIMIT
        assert {answer.error for answer in answers} == {None, ServerError.NotAllowedError}
    finally:
        alice.close()


async def test_timed_out_txns_leave_the_count(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      max_open_transactions_per_principal=1)
    alice = await client_of(app.listener.port, secret, "alice")
    try:
        assert (await alice.new_txn(tc_id=0, ttl_ms=1)).error is None
        deadline = time.monotonic() + RECOVERY_WAIT_S
        while app.coordinator.open_by_principal.count("alice"):  # the timeout sweep aborts it within ~1 s
            assert time.monotonic() < deadline, "the timed-out txn is still counted"
            await asyncio.sleep(0.05)
        assert (await alice.new_txn(tc_id=0, ttl_ms=60_000)).error is None
    finally:
        alice.close()


async def test_without_authentication_there_is_no_principal_limit(start):
    app = await start(max_open_transactions_per_principal=1)
    client = await connect("127.0.0.1", app.listener.port)
    try:
        answers = [await client.new_txn(tc_id=0) for _ in range(3)]
        assert [answer.error for answer in answers] == [None] * 3
        assert app.coordinator.open_by_principal.snapshot() == {}
    finally:
        client.close()


def tracked_open_txns(server: TcServerProcess, admin_token: str) -> int:
    """Open txns the coordinators track, from coordinatorStats (a superuser's token: the admin API is
    authenticated too)."""
    request = urllib.request.Request(server.admin_url + "/admin/v3/transactions/coordinatorStats",
                                     headers={"Authorization": f"Bearer {admin_token}"})
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback
        stats = json.loads(response.read())
    return sum(partition["ongoingTxnSize"] for partition in stats.values())


async def test_the_count_is_rebuilt_after_kill_9(tmp_path: Path, secret: bytes) -> None:
    server = started(TcServerProcess(
        tmp_path / "data", "--coordinators", "4", "--authentication-providers", "token",
        "--token-secret-key", data_url(secret), "--superuser-roles", "admin",
        "--max-open-transactions-per-principal", str(LIMIT),
        log_path=tmp_path / "tc-server.log"))
    try:
        alice = await client_of(server.port, secret, "alice")
        opened = [await alice.new_txn(tc_id=i, ttl_ms=3_600_000) for i in range(LIMIT)]
        assert [txn.error for txn in opened] == [None] * LIMIT
        alice.close()
        server.kill()  # SIGKILL: the counts are memory only; the headers' owner is what survives
        server.start()
        deadline = time.monotonic() + RECOVERY_WAIT_S
        admin_token = make_token(secret, "HS256", "admin")
        while tracked_open_txns(server, admin_token) < LIMIT:
            assert time.monotonic() < deadline, f"open txns not recovered\n{server.log_tail()}"
            await asyncio.sleep(0.1)
        alice = await client_of(server.port, secret, "alice")
        bob = await client_of(server.port, secret, "bob")
        try:
            assert_refused_at_limit(await alice.new_txn(tc_id=1), "alice", LIMIT)
            assert (await bob.new_txn(tc_id=1)).error is None
            # A recovered txn's header is read on its first request; ending it frees the slot.
            assert (await alice.end_txn(opened[2].most, opened[2].least, commit=True)).error is None
            assert (await alice.new_txn(tc_id=2)).error is None
            assert_refused_at_limit(await alice.new_txn(tc_id=2), "alice", LIMIT)
        finally:
            alice.close()
            bob.close()
    finally:
        server.kill()
