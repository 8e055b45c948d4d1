"""Token authentication on the Pulsar port, with our wire client on real sockets: tokens signed as
AuthenticationProviderToken accepts them get in and own their transactions; anything else gets
ERROR AuthenticationError and the server closes the connection, having served nothing."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tc_server.auth.api import AuthenticationData
from tc_server.auth.token import TokenProvider
from tc_server.client import HandshakeRefused, connect
from tc_server.config import ConfigError
from tc_server.wire import Connect, Error, NewTxn, ServerError
from tests.security.pki import data_url, make_token, public_der
from tests.security.support import owner_of, raw_connect, token_auth


async def open_and_commit(app, token: str) -> str | None:
    """Open and commit one txn as ``token``'s bearer; returns the txn's recorded owner."""
    client = await connect("127.0.0.1", app.listener.port, auth=token_auth(token))
    try:
        created = await client.new_txn(tc_id=1, ttl_ms=60_000)
        assert created.error is None, created
        ended = await client.end_txn(created.most, created.least, commit=True)
        assert ended.error is None, ended
        return await owner_of(app, created.most, created.least)
    finally:
        client.close()


def assert_refused(result, reason: str) -> None:
    """ERROR AuthenticationError naming ``reason``, nothing else served, and the server closed the socket."""
    assert [type(c) for c in result.commands] == [Error], result.commands
    error = result.commands[0]
    assert error.error is ServerError.AuthenticationError
    assert reason in error.message
    assert result.closed_by_server


def connect_with(token: str | None, method: str | None = "token") -> Connect:
    return Connect("raw-test-client", 21, auth_method_name=method,
                   auth_data=None if token is None else token.encode())


# A NEW_TXN pipelined right behind the refused CONNECT: it must not be served.
PIPELINED = [NewTxn(request_id=7, ttl_ms=60_000, tc_id=0)]


async def test_hs256_token_opens_and_commits_as_its_subject(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret))
    assert await open_and_commit(app, make_token(secret, "HS256", "alice")) == "alice"


async def test_rs256_token_with_public_key(start, rsa_key):
    app = await start(authentication_providers="token", token_public_key=data_url(public_der(rsa_key)))
    assert await open_and_commit(app, make_token(rsa_key, "RS256", "bob")) == "bob"


async def test_es256_token_with_public_key_from_a_file(start, ec_key, tmp_path):
    key_file = tmp_path / "public.key"
    key_file.write_bytes(public_der(ec_key))
    app = await start(authentication_providers="token", token_public_key=f"file://{key_file}")
    assert await open_and_commit(app, make_token(ec_key, "ES256", "carol")) == "carol"


async def test_broker_provider_class_name_and_secret_from_a_file(start, secret, tmp_path):
    key_file = tmp_path / "secret.key"
    key_file.write_bytes(secret)
    app = await start(authentication_providers="org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
                      token_secret_key=f"file:///{key_file}")
    assert await open_and_commit(app, make_token(secret, "HS256", "alice")) == "alice"


async def test_wrong_signature_is_refused_and_closed(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret))
    forged = make_token(b"x" * 32, "HS256", "alice")
    result = await raw_connect(app.listener.port, connect_with(forged), then=PIPELINED)
    assert_refused(result, "signature does not verify")


async def test_rs256_token_signed_by_another_key_is_refused(start, rsa_key, ec_key):
    app = await start(authentication_providers="token", token_public_key=data_url(public_der(rsa_key)))
    result = await raw_connect(app.listener.port, connect_with(make_token(ec_key, "ES256", "alice")))
    assert_refused(result, "algorithm the configured key does not admit")


async def test_expired_token_is_refused_and_closed(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret))
    expired = make_token(secret, "HS256", "alice", expires_in_s=-60)
    result = await raw_connect(app.listener.port, connect_with(expired), then=PIPELINED)
    assert_refused(result, "token expired")


async def test_missing_token_is_refused_and_closed(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret))
    assert_refused(await raw_connect(app.listener.port, connect_with(None), then=PIPELINED), "blank token")
    # No method at all (the Go client without credentials) and "none" are refused too.
    assert_refused(await raw_connect(app.listener.port, connect_with(None, method=None)), "is not accepted here")
    assert_refused(await raw_connect(app.listener.port, connect_with(None, method="none")), "is not accepted here")


async def test_garbage_token_is_refused(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret))
    assert_refused(await raw_connect(app.listener.port, connect_with("not.a.jwt")), "malformed token")


async def test_our_client_sees_authentication_error(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret))
    with pytest.raises(HandshakeRefused) as refused:
        await connect("127.0.0.1", app.listener.port, auth=token_auth(make_token(secret, "HS256", expires_in_s=-5)))
    assert refused.value.error is ServerError.AuthenticationError


async def test_audience(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      token_audience="tc-server")
    assert await open_and_commit(app, make_token(secret, "HS256", "alice", aud=["pulsar", "tc-server"])) == "alice"
    wrong = make_token(secret, "HS256", "alice", aud="pulsar")
    assert_refused(await raw_connect(app.listener.port, connect_with(wrong)), "audience does not include")
    missing = make_token(secret, "HS256", "alice")
    assert_refused(await raw_connect(app.listener.port, connect_with(missing)), "no audience claim")


async def test_role_from_a_configured_claim(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret), token_auth_claim="role")
    assert await open_and_commit(app, make_token(secret, "HS256", "ignored-subject", role="svc-payments")) \
        == "svc-payments"
    without = make_token(secret, "HS256", "alice")
    assert_refused(await raw_connect(app.listener.port, connect_with(without)), "claim 'role' is missing")


async def test_nothing_is_served_before_connect(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret))
    result = await raw_connect(app.listener.port, NewTxn(request_id=3, ttl_ms=1000, tc_id=0))  # type: ignore[arg-type]
    assert [(type(c), getattr(c, "error", None)) for c in result.commands] == [(Error, ServerError.NotAllowedError)]
    assert result.closed_by_server


async def test_authentication_off_everyone_connects_and_owns_nothing(start):
    app = await start()
    client = await connect("127.0.0.1", app.listener.port)
    try:
        created = await client.new_txn(tc_id=0)
        assert await owner_of(app, created.most, created.least) is None
    finally:
        client.close()


def test_an_expiry_written_as_a_string_is_kept_for_the_refresh_check(secret):
    # PyJWT accepts (and enforces at CONNECT) an "exp" of digits in a string, as jjwt-based brokers do;
    # read as "no expiry", the connection was never re-checked once the token expired.
    provider = TokenProvider.with_secret_key(secret)
    exp = int(time.time()) + 600
    for written in (str(exp), exp, float(exp)):
        token = make_token(secret, "HS256", expires_in_s=None, exp=written)
        assert provider.authenticate(AuthenticationData(command_data=token.encode())).expires_at_ms == exp * 1000
    unbounded = make_token(secret, "HS256", expires_in_s=None)
    assert provider.authenticate(AuthenticationData(command_data=unbounded.encode())).expires_at_ms is None


def test_an_rsa_token_key_under_2048_bits_is_refused_at_start():
    # A broker (jjwt) refuses every token checked with such a key (WeakKeyException); tc-server took a
    # 1024-bit key silently (a Python warning on stderr only), and whoever factors it signs any role.
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with pytest.raises(ConfigError, match="the RSA key has 1024 bits; .* at least 2048"):
        TokenProvider.with_public_key(public_der(weak))
    TokenProvider.with_public_key(public_der(rsa.generate_private_key(public_exponent=65537, key_size=2048)))
