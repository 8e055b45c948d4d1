"""--upstream-proxy-auth-plugin / -params, over real sockets and TLS against broker stand-ins: a client that
authenticated to tc-server with a TLS certificate has its lookups forwarded, and its connections relayed, as a
Pulsar proxy's (tc-server's proxy credentials, the client's role in original_principal), since its private key
never leaves it; a token client's still go with its own token. Before, a certificate client's went with the
method name "tls" and no certificate, which every broker that requires authentication refused.
tests/security/test_broker_auth.py runs the same against a real broker."""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import replace

import pytest

from tc_server.client import ClientAuth, ConnectionFailed, HandshakeRefused, TcClient, connect_command, open_connection
from tc_server.config import ConfigError, Settings
from tc_server.coordinator import leadership
from tc_server.server.connection import NO_REQUEST_ID
from tc_server.wire import Connect, Error, LookupResponse, LookupType, ServerError, decode_command, encode_command
from tests.security.pki import TestCa, data_url, make_token
from tests.security.support import WAIT_S, owner_of, relayed, sharing_instances, tls_client, token_auth
from tests.security.test_tls import TLS_AUTH, broker_context, client_context, tls_settings
from tests.support.stand_in_broker import StandInBroker

TOPIC = "persistent://public/default/orders"
PROXY_TOKEN = "proxy-token"  # noqa: S105 - what the stand-in broker sees, not a secret


@pytest.fixture
def ca(tmp_path) -> TestCa:
    return TestCa(tmp_path)


def answering_with(url: str) -> StandInBroker:
    """A broker stand-in whose lookups all name ``url`` (the Java client then asks tc-server to relay)."""
    return StandInBroker(lambda lookup: LookupResponse(lookup.request_id, LookupType.CONNECT, broker_service_url=url,
                                                       proxy_through_service_url=True))


async def relay(port: int, context: ssl.SSLContext, auth: ClientAuth, broker: str) -> None:
    """A relayed connection (support.relayed), closed once CONNECTED came back."""
    (await relayed(port, context, auth, broker)).close()


async def test_a_certificate_clients_lookups_and_relays_go_as_a_proxys_and_a_token_clients_as_its_own(
        start, ca, secret):
    owner = await StandInBroker().start()
    upstream = await answering_with(owner.url).start()
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server, tls_trust_certs_file=str(ca.cert_file)),
                      authentication_providers="tls,token", token_secret_key=data_url(secret),
                      upstream_url=upstream.url, upstream_proxy_auth_plugin="token",
                      upstream_proxy_auth_params=f"token:{PROXY_TOKEN}")
    assert app.tls_listener is not None
    port = app.tls_listener.port
    alice_context = client_context(ca, ca.issue("alice", "alice"))
    alice = await tls_client(port, alice_context, TLS_AUTH)
    token = make_token(secret, "HS256", "bob")
    bob = await tls_client(port, client_context(ca), token_auth(token))
    try:
        assert (await alice.lookup(TOPIC)).response is LookupType.CONNECT
        assert (await bob.lookup(TOPIC)).response is LookupType.CONNECT
        await relay(port, alice_context, TLS_AUTH, f"127.0.0.1:{owner.port}")
        await relay(port, client_context(ca), token_auth(token), f"127.0.0.1:{owner.port}")
        seen = [(c.auth_method_name, c.auth_data, c.original_principal, c.original_auth_method)
                for c in upstream.connects + owner.connects]
        assert seen == [("token", PROXY_TOKEN.encode(), "alice", "tls"), ("token", token.encode(), None, None),
                        ("token", PROXY_TOKEN.encode(), "alice", "tls"), ("token", token.encode(), None, None)]
    finally:
        alice.close()
        bob.close()
        owner.stop()
        upstream.stop()


