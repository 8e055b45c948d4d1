"""The coordinator's exception hierarchy. Each class names the Pulsar ``ServerError`` it becomes;
the server turns an exception into the typed response in exactly one place (server/dispatch.py)."""

from __future__ import annotations


class CoordinatorError(Exception):
    """Base class. ``server_error`` is the name of the Pulsar ServerError code it maps to."""

    server_error = "UnknownError"


class TransactionNotFound(CoordinatorError):
    """No header for the id, or the caller is neither its owner nor a superuser (as Pulsar answers)."""

    server_error = "TransactionNotFound"


class InvalidTxnStatus(CoordinatorError):
    """The txn is not in a state that allows the request (ended, or timed out)."""

    server_error = "InvalidTxnStatus"


class NotAllowed(CoordinatorError):
    """A request the coordinator refuses by policy (e.g. a timeout above the configured maximum)."""

    server_error = "NotAllowedError"


class CoordinatorNotFound(CoordinatorError):
    """This instance does not lead the coordinator, or cannot reach the store. The Java client
    retries exactly this error with a fresh lookup (TransactionMetaStoreHandler.checkIfNeedRetryByError)."""

    server_error = "TransactionCoordinatorNotFound"


class StoreCorrupted(CoordinatorError):
    """A stored record the coordinator needs is not what its key says (damaged, or written by a
    foreign tool). The message names the record, never its stored bytes (issue 15)."""

    server_error = "MetadataError"


class ParallelismMismatch(Exception):
    """The store holds another number of coordinators than this instance was started with."""
