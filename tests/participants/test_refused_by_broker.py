"""A broker that refuses tc-server's END_TXN_ON_PARTITION (a real Pulsar 4.2.4 with token authentication
and authorization on, tc-server's own role not a superuser): the decision stands, END_TXN answers after
--participant-wait-s, the refusal is counted with the broker's error and the decision stays in the outbox,
retried slowly (docs/participants.md). Needs `make pulsar-broker`; a missing broker fails the test."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tc_server.bench.process import TcServerProcess
from tc_server.client import connect
from tests.participants.test_real_broker import metric
from tests.security.pki import make_token
from tests.support.pulsar_broker import (
    COORDINATORS,
    TOKEN_PLUGIN,
    PulsarBroker,
    running_broker,
    token_auth_broker,
)
from tests.support.server_process import started, undelivered

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROLE = "tc-server-not-super"  # allowed to produce and consume (so its lookups pass), not a superuser


@pytest.fixture(scope="module")
def secret() -> bytes:
    return os.urandom(32)


@pytest.fixture(scope="module")
def strict_broker(secret: bytes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarBroker]:
    admin = make_token(secret, "HS256", "broker-admin", expires_in_s=None)
    yield from running_broker(token_auth_broker(tmp_path_factory.mktemp("strict-broker"), secret, admin,
                                                super_users="broker-admin"))


async def test_a_refused_decision_stands_and_is_retried(strict_broker: PulsarBroker, secret: bytes,
                                                       tmp_path: Path) -> None:
    code, body = strict_broker.post_json(f"/admin/v2/namespaces/public/default/permissions/{ROLE}",
                                         ["produce", "consume"])
    assert code in (200, 204), (code, body)
    topic = f"persistent://public/default/refused-{uuid.uuid4().hex[:8]}"
    strict_broker.create_topic(topic, 1)
    partition = f"{topic}-partition-0"
    strict_broker.get_json(strict_broker._topic_path(partition) + "/stats")  # load it on the broker
    token_file = tmp_path / "token"
    token_file.write_text(make_token(secret, "HS256", ROLE, expires_in_s=None))
    server = TcServerProcess(tmp_path / "data", "--upstream-url", strict_broker.url,
                             "--coordinators", str(COORDINATORS), "--participant-wait-s", "2",
                             "--broker-client-auth-plugin", TOKEN_PLUGIN,
                             "--broker-client-auth-params", f"file://{token_file}",
                             log_path=tmp_path / "tc-server.log")
    started(server)
    client = await connect("127.0.0.1", server.port)
    try:
        opened = await client.new_txn(tc_id=2)
        assert (await client.add_partition(2, opened.least, partition)).error is None
        ended = await client.end_txn(2, opened.least, commit=True)
        assert ended.error is None, ended  # the decision is durable: answered after the wait
        waiting = await asyncio.to_thread(undelivered, server)
        assert [(w["txnId"], w["status"], w["participants"]) for w in waiting] == [
            (f"(2,{opened.least})", "COMMITTED", [{"topic": partition}])]
        refused = 'tc_server_participant_requests_total{command="END_TXN_ON_PARTITION",outcome="TransactionNotFound"}'
        assert metric(server, refused) >= 1, server.log_tail()
        assert "is not a super user" in server.log_tail(200)
    finally:
        client.close()
        server.stop()
