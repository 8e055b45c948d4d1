"""The pulsar+ssl:// listener with a CA and certificates generated in the test (real TLS, real
sockets): server authentication, mutual TLS with the role from the client certificate's CN, a
listener that refuses clients without a trusted certificate, and certificate reload when the files
change."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import ssl
import urllib.request
from dataclasses import replace
from typing import Any

import pytest
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from tc_server.app import start_app
from tc_server.client import (
    ClientAuth,
    ConnectionFailed,
    HandshakeRefused,
    TcClient,
    connect,
    connect_command,
    open_connection,
)
from tc_server.config import Settings
from tc_server.coordinator import leadership
from tc_server.server import connection as connection_module
from tc_server.server.relay import open_relay
from tc_server.wire import (
    Connect,
    Connected,
    Error,
    FrameDecoder,
    LookupResponse,
    LookupType,
    ServerError,
    decode_command,
    encode_command,
)
from tests.security.pki import TestCa, data_url, make_token
from tests.security.support import WAIT_S, raw_connect, relayed, sharing_instances, tls_client, token_auth
from tests.support.stand_in_broker import StandInBroker, connect_to

TLS_AUTH = ClientAuth("tls", b"")  # what the Java client's AuthenticationTls sends in CONNECT


def client_context(ca: TestCa, client_cert=None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.cert_file))
    if client_cert is not None:
        context.load_cert_chain(client_cert.cert_file, client_cert.key_file)
    return context


def tls_settings(ca: TestCa, server, **more):
    return dict(listen="", tls_listen="127.0.0.1:0", tls_cert_file=str(server.cert_file),
                tls_key_file=str(server.key_file), **more)


@pytest.fixture
def ca(tmp_path) -> TestCa:
    return TestCa(tmp_path)


async def test_token_over_tls_with_the_plain_listener_off(start, ca, secret):
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server), authentication_providers="token",
                      token_secret_key=data_url(secret))
    assert app.listener is None  # --listen "" turns the plain listener off
    port = app.tls_listener.port
    client = await tls_client(port, client_context(ca), token_auth(make_token(secret, "HS256", "alice")))
    try:
        created = await client.new_txn(tc_id=0)
        assert (await client.end_txn(created.most, created.least, commit=True)).error is None
        # The coordinator's LOOKUP answer sends TLS clients to the TLS URL.
        answer = await client.lookup("persistent://pulsar/system/transaction_coordinator_assign-partition-0")
        assert answer.broker_service_url_tls == f"pulsar+ssl://127.0.0.1:{port}"
    finally:
        client.close()


async def test_a_client_that_does_not_trust_the_ca_cannot_connect(start, ca, tmp_path):
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server))
    other_ca = TestCa(tmp_path, "another CA")
    with pytest.raises(ConnectionFailed):
        await tls_client(app.tls_listener.port, client_context(other_ca), ClientAuth())


async def test_mutual_tls_role_is_the_certificate_cn(start, ca):
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server, tls_trust_certs_file=str(ca.cert_file)),
                      authentication_providers="tls", superuser_roles="ops")
    alice = await tls_client(app.tls_listener.port, client_context(ca, ca.issue("alice", "alice")), TLS_AUTH)
    bob = await tls_client(app.tls_listener.port, client_context(ca, ca.issue("bob", "bob")), TLS_AUTH)
    ops = await tls_client(app.tls_listener.port, client_context(ca, ca.issue("ops", "ops")), TLS_AUTH)
    try:
        txn = await alice.new_txn(tc_id=1)
        assert (await bob.end_txn(txn.most, txn.least, commit=True)).error is ServerError.TransactionNotFound
        assert (await alice.add_partition(txn.most, txn.least, "persistent://public/default/t")).error is None
        assert (await ops.end_txn(txn.most, txn.least, commit=True)).error is None
    finally:
        for client in (alice, bob, ops):
            client.close()


async def test_tls_method_without_a_client_certificate_is_refused_and_closed(start, ca):
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server, tls_trust_certs_file=str(ca.cert_file)),
                      authentication_providers="tls")
    result = await raw_connect(app.tls_listener.port, Connect("raw", 21, auth_method_name="tls", auth_data=b""),
                               ssl_context=client_context(ca))
    (refusal,) = result.commands
    assert isinstance(refusal, Error)
    assert refusal.error is ServerError.AuthenticationError
    assert "needs a client certificate" in refusal.message
    assert result.closed_by_server
    with pytest.raises(HandshakeRefused):
        await tls_client(app.tls_listener.port, client_context(ca), TLS_AUTH)


async def test_required_client_certificate_refuses_the_tls_handshake(start, ca, tmp_path):
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server, tls_trust_certs_file=str(ca.cert_file),
                                     tls_require_trusted_client_cert=True), authentication_providers="tls")
    port = app.tls_listener.port
    for context in (client_context(ca),  # no certificate at all
                    client_context(ca, TestCa(tmp_path, "rogue CA").issue("alice", "rogue-alice"))):
        # TLS 1.3: the server's refusal of the certificate arrives after the client's handshake is done,
        # so it shows as a failed CONNECT or a closed connection; either way nothing is served.
        with pytest.raises((ConnectionFailed, HandshakeRefused, ConnectionError)):
            client = await tls_client(port, context, TLS_AUTH)
            await client.new_txn(tc_id=0)
    good = await tls_client(port, client_context(ca, ca.issue("alice", "alice")), TLS_AUTH)
    assert (await good.new_txn(tc_id=0)).error is None
    good.close()


async def test_certificate_is_reloaded_when_its_files_change(start, ca):
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server), tls_cert_refresh_check_s=0.1)
    port = app.tls_listener.port

    async def served_serial() -> int:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(ca),
                                                  server_hostname="localhost")
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        return x509.load_der_x509_certificate(der).serial_number

    def scraped_expiry() -> float:
        (family,) = app.metrics.tls_certificate_expiry.collect()
        return float(family.samples[0].value)

    assert await served_serial() == server.certificate.serial_number
    assert scraped_expiry() == server.certificate.not_valid_after_utc.timestamp()
    # Same paths, a new certificate and key, valid longer: the expiry the alert rules read follows.
    renewed = ca.issue("localhost", "server", server=True, valid_days=30)
    async with asyncio.timeout(WAIT_S):
        while await served_serial() != renewed.certificate.serial_number:
            await asyncio.sleep(0.1)
    assert app.tls.reloads >= 1
    assert scraped_expiry() == renewed.certificate.not_valid_after_utc.timestamp()


async def test_half_written_certificate_keeps_the_previous_one(start, ca):
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server))
    server.cert_file.write_text("-----BEGIN CERTIFICATE-----\ntruncated")
    assert app.tls.reload_if_changed() is False
    client = await tls_client(app.tls_listener.port, client_context(ca), ClientAuth())
    assert (await client.new_txn(tc_id=0)).error is None
    client.close()


def broker_context(ca: TestCa) -> ssl.SSLContext:
    """A stand-in broker's TLS context: a certificate for localhost from ``ca``."""
    cert = ca.issue("localhost", "broker", server=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert.cert_file, cert.key_file)
    return context


