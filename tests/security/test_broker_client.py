"""The credentials tc-server presents to brokers (``--broker-client-auth-plugin`` / ``-params``), as
``broker_client_credentials`` returns them for a CONNECT: method, data (read again for a refresh) and
the TLS context. Proven against a tc-server with authentication on, which checks them as a broker's
providers do (the real broker with authentication is the participant tests' business)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import structlog

from tc_server.auth.broker_client import (
    TLS_PLUGIN,
    TOKEN_PLUGIN,
    broker_client_credentials,
    forwarding_tls_context,
)
from tc_server.client import TcClient, connect_command, open_connection
from tc_server.config import ConfigError, Settings
from tests.security.pki import TestCa, data_url, make_token
from tests.security.support import owner_of

SETTINGS = Settings()


async def connect_as_broker_client(url: str, settings: Settings) -> TcClient:
    credentials = broker_client_credentials(settings)
    conn = await open_connection(url, connect_command(credentials.client_auth()),
                                 ssl_context=credentials.ssl_context, factory=lambda: TcClient(url))
    assert isinstance(conn, TcClient)
    conn.auth_data_source = credentials.auth_data
    return conn


async def test_token_plugin_authenticates_with_a_token_file(start, secret, tmp_path):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret), superuser_roles="tc-server")
    token_file = tmp_path / "tc-server.token"
    token_file.write_text(make_token(secret, "HS256", "tc-server") + "\n")  # echo adds a newline
    settings = replace(SETTINGS, broker_client_auth_plugin=TOKEN_PLUGIN,
                       broker_client_auth_params=f"file://{token_file}")
    credentials = broker_client_credentials(settings)
    assert credentials.method == "token" and credentials.ssl_context is None
    client = await connect_as_broker_client(f"pulsar://127.0.0.1:{app.listener.port}", settings)
    try:
        created = await client.new_txn(tc_id=0)
        assert await owner_of(app, created.most, created.least) == "tc-server"
    finally:
        client.close()
    # A rotated file is read again: the next CONNECT (or refresh answer) carries the new token.
    rotated = make_token(secret, "HS256", "tc-server", expires_in_s=7200)
    token_file.write_text(rotated)
    assert credentials.auth_data() == rotated.encode()


def test_token_plugin_param_forms(monkeypatch):
    def data(params: str) -> bytes:
        return broker_client_credentials(replace(SETTINGS, broker_client_auth_plugin="token",
                                                 broker_client_auth_params=params)).auth_data()

    assert data("token:abc.def.ghi") == b"abc.def.ghi"
    assert data("abc.def.ghi") == b"abc.def.ghi"
    # The JSON form Pulsar's AuthenticationToken takes (before, it was sent to brokers as the token itself).
    assert data('{"token":"abc.def.ghi"}') == b"abc.def.ghi"
    with pytest.raises(ConfigError, match="JSON form is"):
        data('{"tokn":"abc.def.ghi"}')
    monkeypatch.setenv("TC_TEST_BROKER_TOKEN", "from.the.env\n")
    assert data("env:TC_TEST_BROKER_TOKEN") == b"from.the.env"
    with pytest.raises(ConfigError, match="environment variable TC_TEST_NOT_SET is not set"):
        data("env:TC_TEST_NOT_SET")
    with pytest.raises(ConfigError, match="needs token:<jwt> or file:///path"):
        data("")
    with pytest.raises(ConfigError, match="broker_client_auth_params: cannot read /nonexistent/token"):
        data("file:///nonexistent/token")


def test_no_plugin_means_no_credentials():
    credentials = broker_client_credentials(SETTINGS)
    assert (credentials.method, credentials.auth_data(), credentials.ssl_context) == ("none", b"", None)


def test_unknown_plugin_is_named_and_a_secret_never_quoted():
    with pytest.raises(ConfigError, match="unknown plugin 'org.example.Kerberos'"):
        broker_client_credentials(replace(SETTINGS, broker_client_auth_plugin="org.example.Kerberos"))
    settings = replace(SETTINGS, broker_client_auth_plugin="tls", broker_client_auth_params="tlsCertFile:/x")
    with pytest.raises(ConfigError, match="needs tlsCertFile:/path,tlsKeyFile:/path"):
        broker_client_credentials(settings)
    assert "broker_client_auth_params" not in repr(replace(SETTINGS, broker_client_auth_params="token:secret"))


@pytest.mark.parametrize("params_form", ["pairs", "json"])
async def test_tls_plugin_presents_the_client_certificate(start, tmp_path, params_form):
    ca = TestCa(tmp_path)
    server = ca.issue("localhost", "server", server=True)
    app = await start(listen="", tls_listen="127.0.0.1:0", tls_cert_file=str(server.cert_file),
                      tls_key_file=str(server.key_file), tls_trust_certs_file=str(ca.cert_file),
                      authentication_providers="tls", superuser_roles="tc-server")
    mine = ca.issue("tc-server", "tc-server-client")
    params = f"tlsCertFile:{mine.cert_file},tlsKeyFile:{mine.key_file}" if params_form == "pairs" else \
        f'{{"tlsCertFile": "{mine.cert_file}", "tlsKeyFile": "file://{mine.key_file}"}}'
    settings = replace(SETTINGS, broker_client_auth_plugin=TLS_PLUGIN, broker_client_auth_params=params,
                       broker_client_tls_trust_certs=str(ca.cert_file))
    credentials = broker_client_credentials(settings)
    assert credentials.method == "tls" and credentials.ssl_context is not None
    client = await connect_as_broker_client(f"pulsar+ssl://127.0.0.1:{app.tls_listener.port}", settings)
    try:
        created = await client.new_txn(tc_id=0)
        assert await owner_of(app, created.most, created.least) == "tc-server"  # the certificate's CN
    finally:
        client.close()


def test_trust_certs_that_cannot_be_read_are_named(tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ConfigError, match="broker_client_tls_trust_certs"):
        broker_client_credentials(replace(SETTINGS, broker_client_tls_trust_certs=str(bad)))


def test_tls_to_brokers_that_checks_neither_the_ca_nor_the_host_is_warned_about(tmp_path):
    # Brokers' defaults (the system CAs, no host-name check), but tc-server carries clients' credentials and
    # its own superuser token over these connections: said once at start, with the two settings to set.
    settings = replace(SETTINGS, upstream_url="pulsar+ssl://broker:6651")
    with structlog.testing.capture_logs() as logged:
        assert forwarding_tls_context(settings) is not None
    assert [e for e in logged if "accepts any certificate a public CA issued" in e["event"]]
    ca = TestCa(tmp_path)
    with structlog.testing.capture_logs() as logged:
        forwarding_tls_context(replace(settings, broker_client_tls_trust_certs=str(ca.cert_file)))
        forwarding_tls_context(replace(settings, broker_client_tls_hostname_verification=True))
    assert not [e for e in logged if "accepts any certificate" in e["event"]]
