"""Typed Pulsar commands: what ``decode_command`` returns and ``encode_command`` takes. They are values:
nothing changes one after it is built.

Each class serves both directions (the server decodes requests and encodes responses; the test
client and the benchmark do the opposite), so a class holds exactly what its wire message carries,
named the Pythonic way. Field numbers, defaults and enum values are in protocol/pulsar_tc.proto and
docs/pulsar-protocol.md §2. Ids are plain ints: ``request_id`` as Java sees it (a signed 64-bit
``long``, so the ``-1`` of an authentication ERROR stays ``-1``), txn id halves as unsigned 64-bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import TypeAlias

from tc_server.wire.errors import ServerError

__all__ = [
    "AddPartitionToTxn",
    "AddPartitionToTxnResponse",
    "AddSubscriptionToTxn",
    "AddSubscriptionToTxnResponse",
    "AuthChallenge",
    "AuthResponse",
    "Command",
    "Connect",
    "Connected",
    "EndTxn",
    "EndTxnOnPartition",
    "EndTxnOnPartitionResponse",
    "EndTxnOnSubscription",
    "EndTxnOnSubscriptionResponse",
    "EndTxnResponse",
    "Error",
    "FeatureFlags",
    "Lookup",
    "LookupResponse",
    "LookupType",
    "NewTxn",
    "NewTxnResponse",
    "PartitionedMetadata",
    "PartitionedMetadataResponse",
    "Ping",
    "Pong",
    "Subscription",
    "TcAssignment",
    "TcAssignmentsSnapshot",
    "TcClientConnect",
    "TcClientConnectResponse",
    "TxnAction",
    "Unknown",
    "WatchTcAssignments",
    "WatchTcAssignmentsClose",
    "WatchTcAssignmentsUpdate",
]


class LookupType(IntEnum):
    """``CommandLookupTopicResponse.LookupType``."""

    REDIRECT = 0
    CONNECT = 1
    FAILED = 2


class TxnAction(IntEnum):
    """``TxnAction`` of END_TXN."""

    COMMIT = 0
    ABORT = 1


@dataclass(frozen=True, slots=True)
class FeatureFlags:
    """Capabilities a peer announces in CONNECT / CONNECTED (all default to off on the wire)."""

    supports_auth_refresh: bool = False
    supports_broker_entry_metadata: bool = False
    supports_partial_producer: bool = False
    supports_topic_watchers: bool = False
    supports_get_partitioned_metadata_without_auto_creation: bool = False
    supports_repl_dedup_by_lid_and_eid: bool = False
    supports_topic_watcher_reconcile: bool = False
    supports_scalable_topics: bool = False
    supports_tc_metadata_discovery: bool = False


@dataclass(frozen=True, slots=True)
class Subscription:
    """A (topic, subscription) pair of ADD_SUBSCRIPTION_TO_TXN."""

    topic: str
    subscription: str


# -- handshake and keep-alive -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT (2), the client's first command."""

    client_version: str
    protocol_version: int = 0
    auth_method_name: str | None = None
    auth_data: bytes | None = None
    feature_flags: FeatureFlags | None = None
    proxy_to_broker_url: str | None = None
    original_principal: str | None = None
    # Set by a Pulsar proxy that forwards its client's credentials.
    original_auth_data: str | None = None
    original_auth_method: str | None = None
    proxy_version: str | None = None


@dataclass(frozen=True, slots=True)
class Connected:
    """CONNECTED (3): the handshake succeeded."""

    server_version: str
    protocol_version: int
    max_message_size: int | None = None
    feature_flags: FeatureFlags | None = None


@dataclass(frozen=True, slots=True)
class AuthChallenge:
    """AUTH_CHALLENGE (36); ``challenge_*`` are the AuthData sub-message (absent when both are None)."""

    server_version: str
    challenge_method: str | None
    challenge_data: bytes | None
    protocol_version: int


@dataclass(frozen=True, slots=True)
class AuthResponse:
    """AUTH_RESPONSE (37); ``response_*`` are the AuthData sub-message (absent when both are None)."""

    client_version: str
    response_method: str | None
    response_data: bytes | None
    protocol_version: int


@dataclass(frozen=True, slots=True)
class Ping:
    """PING (18); answer with PONG at once."""


