"""tc-server's own (superuser) broker credential and a pulsar+ssl:// upstream.

README / docs/security.md: "A `pulsar://` URL in the answer's TLS field counts as none". The participant
delivery (END_TXN_ON_PARTITION after a commit) took the owner from the LOOKUP's CONNECT answer without
that check, and carried tc-server's superuser token there in the clear: every connection opened with a
TLS context now refuses a plain URL (Endpoint.with_tls)."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from tc_server.client import connect
from tc_server.wire import LookupResponse, LookupType
from tests.participants.test_delivery_gates import owner_broker
from tests.security.pki import TestCa
from tests.support.stand_in_broker import StandInBroker
from tests.support.waiting import async_wait_for

BROKER_TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0Yy1zZXJ2ZXIifQ.tc-server-superuser-signature"


@pytest.fixture
def ca(tmp_path) -> TestCa:
    return TestCa(tmp_path)


def broker_context(ca: TestCa) -> ssl.SSLContext:
    cert = ca.issue("localhost", "broker", server=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert.cert_file, cert.key_file)
    return context


@pytest.mark.parametrize("trust", ["trust-certs setting", "system CAs"])
async def test_delivery_never_sends_the_superuser_token_to_a_plain_url_in_the_tls_field(start, ca, trust, monkeypatch):
    # With the system's CAs (no --broker-client-tls-trust-certs) the delivery's connections had no TLS context of
    # their own, and a plain URL was connected to in plain: the token crossed in the clear (a review).
    settings = {"broker_client_tls_trust_certs": str(ca.cert_file)} if trust == "trust-certs setting" else {}
    if trust == "system CAs":
        monkeypatch.setenv("SSL_CERT_FILE", str(ca.cert_file))
    plain_owner = owner_broker()  # a broker's plain port: whatever reaches it crossed the network in the clear
    await plain_owner.start()
    tls = StandInBroker(ssl_context=broker_context(ca))
    # The owner's LOOKUP answer names a pulsar:// URL in its TLS field (a misconfigured advertised listener).
    tls.answer = lambda c: LookupResponse(c.request_id, LookupType.CONNECT, broker_service_url=plain_owner.url,
                                          broker_service_url_tls=plain_owner.url)
    await tls.start()
    app = await start(upstream_url=tls.url, **settings,
                      broker_client_auth_plugin="org.apache.pulsar.client.impl.auth.AuthenticationToken",
                      broker_client_auth_params=f"token:{BROKER_TOKEN}", participant_wait_s=2.0)
    client = await connect("127.0.0.1", app.listener.port)
    try:
        txn = await client.new_txn(tc_id=0)
        assert (await client.add_partition(txn.most, txn.least, "persistent://public/default/orders")).error is None
        assert (await client.end_txn(txn.most, txn.least, commit=True)).error is None
        await async_wait_for(lambda: tls.lookup_frames, "the delivery looked the topic up on the TLS upstream", 10)
        await asyncio.sleep(0.5)  # a leak would follow the lookup's answer: the time for it to show
        leaked = [c for c in plain_owner.connects if c.auth_data == BROKER_TOKEN.encode()]
        assert leaked == [], ("tc-server's superuser broker token was sent over plain TCP to "
                              f"{plain_owner.url} (named in the lookup answer's TLS field)")
    finally:
        client.close()
        plain_owner.stop()
        tls.stop()


async def test_decisions_reach_plain_brokers_when_trust_certs_is_set(start, tmp_path):
    # --broker-client-tls-trust-certs set for peer relays over TLS, the brokers plain: the broker pool had the
    # credentials' TLS context, and since connections opened with one refuse plain URLs (Endpoint.with_tls),
    # no decision reached the brokers. The pool has it only with a TLS upstream now.
    owner = owner_broker()
    await owner.start()
    owner.answer = lambda c: LookupResponse(c.request_id, LookupType.CONNECT, broker_service_url=owner.url)
    ca = TestCa(tmp_path)
    app = await start(upstream_url=owner.url, broker_client_tls_trust_certs=str(ca.cert_file),
                      broker_client_auth_plugin="token", broker_client_auth_params="token:abc",
                      participant_wait_s=1.0)
    client = await connect("127.0.0.1", app.listener.port)
    try:
        txn = await client.new_txn(tc_id=0)
        assert (await client.add_partition(txn.most, txn.least, "persistent://public/default/orders")).error is None
        assert (await client.end_txn(txn.most, txn.least, commit=True)).error is None
        await async_wait_for(lambda: owner.end_txns)
        assert len(owner.end_txns) == 1
    finally:
        client.close()
        owner.stop()
