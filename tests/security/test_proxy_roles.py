"""``--proxy-roles`` on the Pulsar port, over real sockets: a connection that proves a proxy role acts as
the client CONNECT's ``original_principal`` names (as a Pulsar proxy connects to brokers), owns that
client's txns, and is refused (AuthorizationError, connection closed) when it names no client or another
proxy. tests/e2e/test_pulsar_proxy.py runs the same through a real Pulsar proxy."""

from __future__ import annotations

from dataclasses import replace

from structlog.testing import capture_logs

from tc_server.client import TcClient, connect_command, open_connection
from tc_server.wire import Error, ServerError
from tests.security.pki import data_url, make_token
from tests.security.support import WAIT_S, owner_of, raw_connect, token_auth

TOPIC = "persistent://public/default/orders-partition-0"


async def through_proxy(app, secret: bytes, proxy_role: str, client: str | None) -> TcClient:
    """Our TC client connecting as a Pulsar proxy does for ``client``: the proxy's token, the client named."""
    url = f"pulsar://127.0.0.1:{app.listener.port}"
    connect = replace(connect_command(token_auth(make_token(secret, "HS256", proxy_role))),
                      original_principal=client)
    conn = await open_connection(url, connect, timeout_s=WAIT_S, factory=lambda: TcClient(url))
    assert isinstance(conn, TcClient)
    return conn


async def direct(app, secret: bytes, role: str) -> TcClient:
    url = f"pulsar://127.0.0.1:{app.listener.port}"
    conn = await open_connection(url, connect_command(token_auth(make_token(secret, "HS256", role))),
                                 timeout_s=WAIT_S, factory=lambda: TcClient(url))
    assert isinstance(conn, TcClient)
    return conn


async def test_a_proxy_acts_as_each_client_it_names(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      proxy_roles="pulsar-proxy", superuser_roles="ops")
    alice_via_proxy = await through_proxy(app, secret, "pulsar-proxy", "alice")
    bob_via_proxy = await through_proxy(app, secret, "pulsar-proxy", "bob")
    alice = await direct(app, secret, "alice")
    try:
        txn = await alice_via_proxy.new_txn(tc_id=3, ttl_ms=60_000)
        assert await owner_of(app, txn.most, txn.least) == "alice"  # not the proxy's role
        # Another client behind the same proxy cannot touch it, with the words of a missing id.
        for answer in (await bob_via_proxy.add_partition(txn.most, txn.least, TOPIC),
                       await bob_via_proxy.end_txn(txn.most, txn.least, commit=False)):
            assert (answer.error, answer.message) == (ServerError.TransactionNotFound,
                                                      f"transaction ({txn.most},{txn.least}) not found")
        assert (await alice_via_proxy.add_partition(txn.most, txn.least, TOPIC)).error is None
        # The same client connecting directly owns it too: ownership is the client's, not the path's.
        assert (await alice.end_txn(txn.most, txn.least, commit=True)).error is None
        own = await alice.new_txn(tc_id=3, ttl_ms=60_000)
        assert (await alice_via_proxy.end_txn(own.most, own.least, commit=False)).error is None
    finally:
        for client in (alice_via_proxy, bob_via_proxy, alice):
            client.close()


async def test_a_superuser_behind_a_proxy_needs_a_superuser_proxy(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      proxy_roles="pulsar-proxy, trusted-proxy", superuser_roles="ops, trusted-proxy")
    alice = await direct(app, secret, "alice")
    ops_via_proxy = await through_proxy(app, secret, "pulsar-proxy", "ops")
    ops_via_trusted = await through_proxy(app, secret, "trusted-proxy", "ops")
    try:
        txn = await alice.new_txn(tc_id=1, ttl_ms=60_000)
        answer = await ops_via_proxy.end_txn(txn.most, txn.least, commit=False)
        assert answer.error is ServerError.TransactionNotFound
        assert (await ops_via_trusted.end_txn(txn.most, txn.least, commit=False)).error is None
    finally:
        for client in (alice, ops_via_proxy, ops_via_trusted):
            client.close()


async def test_a_proxy_that_names_no_client_or_another_proxy_is_refused(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      proxy_roles="pulsar-proxy, other-proxy")
    proxy_token = token_auth(make_token(secret, "HS256", "pulsar-proxy"))
    for original, problem in ((None, "must name the client"), ("other-proxy", "is a proxy role itself")):
        result = await raw_connect(app.listener.port, replace(connect_command(proxy_token),
                                                              original_principal=original))
        assert result.closed_by_server
        [error] = result.commands
        assert isinstance(error, Error) and error.error is ServerError.AuthorizationError, error
        assert problem in (error.message or "")
    # The server goes on serving everyone else.
    alice = await direct(app, secret, "alice")
    try:
        assert (await alice.new_txn(tc_id=0)).error is None
    finally:
        alice.close()


async def test_a_role_not_listed_as_a_proxy_is_itself_and_the_log_says_why(start, secret):
    """A proxy whose role was left out of --proxy-roles: its CONNECT is served as its own role (no client
    names its own owner), and the log names the setting, for the operator whose proxied lookups fail."""
    app = await start(authentication_providers="token", token_secret_key=data_url(secret))
    with capture_logs() as logged:
        unlisted = await through_proxy(app, secret, "pulsar-proxy", "alice")
    try:
        txn = await unlisted.new_txn(tc_id=0)
        assert await owner_of(app, txn.most, txn.least) == "pulsar-proxy"
        [line] = [entry for entry in logged if "original_principal ignored" in entry["event"]]
        assert (line["role"], line["original_principal"]) == ("pulsar-proxy", "alice")
        assert "--proxy-roles" in line["event"]
    finally:
        unlisted.close()
