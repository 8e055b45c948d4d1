"""Ownership across a kill -9 of a real tc-server process (embedded store): the header's ``owner`` is what
the check reads, so after a SIGKILL and a start on the same data another role still cannot end or add to
the txn; its owner and a superuser still can."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tc_server.client import connect
from tc_server.wire import ServerError
from tests.security.support import Keys, token_auth
from tests.support.server_process import ServerProcess, started

TOPIC = "persistent://public/default/orders-partition-0"


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@pytest.fixture(scope="module")
def server(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    workdir = tmp_path_factory.mktemp("restart-owner")
    key_file = workdir / "secret.key"
    key_file.write_bytes(keys.secret)
    proc = started(ServerProcess(workdir / "data", "--authentication-providers", "token",
                                 "--token-secret-key", f"file://{key_file}", "--superuser-roles", "ops",
                                 "--coordinators", "4", log_path=workdir / "tc-server.log"))
    yield proc
    proc.kill()


async def _client(server: ServerProcess, keys: Keys, role: str):
    return await connect("127.0.0.1", server.port, auth=token_auth(keys.token(role)))


async def test_owner_is_remembered_after_a_kill_and_restart(server: ServerProcess, keys: Keys) -> None:
    alice = await _client(server, keys, "alice")
    txn = await alice.new_txn(tc_id=2, ttl_ms=120_000)
    assert txn.error is None
    assert (await alice.add_partition(txn.most, txn.least, TOPIC)).error is None
    alice.close()
    server.restart()
    bob = await _client(server, keys, "bob")
    alice = await _client(server, keys, "alice")
    try:
        for answer in (await bob.add_partition(txn.most, txn.least, TOPIC),
                       await bob.add_subscription(txn.most, txn.least, TOPIC, "s"),
                       await bob.end_txn(txn.most, txn.least, commit=False)):
            assert answer.error is ServerError.TransactionNotFound, answer
        assert (await alice.end_txn(txn.most, txn.least, commit=True)).error is None
    finally:
        bob.close()
        alice.close()


async def test_superuser_ends_anothers_txn_after_restart(server: ServerProcess, keys: Keys) -> None:
    alice = await _client(server, keys, "alice")
    txn = await alice.new_txn(tc_id=3, ttl_ms=120_000)
    alice.close()
    server.restart()
    ops = await _client(server, keys, "ops")
    try:
        assert (await ops.end_txn(txn.most, txn.least, commit=False)).error is None
    finally:
        ops.close()