@dataclass(frozen=True, slots=True)
class Pong:
    """PONG (19)."""


@dataclass(frozen=True, slots=True)
class Error:
    """ERROR (14). Java clients match it only against lookup/metadata/connect requests, never txn ops
    (docs/pulsar-protocol.md §1), so txn ops must be answered with their typed response instead."""

    request_id: int
    error: ServerError
    message: str


# -- discovery ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionedMetadata:
    """PARTITIONED_METADATA (21)."""

    topic: str
    request_id: int
    metadata_auto_creation_enabled: bool = True


@dataclass(frozen=True, slots=True)
class PartitionedMetadataResponse:
    """PARTITIONED_METADATA_RESPONSE (22). On the wire ``response`` is Failed iff ``error`` is set.

    Decoding a Failed response that carries no error code gives ``error=UnknownError``.
    """

    request_id: int
    partitions: int = 0
    error: ServerError | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class Lookup:
    """LOOKUP (23). ``advertised_listener_name`` and ``properties`` are the client's (Java's
    ``listenerName`` and ``lookupProperties``): a forwarded lookup must reach every broker it is
    redirected to with them, or the answer names the default listener's URL."""

    topic: str
    request_id: int
    authoritative: bool = False
    advertised_listener_name: str | None = None
    properties: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class LookupResponse:
    """LOOKUP_RESPONSE (24). A response decoded without a ``response`` field is FAILED: that is
    how the Java client treats it (docs/pulsar-protocol.md §1)."""

    request_id: int
    response: LookupType
    broker_service_url: str | None = None
    broker_service_url_tls: str | None = None
    authoritative: bool = False
    error: ServerError | None = None
    message: str | None = None
    proxy_through_service_url: bool = False


@dataclass(frozen=True, slots=True)
class TcAssignment:
    """Who leads one TC partition (PIP-473 discovery)."""

    tc_id: int
    broker_service_url: str | None = None
    broker_service_url_tls: str | None = None


@dataclass(frozen=True, slots=True)
class TcAssignmentsSnapshot:
    """The full tcId → URL map; a partition in mid-election is simply missing."""

    parallelism: int
    assignments: tuple[TcAssignment, ...] = ()


@dataclass(frozen=True, slots=True)
class WatchTcAssignments:
    """WATCH_TC_ASSIGNMENTS (79, PIP-473): subscribe to the TC assignment map."""

    watch_id: int


@dataclass(frozen=True, slots=True)
class WatchTcAssignmentsUpdate:
    """WATCH_TC_ASSIGNMENTS_UPDATE (80): the whole current map, or an error."""

    watch_id: int
    snapshot: TcAssignmentsSnapshot | None = None
    error: ServerError | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class WatchTcAssignmentsClose:
    """WATCH_TC_ASSIGNMENTS_CLOSE (81)."""

    watch_id: int


# -- transactions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TcClientConnect:
    """TC_CLIENT_CONNECT_REQUEST (62): a client's handler for ``tc_id`` attaching to this connection.

    ``scalable`` (field 3) marks a v5 (PIP-473) client; the same applies to the txn commands below.
    """

    request_id: int
    tc_id: int
    scalable: bool = False


@dataclass(frozen=True, slots=True)
class TcClientConnectResponse:
    """TC_CLIENT_CONNECT_RESPONSE (63)."""

    request_id: int
    error: ServerError | None = None
    message: str | None = None


# The txn commands and their answers, from here to EndTxnOnSubscriptionResponse, are not frozen: one of
# each is built per request, and a frozen dataclass's __init__ sets every field through
# object.__setattr__. Unfrozen with TxnHeader, Record and Put, the Java pair-bench at 64 in flight used
# ~7 % less CPU per pair (issue 13; docs/performance.md, *Against Pulsar's own coordinator*, "A correction"). They are
# values all the same.
@dataclass(slots=True)
class NewTxn:
    """NEW_TXN (50). ``ttl_ms`` is wire field 2, always milliseconds; 0 means "not given"."""

    request_id: int
    ttl_ms: int = 0
    tc_id: int = 0
    scalable: bool = False


