"""Credentials that expire while connected (ServerCnx.refreshAuthenticationCredentials): the server
checks every ``authentication_refresh_check_s``; once the token's ``exp`` has passed it sends
AUTH_CHALLENGE "PulsarAuthRefresh" to a client that announced ``supports_auth_refresh``. A fresh token
of the same role keeps the connection; anything else, or no refresh support, closes it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from structlog.testing import capture_logs

from tc_server.auth.broker_client import TOKEN_PLUGIN, broker_client_credentials
from tc_server.client import TcClient, connect
from tc_server.config import Settings
from tc_server.wire import AuthResponse, Connect, FeatureFlags, ServerError
from tests.security.pki import data_url, make_token
from tests.security.support import WAIT_S, token_auth
from tests.support.waiting import async_wait_for

CHECK_S = 0.2
# exp has whole-second resolution (make_token: int(now + lifetime)), so a token made now with this lifetime
# expires within 1-2 s. With 1 s it expired within 0-1 s: a CONNECT made right after could already find it
# expired (CI, 2026-11-24: "token expired" at the handshake). With 2 s, a stall of a second on a loaded machine
# between the handshake and the first request could still meet it; 3 s leaves 2-3 s for what comes before the expiry.
SHORT_LIFE_S = 3


async def refreshing_client(port: int, token: str, fresh_token: str) -> tuple[TcClient, list[str]]:
    """A client that announces supports_auth_refresh (as the Java client) and answers a challenge
    with ``fresh_token``; the list grows by one for every challenge it answered."""
    client = await connect("127.0.0.1", port, handshake=False)
    answered: list[str] = []

    def fresh_credentials() -> bytes:
        answered.append(fresh_token)
        return fresh_token.encode()

    client.auth_data_source = fresh_credentials
    await client.handshake(Connect("refresh-test-client", 21, auth_method_name="token", auth_data=token.encode(),
                                   feature_flags=FeatureFlags(supports_auth_refresh=True)))
    return client, answered


async def test_client_refreshes_with_a_fresh_token_and_stays(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      authentication_refresh_check_s=CHECK_S)
    short = make_token(secret, "HS256", "alice", expires_in_s=SHORT_LIFE_S)
    client, challenges = await refreshing_client(app.listener.port, short,
                                                 make_token(secret, "HS256", "alice", expires_in_s=3600))
    try:
        await async_wait_for(lambda: challenges)
        await client.ping(WAIT_S)  # the AUTH_RESPONSE went before it and has been handled
        await asyncio.sleep(5 * CHECK_S)  # several more checks: none may close the refreshed connection
        created = await client.new_txn(tc_id=0)
        assert created.error is None and not client.closed.done()
        assert len(challenges) == 1  # the fresh token is valid for an hour: no second challenge
    finally:
        client.close()


async def test_client_without_refresh_support_is_closed_at_expiry(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      authentication_refresh_check_s=CHECK_S)
    # Our plain client does not announce supports_auth_refresh.
    client = await connect("127.0.0.1", app.listener.port,
                           auth=token_auth(make_token(secret, "HS256", "alice", expires_in_s=SHORT_LIFE_S)))
    assert (await client.new_txn(tc_id=0)).error is None
    async with asyncio.timeout(WAIT_S):
        await client.closed


async def test_refresh_with_the_expired_token_again_is_refused_and_closed(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      authentication_refresh_check_s=CHECK_S)
    short = make_token(secret, "HS256", "alice", expires_in_s=SHORT_LIFE_S)
    client, challenges = await refreshing_client(app.listener.port, short, short)
    async with asyncio.timeout(WAIT_S):
        await client.closed
    assert challenges
    assert [(e.error, e.message) for e in client.errors] == [(ServerError.AuthenticationError, "token expired")]


async def test_refresh_may_not_change_the_role(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      authentication_refresh_check_s=CHECK_S)
    client, _ = await refreshing_client(app.listener.port,
                                        make_token(secret, "HS256", "alice", expires_in_s=SHORT_LIFE_S),
                                        make_token(secret, "HS256", "mallory", expires_in_s=3600))
    async with asyncio.timeout(WAIT_S):
        await client.closed
    assert [e.error for e in client.errors] == [ServerError.AuthenticationError]
    assert "role cannot change" in client.errors[0].message


async def test_token_without_exp_is_never_challenged(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      authentication_refresh_check_s=CHECK_S)
    forever = make_token(secret, "HS256", "alice", expires_in_s=None)
    client, challenges = await refreshing_client(app.listener.port, forever, forever)
    try:
        await asyncio.sleep(5 * CHECK_S)
        assert (await client.new_txn(tc_id=0)).error is None
        assert challenges == [] and not client.closed.done()
    finally:
        client.close()



async def test_a_refresh_reaches_the_clients_upstream_connections(start, secret):
    """Forwarded requests carry the client's own credentials (docs/security.md, "Forwarded requests"),
    so a refresh must reach the upstream connections too. The upstream here is a second tc-server with
    token authentication (a broker's refresh works the same way, ServerCnx): it challenges the
    forwarding connection once the client's first token expired, and must get the fresh token."""
    broker = await start(authentication_providers="token", token_secret_key=data_url(secret),
                         authentication_refresh_check_s=CHECK_S)
    front = await start(authentication_providers="token", token_secret_key=data_url(secret),
                        authentication_refresh_check_s=CHECK_S,
                        upstream_url=f"pulsar://127.0.0.1:{broker.listener.port}")
    short = make_token(secret, "HS256", "alice", expires_in_s=SHORT_LIFE_S)
    client, challenges = await refreshing_client(front.listener.port, short,
                                                 make_token(secret, "HS256", "alice", expires_in_s=3600))
    topic = "persistent://public/default/refreshed"
    try:
        # The upstream "broker" serves coordinators only: its answer for a normal topic is TopicNotFound
        # naming --upstream-url. Seeing that answer means the forwarding connection is alive.
        first = await client.partitioned_metadata(topic)
        assert first.error is ServerError.TopicNotFound and "upstream" in (first.message or ""), first
        await async_wait_for(lambda: challenges)
        await asyncio.sleep(10 * CHECK_S)  # the upstream's checks have challenged the forwarding connection
        again = await client.partitioned_metadata(topic)
        assert again.error is ServerError.TopicNotFound and "upstream" in (again.message or ""), again
        assert not client.closed.done()
    finally:
        client.close()


async def test_an_expiring_token_taken_in_a_refresh_is_checked_as_one_given_at_connect(start, secret):
    # The expiry check ran only when the CONNECT's token had an exp: a connection opened with a token
    # without one, then refreshed (an AUTH_RESPONSE, as after any challenge) with one that expires, stayed
    # open past that expiry, its forwarded requests carrying the expired token.
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      authentication_refresh_check_s=CHECK_S)
    forever = make_token(secret, "HS256", "alice", expires_in_s=None)
    short = make_token(secret, "HS256", "alice", expires_in_s=SHORT_LIFE_S)
    client, challenges = await refreshing_client(app.listener.port, forever, short)
    client.send(AuthResponse("refresh-test-client", "token", short.encode(), 21))
    async with asyncio.timeout(WAIT_S):
        await client.closed  # challenged once the short token expired, answered with it again: refused
    assert challenges