async def test_a_lookup_redirect_from_a_tls_upstream_is_followed_over_tls(start, ca, secret, tmp_path):
    # The client's CONNECT, its token included, goes wherever tc-server forwards a lookup. With a
    # pulsar+ssl:// upstream, a REDIRECT is followed to the broker's TLS URL, trusting the broker
    # client's CA (--broker-client-tls-trust-certs): before, tc-server spoke plain TCP to the
    # redirect's pulsar:// URL and sent the client's token in the clear.
    plain = await StandInBroker(connect_to("pulsar://127.0.0.1:1")).start()
    tls = StandInBroker(ssl_context=broker_context(ca))
    tls.answer = lambda c: (
        LookupResponse(c.request_id, LookupType.CONNECT, broker_service_url="pulsar://127.0.0.1:1",
                       broker_service_url_tls=tls.url) if c.authoritative else
        LookupResponse(c.request_id, LookupType.REDIRECT, broker_service_url=plain.url,
                       broker_service_url_tls=tls.url, authoritative=True))
    await tls.start()
    app = await start(authentication_providers="token", token_secret_key=data_url(secret), upstream_url=tls.url,
                      broker_client_tls_trust_certs=str(ca.cert_file))
    token = make_token(secret, "HS256", "alice")
    alice = await connect("127.0.0.1", app.listener.port, auth=token_auth(token))
    try:
        answer = await alice.lookup("persistent://public/default/orders")
        assert answer.response is LookupType.CONNECT, answer
        assert plain.connects == []
        assert len(tls.connects) == 2 and all(c.auth_data == token.encode() for c in tls.connects)
    finally:
        alice.close()
        plain.stop()
        tls.stop()


