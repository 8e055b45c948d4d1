"""Pulsar's ServerError codes and the exceptions the wire codec raises.

``WireError`` is the root of everything ``tc_server.wire`` raises on bad input; nothing else escapes
the codec (the fuzz tests hold it to that). The two kinds call for different answers from the
connection: a ``FrameError`` means the byte stream can no longer be split into frames, so the only
answer is to close; a ``MalformedCommand`` sits in a well-framed stream, so the connection can send
an ERROR for ``request_id`` (when the codec could recover it) before closing (docs/semantics.md §7).
"""

from __future__ import annotations

import enum

__all__ = ["FrameError", "MalformedCommand", "ServerError", "WireError"]


class ServerError(enum.IntEnum):
    """``ServerError`` of PulsarApi.proto (docs/pulsar-protocol.md §2); the values are wire codes."""

    UnknownError = 0
    MetadataError = 1
    PersistenceError = 2
    AuthenticationError = 3
    AuthorizationError = 4
    ConsumerBusy = 5
    ServiceNotReady = 6
    ProducerBlockedQuotaExceededError = 7
    ProducerBlockedQuotaExceededException = 8
    ChecksumError = 9
    UnsupportedVersionError = 10
    TopicNotFound = 11
    SubscriptionNotFound = 12
    ConsumerNotFound = 13
    TooManyRequests = 14
    TopicTerminatedError = 15
    ProducerBusy = 16
    InvalidTopicName = 17
    IncompatibleSchema = 18
    ConsumerAssignError = 19
    TransactionCoordinatorNotFound = 20
    InvalidTxnStatus = 21
    NotAllowedError = 22
    TransactionConflict = 23
    TransactionNotFound = 24
    ProducerFenced = 25


class WireError(Exception):
    """Base of every error the wire codec raises on bad input."""


class FrameError(WireError):
    """The byte stream is not a valid sequence of Pulsar frames; the connection must be closed."""


class MalformedCommand(WireError):
    """A complete frame whose BaseCommand cannot be turned into a command.

    ``request_id`` is the request id the command carried, when it could be read despite the problem
    (``None`` otherwise), so the caller can answer the request it cannot serve. ``reason`` says what
    is wrong, in words fit for the ERROR message sent to the peer.
    """

    def __init__(self, reason: str, request_id: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.request_id = request_id

    def __repr__(self) -> str:
        return f"MalformedCommand(reason={self.reason!r}, request_id={self.request_id!r})"
