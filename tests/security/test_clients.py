"""The stock clients with credentials against a real ``tc-server run`` process: the Java client with
AuthenticationToken (an HS256 and an RS256 token made in the test), over pulsar+ssl:// with a CA and
server certificate made in the test, with mutual TLS (AuthenticationTls); the Go client with a token.
Every txn the clients open must be recorded with the client's role as owner and end as the client was
told. Harnesses: `make interop-java`, `make interop-go` (a missing one fails the test)."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tc_server.bench.process import free_port, free_ports_in_a_row
from tc_server.client import ClientAuth
from tests.interop.conftest import ASSIGN_TOPIC, Harness, HarnessRun, TcServer
from tests.security.pki import TestCa, data_url, make_token, public_der
from tests.security.support import tls_client, token_auth
from tests.security.test_admin_auth import call
from tests.security.test_tls import client_context

pytestmark = [pytest.mark.slow]

ADMIN = "tc-admin"
COUNT = 40


@pytest.fixture
def server_factory(tmp_path):
    servers: list[TcServer] = []

    def make(*args: str, env: dict[str, str] | None = None) -> TcServer:
        base = tmp_path / f"server{len(servers)}"
        server = TcServer(base / "data", base / "server.log", extra_args=["--superuser-roles", ADMIN, *args],
                          env=env)
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.stop()


def check_owned_outcomes(run: HarnessRun, server: TcServer, role: str, admin_token: str, workers: int = 1,
                         admin_context: ssl.SSLContext | None = None) -> None:
    """Every txn succeeded as the client saw it, and the header says so, owned by ``role``. With
    ``workers``, each header is read on its coordinator's worker's own admin port (its own store)."""
    txns = run.events("txn")
    assert len(txns) == COUNT and run.result["failed"] == 0, (txns[:3], server.log_tail())
    for txn in txns:
        base = server.admin_url if workers == 1 else server.worker_admin_url(txn["most"] % workers)
        if admin_context is not None:  # the certificate names localhost
            base = base.replace("127.0.0.1", "localhost")
        status, _, body = call(f"{base}/admin/v3/transactions/transactionMetadata/{txn['most']}/{txn['least']}",
                               token=admin_token, context=admin_context)
        assert status == 200, body
        doc: dict[str, Any] = json.loads(body)
        assert doc["owner"] == role
        assert doc["status"] == ("COMMITTED" if txn["action"] == "commit" else "ABORTED")


def test_java_with_hs256_and_rs256_tokens(java_harness: Harness, server_factory, tmp_path, secret) -> None:
    key_file = tmp_path / "secret.key"
    key_file.write_bytes(secret)
    hs = server_factory("--authentication-providers", "token", "--token-secret-key", f"file://{key_file}")
    run = java_harness.run("concurrent", service_url=hs.url, count=COUNT, token=make_token(secret, "HS256", "java-hs"))
    check_owned_outcomes(run, hs, "java-hs", make_token(secret, "HS256", ADMIN))

    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_file = tmp_path / "public.key"
    public_file.write_bytes(public_der(rsa_key))
    rs = server_factory("--authentication-providers", "token", "--token-public-key", f"file://{public_file}")
    run = java_harness.run("concurrent", service_url=rs.url, count=COUNT, token=make_token(rsa_key, "RS256", "java-rs"))
    check_owned_outcomes(run, rs, "java-rs", make_token(rsa_key, "RS256", ADMIN))


@pytest.mark.parametrize("token_kind", ["forged", "expired", "missing"])
def test_java_with_bad_credentials_cannot_build(java_harness: Harness, server_factory, secret, token_kind) -> None:
    server = server_factory("--authentication-providers", "token", "--token-secret-key", data_url(secret))
    options: dict[str, Any] = {}
    if token_kind == "forged":
        options["token"] = make_token(b"z" * 32, "HS256", "java")
    elif token_kind == "expired":
        options["token"] = make_token(secret, "HS256", "java", expires_in_s=-60)
    result = java_harness.run("build-only", service_url=server.url, op_timeout_ms=5000, **options).result
    assert result["ok"] is False, result
    # The client sees the server's AuthenticationError as AuthenticationException, with its reason.
    reason = {"forged": "signature does not verify", "expired": "token expired",
              "missing": "method 'none' is not accepted here"}[token_kind]
    assert result["root"]["class"] == "org.apache.pulsar.client.api.PulsarClientException$AuthenticationException"
    assert reason in result["root"]["message"], result
    log = server.log_path.read_text()
    assert "authentication failed" in log and reason in log, server.log_tail()


def test_java_over_tls_with_a_token_and_with_mutual_tls(java_harness: Harness, server_factory, tmp_path,
                                                         secret) -> None:
    ca = TestCa(tmp_path)
    cert = ca.issue("localhost", "server", server=True)
    tls_port = free_port()
    tls_args = ("--tls-listen", f"127.0.0.1:{tls_port}", "--tls-cert-file", str(cert.cert_file),
                "--tls-key-file", str(cert.key_file), "--tls-trust-certs-file", str(ca.cert_file))
    server = server_factory(*tls_args, "--authentication-providers", "token,tls",
                            "--token-secret-key", data_url(secret))
    tls_url = f"pulsar+ssl://localhost:{tls_port}"
    admin_token = make_token(secret, "HS256", ADMIN)

    run = java_harness.run("concurrent", service_url=tls_url, count=COUNT, tls_trust_certs=ca.cert_file,
                           token=make_token(secret, "HS256", "java-over-tls"))
    check_owned_outcomes(run, server, "java-over-tls", admin_token)

    client = ca.issue("java-mtls", "java-client")
    run = java_harness.run("concurrent", service_url=tls_url, count=COUNT, tls_trust_certs=ca.cert_file,
                           tls_cert=client.cert_file, tls_key=client.key_file)
    check_owned_outcomes(run, server, "java-mtls", admin_token)

    # A client that does not trust the server's CA gets nowhere.
    other = TestCa(tmp_path, "other CA")
    refused = java_harness.run("build-only", service_url=tls_url, op_timeout_ms=5000, tls_trust_certs=other.cert_file,
                               token=make_token(secret, "HS256", "java")).result
    assert refused["ok"] is False, refused


def tls_worker_args(ca: TestCa, tls_port: int, *more: str) -> list[str]:
    cert = ca.issue("localhost", "server", server=True)
    return ["--workers", "2", "--tls-listen", f"127.0.0.1:{tls_port}", "--tls-cert-file", str(cert.cert_file),
            "--tls-key-file", str(cert.key_file), "--tls-trust-certs-file", str(ca.cert_file), "--admin-tls", *more]


def test_java_over_tls_through_two_workers_with_https_admin_ports(java_harness: Harness, server_factory, tmp_path,
                                                                 secret) -> None:
    """--workers 2 with --tls-listen and --admin-tls: the Java client's one service URL is the TLS port
    both workers share; LOOKUP sends each coordinator's handler to its worker's own TLS port (port + 1 +
    k); every admin port, the supervisor's and each worker's, is HTTPS with the server's certificate."""
    ca = TestCa(tmp_path)
    tls_port = free_ports_in_a_row(3)
    server = server_factory(*tls_worker_args(ca, tls_port, "--authentication-providers", "token,tls",
                                             "--token-secret-key", data_url(secret)))
    admin_context = client_context(ca)  # verifies the admin ports' certificate against the test CA
    status, _, body = call(f"https://localhost:{server.admin_port}/readyz", context=admin_context)
    ready = json.loads(body)
    assert status == 200 and ready["ready"], ready
    assert [w["admin"] for w in ready["workers"]] == [f"https://127.0.0.1:{server.admin_port + 1 + k}"
                                                      for k in range(2)]

    run = java_harness.run("concurrent", service_url=f"pulsar+ssl://localhost:{tls_port}", count=COUNT,
                           tls_trust_certs=ca.cert_file, token=make_token(secret, "HS256", "java-workers-tls"))
    assert run.result["coordinators"] == 16
    check_owned_outcomes(run, server, "java-workers-tls", make_token(secret, "HS256", ADMIN), workers=2,
                         admin_context=admin_context)
    # Mutual TLS, each handler on its worker's own TLS port.
    client = ca.issue("java-mtls-workers", "java-client")
    run = java_harness.run("concurrent", service_url=f"pulsar+ssl://localhost:{tls_port}", count=COUNT,
                           tls_trust_certs=ca.cert_file, tls_cert=client.cert_file, tls_key=client.key_file)
    check_owned_outcomes(run, server, "java-mtls-workers", make_token(secret, "HS256", ADMIN), workers=2,
                         admin_context=admin_context)