async def test_a_tls_proxy_plugin_presents_its_certificate_to_a_tls_broker(start, ca, tmp_path):
    # The broker requires a client certificate of the cluster's CA: a relay that presented none (the client's
    # stays with the client) failed its TLS handshake.
    context = broker_context(ca)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=str(ca.cert_file))
    owner = StandInBroker(ssl_context=context)
    await owner.start()
    upstream = StandInBroker(ssl_context=context)
    upstream.answer = lambda lookup: LookupResponse(lookup.request_id, LookupType.CONNECT,
                                                    broker_service_url_tls=owner.url, proxy_through_service_url=True)
    await upstream.start()
    proxy = ca.issue("tc-proxy", "tc-proxy")
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server, tls_trust_certs_file=str(ca.cert_file)),
                      authentication_providers="tls", upstream_url=upstream.url,
                      broker_client_tls_trust_certs=str(ca.cert_file),
                      upstream_proxy_auth_plugin="org.apache.pulsar.client.impl.auth.AuthenticationTls",
                      upstream_proxy_auth_params=f"tlsCertFile:{proxy.cert_file},tlsKeyFile:{proxy.key_file}")
    assert app.tls_listener is not None
    alice_context = client_context(ca, ca.issue("alice", "alice"))
    alice = await tls_client(app.tls_listener.port, alice_context, TLS_AUTH)
    try:
        assert (await alice.lookup(TOPIC)).response is LookupType.CONNECT
        await relay(app.tls_listener.port, alice_context, TLS_AUTH, f"localhost:{owner.port}")
        seen = [(c.auth_method_name, c.original_principal) for c in upstream.connects + owner.connects]
        assert seen == [("tls", "alice"), ("tls", "alice")]
    finally:
        alice.close()
        owner.stop()
        upstream.stop()


class RefusingProxies(StandInBroker):
    """Refuses a CONNECT that names an original_principal, as a broker whose proxyRoles lacks the role."""

    async def _on_frame(self, frame: bytes, writer: asyncio.StreamWriter) -> None:
        command = decode_command(frame)
        if isinstance(command, Connect) and command.original_principal:
            self.connects.append(command)
            writer.write(encode_command(Error(NO_REQUEST_ID, ServerError.AuthenticationError,
                                              "Illegal combination of role and originalPrincipal")))
            return
        await super()._on_frame(frame, writer)


async def test_a_broker_refusing_the_proxy_credentials_is_answered_naming_the_setting(start, ca):
    upstream = await RefusingProxies().start()
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server, tls_trust_certs_file=str(ca.cert_file)),
                      authentication_providers="tls", upstream_url=upstream.url,
                      upstream_proxy_auth_plugin="token", upstream_proxy_auth_params=f"token:{PROXY_TOKEN}")
    assert app.tls_listener is not None
    alice = await tls_client(app.tls_listener.port, client_context(ca, ca.issue("alice", "alice")), TLS_AUTH)
    try:
        answer = await alice.lookup(TOPIC)
        assert answer.error is ServerError.AuthenticationError, answer
        assert "--upstream-proxy-auth-params" in (answer.message or "") and "proxyRoles" in (answer.message or "")
        assert "'alice'" in (answer.message or ""), answer
    finally:
        alice.close()
        upstream.stop()


@pytest.mark.parametrize(("settings", "message"), [
    (dict(upstream_proxy_auth_params="token:x"), "upstream_proxy_auth_params: needs upstream_proxy_auth_plugin"),
    (dict(upstream_proxy_auth_plugin="token", upstream_proxy_auth_params="token:x"),
     "upstream_proxy_auth_plugin: does nothing without upstream_url"),
    (dict(upstream_proxy_auth_plugin="kerberos", upstream_url="pulsar://b:6650"),
     "upstream_proxy_auth_plugin: unknown plugin 'kerberos'"),
    (dict(upstream_proxy_auth_plugin="tls", upstream_proxy_auth_params="tlsCertFile:/c,tlsKeyFile:/k",
          upstream_url="pulsar://b:6650"), "upstream_proxy_auth_plugin: the TLS plugin needs a pulsar\\+ssl://"),
])
def test_proxy_settings_that_cannot_work_are_refused_naming_the_setting(settings, message) -> None:
    with pytest.raises(ConfigError, match=message):
        replace(Settings(), **settings).validate()


