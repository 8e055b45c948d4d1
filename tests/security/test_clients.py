"""The stock clients with credentials against a real ``tc-server run`` process: the Java client with
AuthenticationToken (an HS256 and an RS256 token made in the test), over pulsar+ssl:// with a CA and
server certificate made in the test, with mutual TLS (AuthenticationTls); the Go client with a token.
Every txn the clients open must be recorded with the client's role as owner and end as the client was
told. Harnesses: `make interop-java`, `make interop-go` (a missing one fails the test)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tc_server.bench.process import free_port
from tests.interop.conftest import Harness, HarnessRun, TcServer
from tests.security.pki import TestCa, data_url, make_token, public_der
from tests.security.test_admin_auth import call

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


def check_owned_outcomes(run: HarnessRun, server: TcServer, role: str, admin_token: str) -> None:
    """Every txn succeeded as the client saw it, and the header says so, owned by ``role``."""
    txns = run.events("txn")
    assert len(txns) == COUNT and run.result["failed"] == 0, (txns[:3], server.log_tail())
    for txn in txns:
        status, _, body = call(f"{server.admin_url}/admin/v3/transactions/transactionMetadata/"
                               f"{txn['most']}/{txn['least']}", token=admin_token)
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


def test_go_with_a_token(go_harness: Harness, server_factory, secret) -> None:
    server = server_factory("--authentication-providers", "token", "--token-secret-key", data_url(secret))
    run = go_harness.run("concurrent", service_url=server.url, count=COUNT, token=make_token(secret, "HS256", "go-app"))
    check_owned_outcomes(run, server, "go-app", make_token(secret, "HS256", ADMIN))
    refused = go_harness.run("build-only", service_url=server.url, op_timeout_ms=5000,
                             token=make_token(secret, "HS256", "go-app", expires_in_s=-60)).result
    # The Go client retries the refused connection until its operation timeout, then gives up.
    assert refused["ok"] is False, refused
    assert "token expired" in server.log_path.read_text()


