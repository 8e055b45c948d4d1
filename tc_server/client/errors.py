"""Typed failures of the client side: what went wrong talking to a broker (or another tc-server).

Callers decide by type (the two connection failures are also ``ConnectionError``s):
:class:`ConnectionFailed`, :class:`ConnectionClosed` and :class:`RequestTimedOut` are worth retrying
on a fresh connection; :class:`HandshakeRefused` and :class:`BrokerError`
carry the Pulsar error code the peer answered with.
"""

from __future__ import annotations

from tc_server.wire import ServerError


class ClientError(Exception):
    """Base of every client-side failure; ``url`` names the peer."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url


class ConnectionFailed(ClientError, ConnectionError):
    """The TCP (or TLS) connection could not be opened, or the handshake did not finish in time."""


class ConnectionClosed(ClientError, ConnectionError):
    """The connection was lost (or closed) before the answer arrived; the outcome is unknown."""


class RequestTimedOut(ClientError):
    """No answer within the request's timeout; the outcome is unknown."""


class HandshakeRefused(ClientError):
    """The peer answered CONNECT with ERROR (e.g. AuthenticationError)."""

    def __init__(self, url: str, error: ServerError, message: str) -> None:
        super().__init__(url, f"CONNECT refused: {error.name}: {message}")
        self.error = error
        self.server_message = message

    @property
    def of_credentials(self) -> bool:
        """Whether the credentials were refused (any broker of the cluster would refuse them), rather than the
        connection itself (a broker past brokerMaxConnections[PerIp] answers NotAllowedError before CONNECT)."""
        return self.error in (ServerError.AuthenticationError, ServerError.AuthorizationError)


class BrokerError(ClientError):
    """A typed response carried an error code."""

    def __init__(self, url: str, error: ServerError, message: str | None) -> None:
        super().__init__(url, f"{error.name}: {message or error.name}")
        self.error = error
        self.server_message = message


# Answers after which the same request, on a fresh lookup and connection, may succeed
# (pulsar-broker behaviour: a topic not loaded on this broker answers ServiceNotReady).
RETRYABLE_ERRORS = frozenset({
    ServerError.ServiceNotReady,
    ServerError.TooManyRequests,
    ServerError.MetadataError,
    ServerError.PersistenceError,
    ServerError.TransactionCoordinatorNotFound,
})


# PersistenceError is worth retrying (a bookie down, a ledger being rolled over), except on a topic that was
# terminated: a broker answers that ("... ManagedLedgerTerminatedException ...") to every later request
# for as long as the topic exists.
TERMINATED_TOPIC = "ManagedLedgerTerminatedException"


def is_retryable(exc: BaseException) -> bool:
    """True for failures where trying again later (fresh lookup, fresh connection) can succeed."""
    if isinstance(exc, ConnectionFailed | ConnectionClosed | RequestTimedOut):
        return True
    if isinstance(exc, BrokerError) and TERMINATED_TOPIC in (exc.server_message or ""):
        return False
    if isinstance(exc, BrokerError | HandshakeRefused):
        return exc.error in RETRYABLE_ERRORS
    return False
