"""The client side of the Pulsar protocol: tc-server talking to brokers (forwarded lookups, participant
delivery), and the wire-level client the tests and the load generator use. One implementation for all.

* :mod:`connection`: one connection (handshake with credentials, keep-alive, request-id correlation).
* :mod:`pool`: one connection per broker URL, reconnecting with backoff.
* :mod:`errors`: typed failures and which of them are worth retrying.
* :mod:`tc`: the transaction-coordinator client of the tests and the benchmark.
"""

from tc_server.client.connection import (
    ClientAuth,
    Endpoint,
    PulsarConnection,
    connect_command,
    error_of,
    open_connection,
)
from tc_server.client.errors import (
    BrokerError,
    ClientError,
    ConnectionClosed,
    ConnectionFailed,
    HandshakeRefused,
    RequestTimedOut,
    is_retryable,
)
from tc_server.client.pool import ConnectionPool
from tc_server.client.tc import TcClient, connect, connect_coordinators

__all__ = [
    "BrokerError",
    "ClientAuth",
    "ClientError",
    "ConnectionClosed",
    "ConnectionFailed",
    "ConnectionPool",
    "Endpoint",
    "HandshakeRefused",
    "PulsarConnection",
    "RequestTimedOut",
    "TcClient",
    "connect",
    "connect_coordinators",
    "connect_command",
    "error_of",
    "is_retryable",
    "open_connection",
]
