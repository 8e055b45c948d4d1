"""CONNECT → CONNECTED: protocol version negotiation, authentication, and the refresh of expiring
credentials, as a broker's ServerCnx does them (docs/security.md).

Sans-IO: the connection hands over what the client sent (and its verified TLS certificate) and gets
back what to answer; it owns the timer that calls :meth:`AuthSession.check`.

- Authentication off (no provider configured): CONNECTED at once, principal None, whatever method
  the client names ("none", or the Go client's empty name).
- On: the provider CONNECT's ``auth_method_name`` names proves a role, which becomes the principal
  (the txn owner); otherwise ERROR AuthenticationError and the connection closes. Our providers
  finish in one step, so the handshake never sends an AUTH_CHALLENGE of its own.
- Refresh (ServerCnx.refreshAuthenticationCredentials): every check interval, credentials whose
  expiry has passed are challenged with AUTH_CHALLENGE ``"PulsarAuthRefresh"`` if the client announced
  ``supports_auth_refresh``; a client that cannot refresh, or has not answered by the next check, is
  disconnected. The refreshed role must be the same.

Proxies (``--proxy-roles``, the brokers' ``proxyRoles``). A Pulsar proxy connects with its own
credentials and names the client it carries in CONNECT's ``original_principal``. A connection that proves a
proxy role acts as that client: its txns are owned by ``original_principal``, and it is a superuser only
when the proxy role and the client both are (a broker's ServerCnx.isSuperUser). The proxy must name a
client, and that client must not be a proxy role itself; otherwise ERROR AuthorizationError and the
connection closes, as a broker answers such a CONNECT ("Invalid roles.",
AuthorizationService.isValidOriginalPrincipal). Anyone else's ``original_principal`` is ignored: the
principal is the role the connection proved, so no client names its own owner (brokers still take it from
a non-proxy role, with a warning that they will stop).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from tc_server import __version__
from tc_server.auth.api import Authenticated, AuthenticationData, AuthenticationFailed
from tc_server.wire import AuthChallenge, Connect, Connected, FeatureFlags

__all__ = [
    "MIN_TC_CLIENT_CONNECT_VERSION",
    "REFRESH_AUTH_DATA",
    "SERVER_PROTOCOL_VERSION",
    "SERVER_VERSION",
    "AuthSession",
    "AuthenticationFailed",
    "Authenticator",
    "HandshakeResult",
    "InvalidRoles",
    "NoAuthentication",
    "RefreshAction",
    "negotiate",
    "refresh_challenge",
]

# ProtocolVersion v21 is the newest the Java client sends (Commands.getCurrentProtocolVersion).
SERVER_PROTOCOL_VERSION = 21
# The Java client sends TC_CLIENT_CONNECT only when CONNECTED says more than v18
# (TransactionMetaStoreHandler.connectionOpened); every client we serve is newer, see the warning.
MIN_TC_CLIENT_CONNECT_VERSION = 19
SERVER_VERSION = f"tc-server {__version__}"
# AuthData.REFRESH_AUTH_DATA: the challenge that asks a client for fresh credentials.
REFRESH_AUTH_DATA = b"PulsarAuthRefresh"


class Authenticator(Protocol):
    def authenticate(self, method: str | None, data: AuthenticationData) -> Authenticated | None:
        """The identity these credentials prove; None when authentication is off (everyone connects,
        principal None). Raises AuthenticationFailed with a message fit for the client."""
        ...

    def is_superuser(self, role: str | None) -> bool: ...

    def is_proxy_role(self, role: str | None) -> bool: ...


class InvalidRoles(Exception):  # noqa: N818 - named as the broker's answer ("Invalid roles.")
    """A proxy role without a client to act as, or naming another proxy role: answered AuthorizationError."""


class NoAuthentication:
    """Authentication disabled, as Pulsar's default: everyone connects and owns nothing."""

    def authenticate(self, method: str | None, data: AuthenticationData) -> Authenticated | None:
        return None

    def is_superuser(self, role: str | None) -> bool:
        return False

    def is_proxy_role(self, role: str | None) -> bool:
        return False


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class RefreshAction(Enum):
    NOTHING = "nothing"
    CHALLENGE = "challenge"  # send AUTH_CHALLENGE "PulsarAuthRefresh"
    CLOSE = "close"  # expired and cannot or did not refresh


def refresh_challenge(method: str | None, protocol_version: int) -> AuthChallenge:
    """AUTH_CHALLENGE asking a client for fresh credentials of ``method`` (ServerCnx's refresh)."""
    return AuthChallenge(SERVER_VERSION, method, REFRESH_AUTH_DATA, protocol_version)