def test_tls_only_workers_name_each_coordinators_worker_by_its_tls_url(server_factory, tmp_path) -> None:
    """The plain listener off (--listen ''): a LOOKUP through the shared TLS port names coordinator i's
    worker by its TLS URL, as both brokerServiceUrl and brokerServiceUrlTls, and that worker serves it."""
    ca = TestCa(tmp_path)
    tls_port = free_ports_in_a_row(3)
    server = server_factory(*tls_worker_args(ca, tls_port, "--listen", "", "--advertised-url", ""))

    async def lookups() -> None:
        shared = await tls_client(tls_port, client_context(ca), ClientAuth())
        try:
            for tc_id in range(16):
                answer = await shared.lookup(f"{ASSIGN_TOPIC}-partition-{tc_id}")
                own = f"pulsar+ssl://127.0.0.1:{tls_port + 1 + tc_id % 2}"
                assert (answer.broker_service_url, answer.broker_service_url_tls) == (own, own), answer
        finally:
            shared.close()
        for worker in range(2):
            direct = await tls_client(tls_port + 1 + worker, client_context(ca), token_auth("unused"))
            try:
                created = await direct.new_txn(tc_id=worker, ttl_ms=60_000)
                assert created.error is None and created.most == worker, created
                ended = await direct.end_txn(created.most, created.least, commit=True)
                assert ended.error is None, ended
            finally:
                direct.close()

    asyncio.run(lookups())
    status, _, body = call(f"https://localhost:{server.admin_port}/readyz", context=client_context(ca))
    assert status == 200, body


def test_go_with_a_token(go_harness: Harness, server_factory, secret) -> None:
    server = server_factory("--authentication-providers", "token", "--token-secret-key", data_url(secret))
    run = go_harness.run("concurrent", service_url=server.url, count=COUNT, token=make_token(secret, "HS256", "go-app"))
    check_owned_outcomes(run, server, "go-app", make_token(secret, "HS256", ADMIN))
    refused = go_harness.run("build-only", service_url=server.url, op_timeout_ms=5000,
                             token=make_token(secret, "HS256", "go-app", expires_in_s=-60)).result
    # The Go client retries the refused connection until its operation timeout, then gives up.
    assert refused["ok"] is False, refused
    assert "token expired" in server.log_path.read_text()


