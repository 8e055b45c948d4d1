"""The real Pulsar 4.2.4 broker with token authentication AND authorization on, tc-server in front of it:
the client holds a non-superuser token with produce/consume permission only, tc-server a superuser token
of its own. A stock Java (and Go) client opens a txn through tc-server, produces into it, commits, and every
message arrives: tc-server's END_TXN_ON_PARTITION passed the broker's isSuperUser() check, while the
client's lookups were authorized as the client (docs/security.md). Needs `make pulsar-broker` and
`make interop-java` / `make interop-go`; any missing fails the test."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tc_server.bench.process import TcServerProcess, free_port
from tests.interop.conftest import Harness
from tests.security.pki import TestCa
from tests.security.support import Keys, admin_json
from tests.support.front_door import start_front_door
from tests.support.pulsar_broker import TOKEN_PLUGIN, PulsarBroker, running_broker, token_auth_broker
from tests.support.txn_ack import assert_acks_applied

pytestmark = [pytest.mark.java, pytest.mark.golang, pytest.mark.slow, pytest.mark.timeout(600)]

PARTITIONS = 2
MESSAGES = 20


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@pytest.fixture(scope="module")
def secure_broker(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarBroker]:
    """A broker of its own (the session broker runs without authentication)."""
    admin = keys.token("broker-admin")
    # tc-proxy: what tc-server presents as a Pulsar proxy for certificate clients (--upstream-proxy-auth-*). A
    # broker's proxy role must name a client in every CONNECT, so it is not tc-server's own delivery role.
    yield from running_broker(token_auth_broker(tmp_path_factory.mktemp("secure-broker"), keys.secret, admin,
                                                super_users="broker-admin,tc-server,tc-proxy", proxy_roles="tc-proxy"))


@pytest.fixture(scope="module")
def secure_tc_server(secure_broker: PulsarBroker, keys: Keys,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[TcServerProcess]:
    workdir = tmp_path_factory.mktemp("secure-tc-server")
    token_file = workdir / "tc-server.token"
    token_file.write_text(keys.token("tc-server"))
    key_file = workdir / "secret.key"
    key_file.write_bytes(keys.secret)
    server = start_front_door(secure_broker.url, workdir,
                              "--authentication-providers", "token", "--token-secret-key", f"file://{key_file}",
                              "--superuser-roles", "tc-admin",
                              "--broker-client-auth-plugin", TOKEN_PLUGIN,
                              "--broker-client-auth-params", f"file://{token_file}")
    yield server
    server.stop()


def grant_app(broker: PulsarBroker, role: str = "app") -> None:
    """``role`` may produce and consume in public/default (its lookups pass); it is no superuser."""
    code, body = broker.post_json(f"/admin/v2/namespaces/public/default/permissions/{role}", ["produce", "consume"])
    assert code in (200, 204), (code, body)


@pytest.mark.parametrize("client", ["java", "go"])
def test_non_superuser_client_commits_through_tc_server(client: str, secure_broker: PulsarBroker,
                                                         secure_tc_server: TcServerProcess, keys: Keys,
                                                         request: pytest.FixtureRequest) -> None:
    harness: Harness = request.getfixturevalue(f"{client}_harness")
    grant_app(secure_broker)
    topic = f"persistent://public/default/secure-txn-{client}"
    secure_broker.create_topic(topic, PARTITIONS)

    run = harness.run("txn-produce", timeout_s=240, service_url=secure_tc_server.url, topic=topic,
                           count=MESSAGES, action="commit", op_timeout_ms=30_000, receive_timeout_ms=30_000,
                           token=keys.token("app"))
    result = run.result
    assert result["end"]["outcome"] == "ok", (result, secure_tc_server.log_tail())
    assert result["visible_before_end"] == [], result
    assert sorted(result["received_after_end"]) == sorted(f"txn-{i}" for i in range(MESSAGES)), result
    # A plain message after the commit reaches every partition: no read horizon stayed pinned, so the
    # broker accepted tc-server's END_TXN_ON_PARTITION on each.
    assert sorted(result["received_with_markers"]) == sorted(result["markers_sent"]), result
    assert len(result["markers_sent"]) == PARTITIONS
    # The txn is the client's: recorded with its role as owner (read with a tc-server superuser token).
    status, header = admin_json(secure_tc_server, f"/admin/v3/transactions/transactionMetadata/"
                                                   f"{result['most']}/{result['least']}", keys.token("tc-admin"))
    assert status == 200 and header["owner"] == "app" and header["status"] == "COMMITTED", header


def test_forwarded_lookups_are_authorized_as_the_client(java_harness: Harness, secure_broker: PulsarBroker,
                                                         secure_tc_server: TcServerProcess, keys: Keys) -> None:
    """A role the broker granted nothing: tc-server lets it in (its token is valid) and serves it the
    coordinators, but its topic lookup, forwarded with its own token, is refused by the broker, never
    lent tc-server's superuser role."""
    topic = "persistent://public/default/secure-no-permission"
    secure_broker.create_topic(topic, PARTITIONS)
    run = java_harness.run("txn-produce", timeout_s=240, service_url=secure_tc_server.url, topic=topic,
                           count=1, action="commit", op_timeout_ms=15_000, token=keys.token("stranger"))
    fatal = run.events("fatal")
    assert fatal and not run.events("result"), run.lines
    error = json.dumps(fatal[-1]["error"])
    assert "AuthorizationException" in error or "not authorized" in error.lower(), (error, run.stderr_tail())