async def test_a_proxied_connection_to_a_broker_named_by_its_plain_address_goes_over_tls(start, ca, secret):
    # With a pulsar+ssl:// upstream, a client that speaks plain TCP to tc-server names the broker of its
    # LOOKUP answer by the plain URL's HOST:PORT. Before, tc-server carried that connection, the client's
    # token in its CONNECT, to the broker's plain port: the brokers' plain and TLS ports differ, so "the
    # TLS URL wins" never applied. Now it goes to the same broker's TLS URL, and a broker named without
    # a TLS URL is refused.
    plain = await StandInBroker(lambda c: LookupResponse(c.request_id, LookupType.FAILED)).start()
    plain_only = "127.0.0.1:1"  # a broker whose answer names no TLS URL
    tls = StandInBroker(ssl_context=broker_context(ca))
    tls.answer = lambda c: (
        LookupResponse(c.request_id, LookupType.CONNECT, broker_service_url=f"pulsar://{plain_only}")
        if c.topic.endswith("plain-only") else
        LookupResponse(c.request_id, LookupType.CONNECT, broker_service_url=plain.url,
                       broker_service_url_tls=tls.url))
    await tls.start()
    app = await start(authentication_providers="token", token_secret_key=data_url(secret), upstream_url=tls.url,
                      broker_client_tls_trust_certs=str(ca.cert_file), lookup_connections="proxy")
    token = make_token(secret, "HS256", "alice")
    alice = await connect("127.0.0.1", app.listener.port, auth=token_auth(token))
    try:
        for topic in ("persistent://public/default/orders", "persistent://public/default/plain-only"):
            assert (await alice.lookup(topic)).response is LookupType.CONNECT
        url = f"pulsar://127.0.0.1:{app.listener.port}"

        async def proxied_to(broker: str) -> TcClient:
            conn = await open_connection(url, replace(connect_command(token_auth(token)), proxy_to_broker_url=broker),
                                         timeout_s=WAIT_S, factory=lambda: TcClient(url))
            assert isinstance(conn, TcClient)
            return conn

        proxied = await proxied_to(f"127.0.0.1:{plain.port}")  # CONNECTED: the TLS broker's, relayed
        proxied.close()
        assert plain.connects == []
        assert len(tls.connects) == 2 and all(c.auth_data == token.encode() for c in tls.connects)
        with pytest.raises(HandshakeRefused) as refused:
            await proxied_to(plain_only)
        assert refused.value.error is ServerError.NotAllowedError
    finally:
        alice.close()
        plain.stop()
        tls.stop()


async def test_a_tls_client_is_carried_to_a_brokers_tls_url_behind_a_plain_upstream_trusting_the_brokers_ca(
        start, ca):
    # A plain upstream whose LOOKUP answers name both URLs; the client speaks TLS to tc-server and names the
    # broker's TLS address, as the Java client does. The relay's TLS trusted only the system's CAs, not
    # --broker-client-tls-trust-certs as every other connection tc-server opens to a broker: against brokers
    # whose certificates the cluster's own CA signed (the usual case) it never connected (ServiceNotReady,
    # retried for good).
    owner = await StandInBroker(ssl_context=broker_context(ca)).start()
    upstream = await StandInBroker(lambda lookup: LookupResponse(
        lookup.request_id, LookupType.CONNECT, broker_service_url="pulsar://127.0.0.1:1",
        broker_service_url_tls=owner.url)).start()
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server, upstream_url=upstream.url, lookup_connections="proxy",
                                     broker_client_tls_trust_certs=str(ca.cert_file)))
    assert app.tls_listener is not None
    client = await tls_client(app.tls_listener.port, client_context(ca), ClientAuth())
    try:
        assert (await client.lookup("persistent://public/default/orders")).proxy_through_service_url
        (await relayed(app.tls_listener.port, client_context(ca), ClientAuth(), f"localhost:{owner.port}")).close()
        assert len(owner.connects) == 1
    finally:
        client.close()
        owner.stop()
        upstream.stop()


