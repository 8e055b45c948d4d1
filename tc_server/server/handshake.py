"""CONNECT → CONNECTED: protocol version negotiation and the authentication seam (design §3).

Authentication is the seam design §9 keeps open: an :class:`Authenticator` turns CONNECT's
credentials into a principal (the txn owner) or refuses. Today only "none" exists, as a broker with
authentication disabled: CONNECTED at once, principal None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tc_server.wire import Connect, Connected, FeatureFlags

# ProtocolVersion v21 is the newest the Java client sends (Commands.getCurrentProtocolVersion).
SERVER_PROTOCOL_VERSION = 21
# The Java client sends TC_CLIENT_CONNECT only when CONNECTED says more than v18
# (TransactionMetaStoreHandler.connectionOpened); every client we serve is newer, see the warning.
MIN_TC_CLIENT_CONNECT_VERSION = 19
SERVER_VERSION = "tc-server 0.1.0"


class AuthenticationFailed(Exception):
    """The credentials were refused; the connection gets ERROR AuthenticationError and is closed."""


class Authenticator(Protocol):
    def authenticate(self, connect: Connect) -> str | None:
        """The principal for these credentials (None: anonymous). Raises AuthenticationFailed."""
        ...


class NoAuthentication:
    """Authentication disabled, as Pulsar's default: everyone connects and owns nothing."""

    def authenticate(self, connect: Connect) -> str | None:
        return None


@dataclass(frozen=True)
class HandshakeResult:
    connected: Connected
    principal: str | None
    protocol_version: int


def negotiate(connect: Connect, authenticator: Authenticator, max_message_size: int) -> HandshakeResult:
    """The CONNECTED answer: ``protocol_version = min(ours, client's)`` as Commands.newConnectedCommand.

    The C++ client (Python wheel) speaks v20, the Java client v21: never assume one version."""
    principal = authenticator.authenticate(connect)
    version = min(SERVER_PROTOCOL_VERSION, max(0, connect.protocol_version))
    connected = Connected(
        server_version=SERVER_VERSION,
        protocol_version=version,
        max_message_size=max_message_size,
        # supports_tc_metadata_discovery: we serve WATCH_TC_ASSIGNMENTS (PIP-473's v5 discovery).
        feature_flags=FeatureFlags(supports_get_partitioned_metadata_without_auto_creation=True,
                                   supports_tc_metadata_discovery=True),
    )
    return HandshakeResult(connected, principal, version)