async def test_a_certificate_client_relayed_to_a_peer_acts_as_itself_not_as_the_proxy_role(
        tmp_path, monkeypatch) -> None:
    # The proxy credentials are for brokers (their proxyRoles). A certificate client relayed to a peer tc-server
    # instance (the v5 SDK reaches a coordinator led elsewhere that way) got them too, and a peer whose
    # --proxy-roles does not list that role took the connection as the proxy role itself: every certificate
    # client relayed so acted as that one role, and could end every other's txns (a review's). A relay to a
    # peer carries the client's own CONNECT again, which the peer refuses without the certificate.
    secret = os.urandom(32)
    monkeypatch.setattr(leadership, "RECHECK_INTERVAL_S", 0.05)
    ca = TestCa(tmp_path)
    upstream = await StandInBroker().start()
    server = ca.issue("localhost", "server", server=True)
    proxy_token = make_token(secret, "HS256", "tc-proxy", expires_in_s=None)
    settings = Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", tls_listen="127.0.0.1:0", coordinators=2,
                        tls_cert_file=str(server.cert_file), tls_key_file=str(server.key_file),
                        tls_trust_certs_file=str(ca.cert_file), broker_client_tls_trust_certs=str(ca.cert_file),
                        authentication_providers="tls,token", token_secret_key=data_url(secret),
                        upstream_url=upstream.url, upstream_proxy_auth_plugin="token",
                        upstream_proxy_auth_params=f"token:{proxy_token}").validate()
    a, b, b_tls = await sharing_instances(settings)
    clients: list[TcClient] = []
    try:
        b_url = next(url for url in a.coordinator.assignments().values() if a.coordinator.tls_url(url) == b_tls)
        tc_id = next(tc for tc, url in a.coordinator.assignments().items() if url == b_url)
        assert a.tls_listener is not None
        named = b_tls.split("//")[1]
        try:
            alice = await relayed(a.tls_listener.port, client_context(ca, ca.issue("alice", "alice")), TLS_AUTH, named)
        except (HandshakeRefused, ConnectionFailed):
            return  # refused at the peer: safe (the client's certificate cannot be presented for it)
        clients.append(alice)
        opened = await asyncio.wait_for(alice.new_txn(tc_id=tc_id, ttl_ms=60_000), WAIT_S)
        assert opened.error is None, opened
        owner = await owner_of(a, tc_id, opened.least)
        # Mallory, another certificate client relayed the same way, ends alice's txn.
        mallory = await relayed(a.tls_listener.port, client_context(ca, ca.issue("mallory", "mallory")), TLS_AUTH,
                                named)
        clients.append(mallory)
        ended = await asyncio.wait_for(mallory.end_txn(tc_id, opened.least, commit=False), WAIT_S)
        assert owner == "alice" and ended.error is not None, (
            f"alice's txn, opened through a relay to a peer instance, is owned by {owner!r}, and mallory's ABORT of it "
            f"was answered {ended.error!r} (None: done): tc-server's upstream proxy credentials were sent to its peer, "
            "which took both clients for the proxy role")
    finally:
        for client in clients:
            client.close()
        await b.stop()
        await a.stop()
        upstream.stop()


async def test_a_pulsar_proxy_with_a_certificate_has_its_clients_lookups_forwarded_as_tc_servers_proxy(
        start, tmp_path) -> None:
    # A Pulsar proxy (--proxy-roles) that authenticated with its certificate is a certificate client too: its
    # clients' lookups went with the method name "tls" and no certificate, which brokers that require
    # authentication refuse (a review's). They go as tc-server's proxy's now, for the client it names.
    ca = TestCa(tmp_path)
    owner = await StandInBroker().start()
    upstream = await answering_with(owner.url).start()
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server, tls_trust_certs_file=str(ca.cert_file)),
                      authentication_providers="tls", proxy_roles="pulsar-proxy", upstream_url=upstream.url,
                      upstream_proxy_auth_plugin="token", upstream_proxy_auth_params=f"token:{PROXY_TOKEN}")
    assert app.tls_listener is not None
    url = f"pulsar+ssl://localhost:{app.tls_listener.port}"
    # A Pulsar proxy with a certificate of the cluster's CA, connecting for its client alice.
    proxy = await open_connection(url, replace(connect_command(TLS_AUTH), original_principal="alice",
                                               original_auth_method="token"),
                                  ssl_context=client_context(ca, ca.issue("pulsar-proxy", "pulsar-proxy")),
                                  timeout_s=WAIT_S, factory=lambda: TcClient(url))
    assert isinstance(proxy, TcClient)
    try:
        await proxy.lookup(TOPIC)
        seen = [(c.auth_method_name, c.auth_data, c.original_principal) for c in upstream.connects]
        assert seen == [("token", PROXY_TOKEN.encode(), "alice")], seen
    finally:
        proxy.close()
        owner.stop()
        upstream.stop()
