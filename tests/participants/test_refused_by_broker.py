"""A broker that refuses tc-server's END_TXN_ON_PARTITION (a real Pulsar 4.2.4 with token authentication
and authorization on, tc-server's own role not a superuser): the decision stands, END_TXN answers after
--participant-wait-s, the refusal is counted with the broker's error and the decision stays in the outbox,
retried slowly (docs/participants.md). Needs `make pulsar-broker`; a missing broker fails the test."""

from __future__ import annotations

import asyncio
import base64
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tc_server.bench.process import ServerStartError, TcServerProcess
from tc_server.client import connect
from tests.participants.test_real_broker import metric, undelivered
from tests.security.pki import make_token
from tests.support.pulsar_broker import COORDINATORS, MAKE_COMMAND, BrokerStartError, PulsarBroker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOKEN_PROVIDER = "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
ROLE = "tc-server-not-super"  # allowed to produce and consume (so its lookups pass), not a superuser


@pytest.fixture(scope="module")
def secret() -> bytes:
    return os.urandom(32)


@pytest.fixture(scope="module")
def strict_broker(secret: bytes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarBroker]:
    admin = make_token(secret, "HS256", "broker-admin", expires_in_s=None)
    broker = PulsarBroker(tmp_path_factory.mktemp("strict-broker"), extra_config={
        "authenticationEnabled": "true",
        "authorizationEnabled": "true",
        "authenticationProviders": TOKEN_PROVIDER,
        "tokenSecretKey": "data:;base64," + base64.b64encode(secret).decode(),
        "superUserRoles": "broker-admin",
        "brokerClientAuthenticationPlugin": TOKEN_PLUGIN,
        "brokerClientAuthenticationParameters": f"token:{admin}",
    }, admin_authorization=f"Bearer {admin}")
    try:
        broker.start()
    except BrokerStartError as exc:
        broker.kill()
        pytest.fail(f"the Pulsar broker did not start: {exc}\n(to install it: `{MAKE_COMMAND}`)")
    yield broker
    broker.stop()


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
    try:
        server.start()
    except ServerStartError as exc:
        server.kill()
        pytest.fail(f"tc-server did not start: {exc}")
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