async def test_a_refresh_whose_credentials_cannot_be_read_closes_the_connection_with_a_line(start, secret, tmp_path):
    # tc-server's own connections to brokers answer a refresh from a token file read again; a file being
    # replaced (or an env: variable unset) raised ConfigError out of data_received into the event loop, which
    # logged a fatal error with a traceback (a review). Here tc-server challenges, as a broker does.
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      authentication_refresh_check_s=CHECK_S)
    token_file = tmp_path / "proxy.token"
    token_file.write_text(make_token(secret, "HS256", "alice", expires_in_s=SHORT_LIFE_S))
    credentials = broker_client_credentials(replace(Settings(), broker_client_auth_plugin=TOKEN_PLUGIN,
                                                    broker_client_auth_params=f"file://{token_file}"))
    loop = asyncio.get_running_loop()
    escaped: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: escaped.append(context))
    client = await connect("127.0.0.1", app.listener.port, handshake=False)
    try:
        client.auth_data_source = credentials.auth_data
        await client.handshake(Connect("refresh-test-client", 21, auth_method_name="token",
                                       auth_data=credentials.auth_data(),
                                       feature_flags=FeatureFlags(supports_auth_refresh=True)))
        token_file.unlink()  # being replaced when the challenge comes
        with capture_logs() as logged:
            async with asyncio.timeout(WAIT_S):
                await client.closed
        assert not escaped, escaped
        (line,) = [e for e in logged if e["event"] == "cannot answer the peer's credential challenge; closing the "
                   "connection"]
        assert "cannot read" in line["error"] and str(token_file) in line["error"], line
    finally:
        loop.set_exception_handler(previous)
        client.close()