def _connect_blocking(port: int, context: ssl.SSLContext, session: ssl.SSLSession | None = None):
    """A TLS-authenticated CONNECT on a socket of its own, closed cleanly (close_notify: OpenSSL drops a
    TLS 1.2 session from its cache when the connection just ends): (the answer, whether the session was
    resumed, the session)."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as raw:
        try:
            tls = context.wrap_socket(raw, server_hostname="localhost", session=session)
        except ssl.SSLError:  # the handshake refused
            return None, False, None
        answer = None
        decoder = FrameDecoder(1 << 20)
        tls.sendall(encode_command(connect_command(TLS_AUTH, "resumption-test")))
        while answer is None and (data := tls.recv(65536)):
            decoder.feed(data)
            if (frame := decoder.next_frame()) is not None:
                answer = decode_command(frame)
        resumed, used = tls.session_reused, tls.session
        with contextlib.suppress(OSError):
            tls.unwrap()
        return answer, resumed, used


@pytest.mark.parametrize("tls_version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2])
async def test_a_session_from_before_a_ca_left_the_trust_file_cannot_be_resumed(start, tmp_path, tls_version):
    # The operator removes a CA: a client whose certificate it issued must not be authenticated any more,
    # also not by resuming a session from before the reload (which would skip the certificate check).
    # TLS 1.3 resumes only with tickets, which are off; TLS 1.2 also from the server's session-id cache,
    # where a session from before the reload was resumed with its old certificate (5 minutes long).
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    old_dir.mkdir()
    new_dir.mkdir()
    old_ca, new_ca = TestCa(old_dir, "old CA"), TestCa(new_dir, "new CA")
    server = old_ca.issue("localhost", "server", server=True)  # the server's own chain is not checked here
    trust = tmp_path / "trust.pem"
    trust.write_bytes(old_ca.cert_file.read_bytes() + new_ca.cert_file.read_bytes())
    alice = old_ca.issue("alice", "alice")
    app = await start(**tls_settings(new_ca, server, tls_trust_certs_file=str(trust),
                                     authentication_providers="tls", tls_cert_refresh_check_s=3600))
    context = client_context(old_ca, alice)
    context.maximum_version = tls_version
    answer, _, session = await asyncio.to_thread(_connect_blocking, app.tls_listener.port, context)
    assert isinstance(answer, Connected), answer
    staged = tmp_path / "trust.staged"
    staged.write_bytes(new_ca.cert_file.read_bytes())
    staged.replace(trust)
    assert app.tls.reload_if_changed()
    answer, resumed, _ = await asyncio.to_thread(_connect_blocking, app.tls_listener.port, context, session)
    # TLS 1.2 may resume the session, but its certificate proves no role any more: refused all the same.
    assert not isinstance(answer, Connected), answer
    if resumed:
        assert isinstance(answer, Error) and answer.error is ServerError.AuthenticationError, answer


@pytest.mark.parametrize("tls_version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2])
async def test_a_keep_alive_admin_connection_from_before_a_ca_left_the_trust_file_proves_no_role(
        start, tmp_path, tls_version):
    # Found by a review: the admin port authenticates each request of a keep-alive connection from the
    # certificate of its handshake. After the operator removed the CA that issued it, the connection still
    # acted as the superuser it named, for as long as it sent a request every keep-alive interval; only new
    # connections were refused. A new connection with a certificate of a CA still trusted is served.
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    old_dir.mkdir()
    new_dir.mkdir()
    old_ca, new_ca = TestCa(old_dir, "old CA"), TestCa(new_dir, "new CA")
    server = new_ca.issue("localhost", "server", server=True)
    trust = tmp_path / "trust.pem"
    trust.write_bytes(old_ca.cert_file.read_bytes() + new_ca.cert_file.read_bytes())
    app = await start(**tls_settings(new_ca, server, tls_trust_certs_file=str(trust), admin_tls=True,
                                     authentication_providers="tls", superuser_roles="admin,ops",
                                     tls_cert_refresh_check_s=3600))

    def connection(ca: TestCa, role: str) -> http.client.HTTPSConnection:
        context = client_context(new_ca, ca.issue(role, role))
        context.maximum_version = tls_version
        return http.client.HTTPSConnection("localhost", app.admin.port, context=context, timeout=10)

    def status(conn: http.client.HTTPSConnection) -> int:
        conn.request("GET", "/admin/v3/transactions/coordinators")
        answer = conn.getresponse()
        answer.read()
        return answer.status

    def status_and_closing(conn: http.client.HTTPSConnection) -> tuple[int, bool]:
        conn.request("GET", "/admin/v3/transactions/coordinators")
        answer = conn.getresponse()
        answer.read()
        return answer.status, answer.will_close

    kept = connection(old_ca, "admin")
    assert await asyncio.to_thread(status, kept) == 200
    staged = tmp_path / "trust.staged"
    # A Secret updated with the same certificates (a new file, the same content) changes nothing.
    staged.write_bytes(trust.read_bytes())
    staged.replace(trust)
    assert app.tls.reload_if_changed()
    assert await asyncio.to_thread(status, kept) == 200
    staged.write_bytes(new_ca.cert_file.read_bytes())
    staged.replace(trust)
    assert app.tls.reload_if_changed()
    # The same connection: its certificate proves no role, and it is closed after the answer (its client's next
    # request makes a new handshake, which this certificate no longer passes).
    assert await asyncio.to_thread(status_and_closing, kept) == (401, True)
    kept.close()
    fresh = connection(new_ca, "ops")
    assert await asyncio.to_thread(status, fresh) == 200
    fresh.close()


async def test_a_tls_client_is_relayed_to_a_peer_instance_over_tls_only(ca, secret, monkeypatch):
    # The v5 SDK reaches a coordinator led by another instance through the one it is connected to, naming
    # that peer in proxy_to_broker_url. A client that came over TLS and named the peer's plain address had
    # its CONNECT, token included, carried to the peer over plain TCP.
    monkeypatch.setattr(leadership, "RECHECK_INTERVAL_S", 0.05)
    relayed: list[str] = []

    async def noting(url: str, client: Any, **kwargs: Any) -> Any:
        relayed.append(url)
        return await open_relay(url, client, **kwargs)

    monkeypatch.setattr(connection_module, "open_relay", noting)
    server = ca.issue("localhost", "server", server=True)
    settings = Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", tls_listen="127.0.0.1:0", coordinators=2,
                        tls_cert_file=str(server.cert_file), tls_key_file=str(server.key_file),
                        broker_client_tls_trust_certs=str(ca.cert_file), authentication_providers="token",
                        token_secret_key=data_url(secret)).validate()
    a, b, b_tls = await sharing_instances(settings)
    try:
        b_url = f"pulsar://127.0.0.1:{b.listeners[0].port}"
        token = make_token(secret, "HS256", "alice").encode()
        assert a.tls_listener is not None
        for named in (b_url, b_tls):
            answered = await raw_connect(a.tls_listener.port, Connect("x", 21, auth_method_name="token",
                                                                      auth_data=token,
                                                                      proxy_to_broker_url=named.split("//")[1]),
                                         ssl_context=client_context(ca), until=bool)  # carried: stays open
            assert isinstance(answered.commands[0], Connected), answered.commands
        assert relayed == [b_tls, b_tls]
    finally:
        await b.stop()
        await a.stop()


async def test_the_supervisor_sends_credentials_only_to_its_own_certificate(ca, tmp_path):
    """With --workers and --admin-tls the supervisor passes an operator's token on to a worker's admin port
    (tc_server/admin/workers_front.py). It asks trusting the one certificate it serves itself: another
    certificate, even one the same CA issued, is refused before anything is sent (a process that took a
    worker's port while it restarted gets no token)."""
    from tc_server.admin.workers_front import WorkerCertificates

    own = ca.issue("tc-server", "server", server=True)
    other = ca.issue("tc-server", "impostor", server=True)
    settings = Settings(admin_tls=True, tls_cert_file=str(own.cert_file), tls_key_file=str(own.key_file))
    forward = WorkerCertificates(settings).context()

    async def handshake_with(presented) -> None:
        serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serving.load_cert_chain(presented.cert_file, presented.key_file)
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=serving)
        try:
            port = server.sockets[0].getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=forward)
            writer.close()
        finally:
            server.close()

    await handshake_with(own)
    with pytest.raises(ssl.SSLCertVerificationError):
        await handshake_with(other)