@pytest.mark.parametrize("action", ["abort", "none"])
def test_aborted_and_timed_out_txns_are_aborted_on_the_secured_broker(
        java_harness: Harness, secure_broker: PulsarBroker, secure_tc_server: TcServerProcess, keys: Keys,
        action: str) -> None:
    """An abort by the client, and a txn left to time out (tc-server's sweep aborts it, with no client
    request at all): either way tc-server's END_TXN_ON_PARTITION(ABORT) passes the broker's superuser check,
    so nothing of the txn arrives and the partitions' read horizons move on."""
    grant_app(secure_broker)
    topic = f"persistent://public/default/secure-txn-{action}"
    secure_broker.create_topic(topic, PARTITIONS)
    # Transactional sends wait for each new partition's transaction buffer to recover, and a txn that timed out
    # meanwhile failed them: the buffers ready first, and 10 s for the txn's sends.
    secure_broker.wait_partitions_ready(topic, PARTITIONS)
    result = java_harness.run("txn-produce", timeout_s=240, service_url=secure_tc_server.url, topic=topic,
                              count=MESSAGES, action=action, txn_timeout_ms=10_000, op_timeout_ms=30_000,
                              receive_timeout_ms=60_000, token=keys.token("app")).result
    assert result["visible_before_end"] == [], result
    # Up to the marker sent to every partition: the markers only, no message of the txn.
    assert sorted(result["received_with_markers"]) == sorted(result["markers_sent"]), result
    assert len(result["markers_sent"]) == PARTITIONS


@pytest.mark.parametrize("action", ["commit", "abort"])
def test_non_superuser_client_acks_in_a_txn_through_tc_server(java_harness: Harness, secure_broker: PulsarBroker,
                                                              secure_tc_server: TcServerProcess, keys: Keys,
                                                              action: str) -> None:
    """END_TXN_ON_SUBSCRIPTION under the same credentials: the committed acks are applied, the aborted
    ones put the messages back."""
    grant_app(secure_broker)
    topic = f"persistent://public/default/secure-ack-{action}"
    secure_broker.create_topic(topic)
    count = 10
    result = java_harness.run("txn-ack", timeout_s=240, service_url=secure_tc_server.url, topic=topic, count=count,
                              action=action, op_timeout_ms=30_000, receive_timeout_ms=30_000,
                              token=keys.token("app")).result
    assert result["end"]["outcome"] == "ok", (result, secure_tc_server.log_tail())
    assert_acks_applied(result, action, count)


def test_a_non_superuser_broker_credential_cannot_deliver_the_decision(
        java_harness: Harness, secure_broker: PulsarBroker, keys: Keys, tmp_path) -> None:
    """The control, and why tc-server's credential must be a broker superuser: the same commit, with
    tc-server holding the client's own (non-superuser) token toward the broker. The broker refuses
    END_TXN_ON_PARTITION ("not a super user"), so the committed messages stay invisible and the decision
    waits in tc-server's outbox."""
    grant_app(secure_broker)
    topic = "persistent://public/default/secure-txn-undelivered"
    secure_broker.create_topic(topic, PARTITIONS)
    key_file = tmp_path / "secret.key"
    key_file.write_bytes(keys.secret)
    server = start_front_door(secure_broker.url, tmp_path,
                              "--authentication-providers", "token", "--token-secret-key", f"file://{key_file}",
                              "--superuser-roles", "tc-admin", "--participant-wait-s", "3",
                              "--broker-client-auth-plugin", TOKEN_PLUGIN,
                              "--broker-client-auth-params", f"token:{keys.token('app')}")
    try:
        result = java_harness.run("txn-produce", timeout_s=240, service_url=server.url, topic=topic,
                                  count=MESSAGES, action="commit", op_timeout_ms=30_000, receive_timeout_ms=5_000,
                                  token=keys.token("app")).result
        # END_TXN is answered once --participant-wait-s has passed: the decision is COMMITTED and stored...
        assert result["end"]["outcome"] == "ok", (result, server.log_tail())
        # ...but no broker was told, so nothing of the txn arrives.
        assert result["received_after_end"] == [], result
        status, undelivered = admin_json(server, "/admin/v3/transactions/undelivered", keys.token("tc-admin"))
        assert status == 200
        assert f"({result['most']},{result['least']})" in [entry["txnId"] for entry in undelivered], undelivered
        log = server.log_path.read_text()
        assert "END_TXN_ON_PARTITION refused by the broker" in log and "super user" in log, server.log_tail()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCa:
    return TestCa(tmp_path_factory.mktemp("client-ca"))