@dataclass(slots=True)
class AddPartitionToTxn:
    """ADD_PARTITION_TO_TXN (52)."""

    request_id: int
    most: int
    least: int
    partitions: tuple[str, ...] = ()
    scalable: bool = False


@dataclass(slots=True)
class AddSubscriptionToTxn:
    """ADD_SUBSCRIPTION_TO_TXN (54)."""

    request_id: int
    most: int
    least: int
    subscriptions: tuple[Subscription, ...] = ()
    scalable: bool = False


@dataclass(slots=True)
class EndTxn:
    """END_TXN (56). Decoding a frame whose action is missing or not COMMIT/ABORT raises
    MalformedCommand (with the request id)."""

    request_id: int
    most: int
    least: int
    action: TxnAction
    scalable: bool = False


@dataclass(slots=True)
class _TxnOpResponse:
    # The four txn-op responses share one wire shape. ``most`` is txnid_most_bits and has no default
    # on purpose: the Java client routes a response by it and closes the connection on an unknown
    # tcId, so every response, errors included, must carry the tcId (docs/pulsar-protocol.md §3).
    request_id: int
    most: int
    least: int = 0
    error: ServerError | None = None
    message: str | None = None


@dataclass(slots=True)
class NewTxnResponse(_TxnOpResponse):
    """NEW_TXN_RESPONSE (51): the new txn id, or the error."""


@dataclass(slots=True)
class AddPartitionToTxnResponse(_TxnOpResponse):
    """ADD_PARTITION_TO_TXN_RESPONSE (53)."""


@dataclass(slots=True)
class AddSubscriptionToTxnResponse(_TxnOpResponse):
    """ADD_SUBSCRIPTION_TO_TXN_RESPONSE (55)."""


@dataclass(slots=True)
class EndTxnResponse(_TxnOpResponse):
    """END_TXN_RESPONSE (57)."""


@dataclass(frozen=True, slots=True)
class EndTxnOnPartition:
    """END_TXN_ON_PARTITION (58): the coordinator tells the broker owning ``topic`` (one partition) the
    decision. ``low_watermark`` is field 6, a uint64 the 4.x broker reads as a signed Java long and
    requires (docs/participants.md, "The low watermark")."""

    request_id: int
    most: int
    least: int
    topic: str
    action: TxnAction
    low_watermark: int


@dataclass(frozen=True, slots=True)
class EndTxnOnSubscription:
    """END_TXN_ON_SUBSCRIPTION (60): the decision for the txn's acks on one subscription."""

    request_id: int
    most: int
    least: int
    subscription: Subscription
    action: TxnAction
    low_watermark: int


@dataclass(slots=True)
class EndTxnOnPartitionResponse(_TxnOpResponse):
    """END_TXN_ON_PARTITION_RESPONSE (59)."""


@dataclass(slots=True)
class EndTxnOnSubscriptionResponse(_TxnOpResponse):
    """END_TXN_ON_SUBSCRIPTION_RESPONSE (61)."""


@dataclass(frozen=True, slots=True)
class Unknown:
    """A well-formed BaseCommand of a type this codec does not serve (docs/semantics.md §7: answer with
    ERROR NotAllowedError and keep the connection).

    ``type_code`` is the wire Type value, which may be one this codec has no name for.
    ``request_id`` is recovered for the types whose message layout the codec knows; otherwise None.
    Encoding an Unknown sends a BaseCommand with just that type (useful only in tests).
    """

    type_code: int
    request_id: int | None = None


Command: TypeAlias = (
    Connect
    | Connected
    | AuthChallenge
    | AuthResponse
    | Ping
    | Pong
    | Error
    | PartitionedMetadata
    | PartitionedMetadataResponse
    | Lookup
    | LookupResponse
    | WatchTcAssignments
    | WatchTcAssignmentsUpdate
    | WatchTcAssignmentsClose
    | TcClientConnect
    | TcClientConnectResponse
    | NewTxn
    | NewTxnResponse
    | AddPartitionToTxn
    | AddPartitionToTxnResponse
    | AddSubscriptionToTxn
    | AddSubscriptionToTxnResponse
    | EndTxn
    | EndTxnResponse
    | EndTxnOnPartition
    | EndTxnOnPartitionResponse
    | EndTxnOnSubscription
    | EndTxnOnSubscriptionResponse
    | Unknown
)