async def test_a_tls_client_is_given_a_tls_address_for_a_broker_without_one_that_it_reaches_through_tc_server(
        start, ca):
    # A plain upstream whose broker has no TLS port, its lookups answered proxy_through_service_url (as Pulsar
    # standalone does on loopback). A client that speaks TLS to tc-server reads only the answer's TLS URL, to
    # name the broker in proxy_to_broker_url: the Java client got none and failed every producer and consumer
    # (NullPointerException). It is now the broker's HOST:PORT, to which the relay goes over the plain URL.
    owner = await StandInBroker().start()
    upstream = await StandInBroker(lambda lookup: LookupResponse(
        lookup.request_id, LookupType.CONNECT, broker_service_url=owner.url, proxy_through_service_url=True)).start()
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server, upstream_url=upstream.url))
    assert app.tls_listener is not None
    client = await tls_client(app.tls_listener.port, client_context(ca), ClientAuth())
    try:
        answer = await client.lookup("persistent://public/default/orders")
        assert (answer.broker_service_url, answer.broker_service_url_tls, answer.proxy_through_service_url) == (
            owner.url, f"pulsar+ssl://127.0.0.1:{owner.port}", True)
        (await relayed(app.tls_listener.port, client_context(ca), ClientAuth(), f"127.0.0.1:{owner.port}")).close()
        assert len(owner.connects) == 1
    finally:
        client.close()
        owner.stop()
        upstream.stop()