@pytest.fixture(scope="module")
def mtls_tc_server(secure_broker: PulsarBroker, keys: Keys, client_ca: TestCa,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[TcServerProcess]:
    """tc-server with a TLS listener taking client certificates, in front of the secure broker: its own token
    (tc-server, a superuser) for delivery, and tc-proxy's for the forwarded requests of certificate clients."""
    workdir = tmp_path_factory.mktemp("mtls-tc-server")
    cert = client_ca.issue("localhost", "server", server=True)
    key_file = workdir / "secret.key"
    key_file.write_bytes(keys.secret)
    server = start_front_door(secure_broker.url, workdir,
                              "--tls-listen", f"127.0.0.1:{free_port()}", "--tls-cert-file", str(cert.cert_file),
                              "--tls-key-file", str(cert.key_file), "--tls-trust-certs-file", str(client_ca.cert_file),
                              "--authentication-providers", "tls,token", "--token-secret-key", f"file://{key_file}",
                              "--superuser-roles", "tc-admin",
                              "--broker-client-auth-plugin", TOKEN_PLUGIN,
                              "--broker-client-auth-params", f"token:{keys.token('tc-server')}",
                              "--upstream-proxy-auth-plugin", TOKEN_PLUGIN,
                              "--upstream-proxy-auth-params", f"token:{keys.token('tc-proxy')}")
    yield server
    server.stop()


def tls_url(server: TcServerProcess) -> str:
    return f"pulsar+ssl://localhost:{server.argv[server.argv.index('--tls-listen') + 1].rsplit(':', 1)[1]}"


@pytest.mark.parametrize(("role", "granted"), [("mtls-app", True), ("mtls-stranger", False)])
def test_a_certificate_client_commits_through_tc_server_authorized_as_itself(
        java_harness: Harness, secure_broker: PulsarBroker, mtls_tc_server: TcServerProcess, client_ca: TestCa,
        keys: Keys, role: str, granted: bool) -> None:
    """A stock Java client with a client certificate (AuthenticationTls) and tc-server as its one service URL:
    its lookups and its producers' and consumers' connections reach the broker as a Pulsar proxy's (tc-proxy,
    naming the client's role), so the broker authorizes the client itself: the granted role commits and
    every message arrives; a role granted nothing is refused, never lent tc-server's roles. Before, they went
    with the method name "tls" and no certificate, and the broker refused every lookup."""
    if granted:
        grant_app(secure_broker, role)
    topic = f"persistent://public/default/mtls-txn-{role}"
    secure_broker.create_topic(topic, PARTITIONS)
    client = client_ca.issue(role, role)
    run = java_harness.run("txn-produce", timeout_s=240, service_url=tls_url(mtls_tc_server), topic=topic,
                           count=MESSAGES if granted else 1, action="commit",
                           op_timeout_ms=30_000 if granted else 15_000, receive_timeout_ms=30_000,
                           tls_trust_certs=client_ca.cert_file,
                           tls_cert=client.cert_file, tls_key=client.key_file)
    if not granted:
        fatal = run.events("fatal")
        assert fatal and not run.events("result"), run.lines
        error = json.dumps(fatal[-1]["error"])
        assert "AuthorizationException" in error or "not authorized" in error.lower(), (error, run.stderr_tail())
        return
    result = run.result
    assert result["end"]["outcome"] == "ok", (result, mtls_tc_server.log_tail())
    assert result["visible_before_end"] == [], result
    assert sorted(result["received_after_end"]) == sorted(f"txn-{i}" for i in range(MESSAGES)), result
    status, header = admin_json(mtls_tc_server, f"/admin/v3/transactions/transactionMetadata/"
                                                f"{result['most']}/{result['least']}", keys.token("tc-admin"))
    assert status == 200 and header["owner"] == role and header["status"] == "COMMITTED", header