class AuthSession:
    """The credentials of one authenticated connection, and where their refresh stands."""

    def __init__(self, credentials: Authenticated, supports_refresh: bool, protocol_version: int) -> None:
        self.credentials = credentials
        self.supports_refresh = supports_refresh
        self.protocol_version = protocol_version
        self.challenge_pending = False

    @property
    def role(self) -> str:
        return self.credentials.role

    @property
    def expires(self) -> bool:
        return self.credentials.expires_at_ms is not None

    def expired(self, now_ms: int) -> bool:
        expires_at = self.credentials.expires_at_ms
        return expires_at is not None and expires_at < now_ms

    def check(self, now_ms: int) -> tuple[RefreshAction, str]:
        """One tick of the refresh check: what to do, and why (for the log)."""
        if not self.expired(now_ms):
            return RefreshAction.NOTHING, "credentials valid"
        if not self.supports_refresh:
            return RefreshAction.CLOSE, "credentials expired and the client does not support auth refresh"
        if self.challenge_pending:
            return RefreshAction.CLOSE, "credentials expired and the client did not answer the refresh challenge"
        self.challenge_pending = True
        return RefreshAction.CHALLENGE, "credentials expired: challenging the client"

    def challenge(self) -> AuthChallenge:
        return refresh_challenge(self.credentials.method, self.protocol_version)

    def refresh(self, authenticator: Authenticator, response_data: bytes | None,
                peer_certificate: bytes | None) -> None:
        """AUTH_RESPONSE: authenticate the fresh credentials with the connection's original method.
        Raises AuthenticationFailed if they are refused or prove another role."""
        fresh = authenticator.authenticate(self.credentials.method,
                                           AuthenticationData(command_data=response_data or b"",
                                                              peer_certificate=peer_certificate))
        if fresh is None:
            return  # authentication was turned off under us: nothing to check
        if fresh.role != self.credentials.role:
            raise AuthenticationFailed("the role cannot change during an authentication refresh")
        self.credentials = fresh
        self.challenge_pending = False


@dataclass(frozen=True)
class HandshakeResult:
    connected: Connected
    protocol_version: int
    # None when authentication is off.
    session: AuthSession | None
    # Who the connection's txn requests act as: the txn owner (None when authentication is off; the
    # client a proxy names, see the module text), and whether they may act on any txn.
    principal: str | None = None
    superuser: bool = False

    @property
    def proxied(self) -> bool:
        """A Pulsar proxy's connection, acting for the client it names."""
        return self.session is not None and self.principal != self.session.role


def negotiate(connect: Connect, authenticator: Authenticator, max_message_size: int,
              peer_certificate: bytes | None = None) -> HandshakeResult:
    """The CONNECTED answer: ``protocol_version = min(ours, client's)`` as Commands.newConnectedCommand.
    Raises AuthenticationFailed, or InvalidRoles for a proxy role's CONNECT that names no client to
    act as (or another proxy).

    The C++ client (Python wheel) speaks v20, the Java client v21: never assume one version."""
    version = min(SERVER_PROTOCOL_VERSION, max(0, connect.protocol_version))
    credentials = authenticator.authenticate(
        connect.auth_method_name,
        AuthenticationData(command_data=connect.auth_data or b"", peer_certificate=peer_certificate),
    )
    session = None
    principal: str | None = None
    superuser = False
    if credentials is not None:
        flags = connect.feature_flags
        session = AuthSession(credentials, supports_refresh=bool(flags and flags.supports_auth_refresh),
                              protocol_version=version)
        principal, superuser = _acting_as(credentials.role, connect.original_principal, authenticator)
    connected = Connected(
        server_version=SERVER_VERSION,
        protocol_version=version,
        max_message_size=max_message_size,
        # supports_tc_metadata_discovery: we serve WATCH_TC_ASSIGNMENTS (PIP-473's v5 discovery).
        feature_flags=FeatureFlags(supports_get_partitioned_metadata_without_auto_creation=True,
                                   supports_tc_metadata_discovery=True),
    )
    return HandshakeResult(connected, version, session, principal, superuser)


def _acting_as(role: str, original_principal: str | None, authenticator: Authenticator) -> tuple[str, bool]:
    """(principal, superuser) of a connection that proved ``role`` (see the module text)."""
    if not authenticator.is_proxy_role(role):
        return role, authenticator.is_superuser(role)
    if not original_principal or not original_principal.strip():
        raise InvalidRoles(f"Invalid roles: role {role!r} is a proxy role (--proxy-roles) and must name the "
                           "client it connects for in CONNECT's original_principal")
    if authenticator.is_proxy_role(original_principal):
        raise InvalidRoles(f"Invalid roles: the original_principal {original_principal[:64]!r} of proxy role "
                           f"{role!r} is a proxy role itself")
    return original_principal, authenticator.is_superuser(role) and authenticator.is_superuser(original_principal)
