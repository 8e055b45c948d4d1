"""The handshake's authentication decisions without sockets (tc_server/server/handshake.py): what a
CONNECT proves and when expiring credentials are challenged or the connection closed."""

from __future__ import annotations

import pytest

from tc_server.auth.api import Authenticated, AuthenticationFailed
from tc_server.auth.service import AuthenticationService
from tc_server.auth.token import TokenProvider
from tc_server.server.handshake import (
    REFRESH_AUTH_DATA,
    AuthSession,
    InvalidRoles,
    NoAuthentication,
    RefreshAction,
    negotiate,
)
from tc_server.wire import Connect, FeatureFlags
from tests.security.pki import make_token

SECRET = b"s" * 32


def service() -> AuthenticationService:
    return AuthenticationService([TokenProvider.with_secret_key(SECRET)], superusers=["admin"])


def connect(token: str | None, refresh: bool = False, version: int = 21) -> Connect:
    return Connect("test", version, auth_method_name="token", auth_data=None if token is None else token.encode(),
                   feature_flags=FeatureFlags(supports_auth_refresh=refresh))


def test_authentication_off_connects_everyone_as_nobody():
    result = negotiate(Connect("test", 20, auth_method_name=None), NoAuthentication(), 5 << 20)
    assert result.principal is None and result.session is None
    assert result.connected.protocol_version == 20  # min(ours, the client's): the C++ client speaks 20


def test_a_token_proves_its_role_and_expiry():
    token = make_token(SECRET, "HS256", "alice", expires_in_s=600)
    result = negotiate(connect(token, refresh=True), service(), 5 << 20)
    assert result.principal == "alice"
    assert result.session is not None and result.session.supports_refresh and result.session.expires


def test_original_principal_is_ignored():
    token = make_token(SECRET, "HS256", "alice")
    forged = Connect("test", 21, auth_method_name="token", auth_data=token.encode(), original_principal="admin")
    result = negotiate(forged, service(), 5 << 20)
    assert (result.principal, result.superuser, result.proxied) == ("alice", False, False)


def proxies(superusers: tuple[str, ...] = ("admin",)) -> AuthenticationService:
    return AuthenticationService([TokenProvider.with_secret_key(SECRET)], superusers=superusers,
                                 proxy_roles=["proxy", "proxy-2"])


def via_proxy(role: str, original_principal: str | None) -> Connect:
    token = make_token(SECRET, "HS256", role)
    return Connect("test", 21, auth_method_name="token", auth_data=token.encode(),
                   original_principal=original_principal)


def test_a_proxy_role_acts_as_the_client_it_names():
    result = negotiate(via_proxy("proxy", "alice"), proxies(), 5 << 20)
    assert (result.principal, result.superuser, result.proxied) == ("alice", False, True)
    assert result.session is not None and result.session.role == "proxy"  # the proxy's own credentials refresh


def test_a_proxied_client_is_a_superuser_only_when_the_proxy_role_is_one_too():
    """As a broker's ServerCnx.isSuperUser: both the proxy's role and the client it names."""
    assert negotiate(via_proxy("proxy", "admin"), proxies(), 5 << 20).superuser is False
    assert negotiate(via_proxy("proxy", "admin"), proxies(("admin", "proxy")), 5 << 20).superuser is True
    assert negotiate(via_proxy("proxy", "alice"), proxies(("admin", "proxy")), 5 << 20).superuser is False


@pytest.mark.parametrize(("original", "problem"), [
    (None, "must name the client"),
    ("", "must name the client"),
    ("  ", "must name the client"),
    ("proxy-2", "is a proxy role itself"),
    ("proxy", "is a proxy role itself"),
])
def test_a_proxy_role_must_name_a_client_that_is_no_proxy(original, problem):
    with pytest.raises(InvalidRoles, match=problem):
        negotiate(via_proxy("proxy", original), proxies(), 5 << 20)


def test_refused_credentials_raise_with_the_reason():
    with pytest.raises(AuthenticationFailed, match="token expired"):
        negotiate(connect(make_token(SECRET, "HS256", "alice", expires_in_s=-1)), service(), 5 << 20)


def session(expires_at_ms: int | None, supports_refresh: bool = True) -> AuthSession:
    return AuthSession(Authenticated("alice", "token", expires_at_ms), supports_refresh, protocol_version=21)


def test_refresh_check_challenges_once_then_closes():
    auth = session(expires_at_ms=1_000)
    assert auth.check(now_ms=999)[0] is RefreshAction.NOTHING
    assert auth.check(now_ms=1_001)[0] is RefreshAction.CHALLENGE
    challenge = auth.challenge()
    assert (challenge.challenge_method, challenge.challenge_data) == ("token", REFRESH_AUTH_DATA)
    assert challenge.challenge_data == b"PulsarAuthRefresh"  # AuthData.REFRESH_AUTH_DATA
    # Not answered by the next check: closed.
    assert auth.check(now_ms=2_000)[0] is RefreshAction.CLOSE


def test_a_client_without_refresh_support_is_closed_at_expiry():
    assert session(expires_at_ms=1_000, supports_refresh=False).check(now_ms=1_001)[0] is RefreshAction.CLOSE


def test_credentials_without_expiry_are_never_checked_again():
    auth = session(expires_at_ms=None)
    assert not auth.expires and auth.check(now_ms=2**62)[0] is RefreshAction.NOTHING


def test_a_refresh_takes_the_new_expiry_and_keeps_the_role():
    auth = session(expires_at_ms=1_000)
    auth.check(now_ms=1_001)
    fresh = make_token(SECRET, "HS256", "alice", expires_in_s=3600)
    auth.refresh(service(), fresh.encode(), None)
    assert auth.credentials.expires_at_ms is not None and auth.credentials.expires_at_ms > 1_000
    assert auth.check(now_ms=1_002)[0] is RefreshAction.NOTHING
    with pytest.raises(AuthenticationFailed, match="role cannot change"):
        auth.refresh(service(), make_token(SECRET, "HS256", "mallory").encode(), None)
