"""``--proxy-roles`` on the Pulsar port, over real sockets: a connection that proves a proxy role acts as
the client CONNECT's ``original_principal`` names (as a Pulsar proxy connects to brokers), owns that
client's txns, and is refused (AuthorizationError, connection closed) when it names no client or another
proxy. tests/e2e/test_pulsar_proxy.py runs the same through a real Pulsar proxy."""

from __future__ import annotations

from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from tc_server.client import TcClient, connect_command, open_connection
from tc_server.wire import Error, ServerError
from tests.security.pki import data_url, make_token
from tests.security.support import WAIT_S, owner_of, raw_connect, token_auth

TOPIC = "persistent://public/default/orders-partition-0"


@pytest.fixture
async def client_as(start, secret):
    """``client_as(app, role, for_client=None)``: our TC client proving ``role`` (a token of ``secret``)
    and, when ``for_client`` is given, naming it in ``original_principal`` as a Pulsar proxy does. Every
    client opened is closed after the test."""
    opened: list[TcClient] = []

    async def open_client(app, role: str, for_client: str | None = None) -> TcClient:
        url = f"pulsar://127.0.0.1:{app.listener.port}"
        connect = replace(connect_command(token_auth(make_token(secret, "HS256", role))),
                          original_principal=for_client)
        conn = await open_connection(url, connect, timeout_s=WAIT_S, factory=lambda: TcClient(url))
        assert isinstance(conn, TcClient)
        opened.append(conn)
        return conn

    yield open_client
    for conn in opened:
        conn.close()


async def test_a_proxy_acts_as_each_client_it_names(start, secret, client_as):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      proxy_roles="pulsar-proxy", superuser_roles="ops")
    with capture_logs() as logged:
        alice_via_proxy = await client_as(app, "pulsar-proxy", for_client="alice")
    bob_via_proxy = await client_as(app, "pulsar-proxy", for_client="bob")
    alice = await client_as(app, "alice")
    [connected] = [entry for entry in logged if entry["event"] == "client connected"]
    assert (connected["role"], connected["acting_as"]) == ("pulsar-proxy", "alice")  # who did what, in the log
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


async def test_a_superuser_behind_a_proxy_needs_a_superuser_proxy(start, secret, client_as):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      proxy_roles="pulsar-proxy, trusted-proxy", superuser_roles="ops, trusted-proxy")
    alice = await client_as(app, "alice")
    ops_via_proxy = await client_as(app, "pulsar-proxy", for_client="ops")
    ops_via_trusted = await client_as(app, "trusted-proxy", for_client="ops")
    txn = await alice.new_txn(tc_id=1, ttl_ms=60_000)
    answer = await ops_via_proxy.end_txn(txn.most, txn.least, commit=False)
    assert answer.error is ServerError.TransactionNotFound
    assert (await ops_via_trusted.end_txn(txn.most, txn.least, commit=False)).error is None


async def test_a_proxy_that_names_no_client_or_another_proxy_is_refused(start, secret, client_as):
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
    alice = await client_as(app, "alice")
    assert (await alice.new_txn(tc_id=0)).error is None


async def test_a_role_not_listed_as_a_proxy_is_itself_and_the_log_says_why(start, secret, client_as):
    """A proxy whose role was left out of --proxy-roles: its CONNECT is served as its own role (no client
    names its own owner), and the log names the setting, for the operator whose proxied lookups fail."""
    app = await start(authentication_providers="token", token_secret_key=data_url(secret))
    with capture_logs() as logged:
        unlisted = await client_as(app, "pulsar-proxy", for_client="alice")
    txn = await unlisted.new_txn(tc_id=0)
    assert await owner_of(app, txn.most, txn.least) == "pulsar-proxy"
    [line] = [entry for entry in logged if "original_principal ignored" in entry["event"]]
    assert (line["role"], line["original_principal"]) == ("pulsar-proxy", "alice")
    assert "--proxy-roles" in line["event"]