async def test_a_tls_client_sent_directly_to_a_broker_without_tls_is_told_why(start, ca):
    # --lookup-connections direct: the client goes to the broker itself, over TLS, which this broker does not
    # speak. The answer passed on had no TLS URL, and the Java client failed every producer and consumer with a
    # NullPointerException (a review's); it is refused now, naming the setting.
    broker = await StandInBroker(lambda lookup: LookupResponse(
        lookup.request_id, LookupType.CONNECT, broker_service_url="pulsar://10.0.0.7:6650")).start()
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server, upstream_url=broker.url, lookup_connections="direct"))
    assert app.tls_listener is not None
    client = await tls_client(app.tls_listener.port, client_context(ca), ClientAuth())
    try:
        answer = await client.lookup("persistent://public/default/orders")
        assert answer.response is LookupType.FAILED and answer.error is ServerError.NotAllowedError, answer
        assert "pulsar://10.0.0.7:6650 has no TLS URL" in (answer.message or "")
        assert "--lookup-connections" in (answer.message or "")
    finally:
        client.close()
        broker.stop()


async def test_an_instance_waiting_for_its_store_serves_its_certificate_expiry(ca, tmp_path):
    """While the start waits for an Oxia that does not answer, the admin port serves HTTPS with the certificate
    (--admin-tls): its expiry is on /metrics there too, or the expiry alerts are blind to an instance that
    waits long (a review: the waiting port's /metrics held tc_server_ready 0 and no expiry)."""
    from tests.support.server_process import free_port

    server = ca.issue("localhost", "server", server=True)
    admin_port = free_port()
    settings = Settings(store="oxia", oxia_address=f"127.0.0.1:{free_port()}", listen="127.0.0.1:0",
                        admin_listen=f"127.0.0.1:{admin_port}", admin_tls=True, tls_cert_file=str(server.cert_file),
                        tls_key_file=str(server.key_file), data_dir=str(tmp_path / "data"))
    starting = asyncio.create_task(start_app(settings))

    def scrape() -> str:
        url = f"https://localhost:{admin_port}/metrics"
        with urllib.request.urlopen(url, context=client_context(ca), timeout=5) as response:  # noqa: S310
            return str(response.read().decode())

    try:
        async with asyncio.timeout(WAIT_S):
            while True:
                try:
                    text = await asyncio.to_thread(scrape)
                    break
                except OSError:
                    await asyncio.sleep(0.1)
        samples = {sample.name: sample.value for family in text_string_to_metric_families(text)
                   for sample in family.samples}
        assert samples["tc_server_ready"] == 0, text  # still waiting
        assert samples["tc_server_tls_certificate_expiry_timestamp_seconds"] == \
            server.certificate.not_valid_after_utc.timestamp()
    finally:
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
