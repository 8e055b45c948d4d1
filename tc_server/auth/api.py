"""The provider seam: what a client presented, who it turned out to be, and the one failure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class AuthenticationFailed(Exception):
    """The credentials were refused. The message is sent to the client and logged, so it names the
    problem ("token expired") and never contains the credentials themselves."""


@dataclass(frozen=True, slots=True)
class AuthenticationData:
    """What a client presented. On the Pulsar port ``command_data`` is CONNECT's (or AUTH_RESPONSE's)
    ``auth_data``; on the admin port ``bearer_token`` is the ``Authorization: Bearer`` value. Either way
    ``peer_certificate`` is the client's TLS certificate (DER), present only when the TLS layer
    verified it against the trusted CA."""

    command_data: bytes | None = None
    bearer_token: str | None = None
    peer_certificate: bytes | None = None

    def __repr__(self) -> str:
        # Never print the credentials, even by accident in a traceback or a debug log.
        return (f"AuthenticationData(command_data={'<hidden>' if self.command_data else None}, "
                f"bearer_token={'<hidden>' if self.bearer_token else None}, "
                f"peer_certificate={'<present>' if self.peer_certificate else None})")


@dataclass(frozen=True, slots=True)
class Authenticated:
    """A proven identity: ``role`` is the principal (the txn owner, what superuser roles name)."""

    role: str
    method: str
    # Wall-clock ms after which the credentials are no longer valid (a token's ``exp``), None for
    # never; the Pulsar port asks for fresh credentials once it has passed (docs/security.md).
    expires_at_ms: int | None = None


class AuthenticationProvider(Protocol):
    """One authentication method, as a broker's ``AuthenticationProvider``: ``method`` is the name
    clients send as CONNECT's ``auth_method_name`` (``token``, ``tls``)."""

    @property
    def method(self) -> str: ...

    def authenticate(self, data: AuthenticationData) -> Authenticated:
        """The identity these credentials prove. Raises AuthenticationFailed naming the problem."""
        ...
