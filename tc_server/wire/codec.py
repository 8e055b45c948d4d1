"""BaseCommand bytes ⇄ typed commands. The only module that touches the generated protobuf classes.

``decode_command`` is the server's hot path, so both directions dispatch through dicts built once
(Type value → decoder, command class → encoder) and each codec function is written out by hand
rather than driven by reflection.

Presence rules: our .proto declares upstream's ``required`` fields ``optional`` (see its header), so
the checks for them live here, and each one names the field it found missing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.wire.commands import (
    AddPartitionToTxn,
    AddPartitionToTxnResponse,
    AddSubscriptionToTxn,
    AddSubscriptionToTxnResponse,
    AuthChallenge,
    AuthResponse,
    Command,
    Connect,
    Connected,
    EndTxn,
    EndTxnOnPartition,
    EndTxnOnPartitionResponse,
    EndTxnOnSubscription,
    EndTxnOnSubscriptionResponse,
    EndTxnResponse,
    Error,
    FeatureFlags,
    Lookup,
    LookupResponse,
    LookupType,
    NewTxn,
    NewTxnResponse,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    Ping,
    Pong,
    Subscription,
    TcAssignment,
    TcAssignmentsSnapshot,
    TcClientConnect,
    TcClientConnectResponse,
    TxnAction,
    Unknown,
    WatchTcAssignments,
    WatchTcAssignmentsClose,
    WatchTcAssignmentsUpdate,
    _TxnOpResponse,
)
from tc_server.wire.errors import MalformedCommand, ServerError
from tc_server.wire.framing import _HEADER as _FRAME_HEADER
from tc_server.wire.framing import encode_frame

__all__ = ["command_name", "decode_command", "encode_command"]

_Base = pb.BaseCommand
_parse: Final = _Base.FromString
_U64_MASK: Final = (1 << 64) - 1
_I64_SIGN: Final = 1 << 63
# Indexed by wire value; ServerError's values are exactly 0..25.
_SERVER_ERRORS: Final = tuple(ServerError)
_LOOKUP_TYPES: Final = tuple(LookupType)
_TXN_ACTIONS: Final = tuple(TxnAction)
# CommandPartitionedTopicMetadataResponse.LookupType (docs/pulsar-protocol.md §2).
_PM_SUCCESS: Final = 0
_PM_FAILED: Final = 1
_VARINT: Final = 0  # protobuf wire type of varint fields


def _type_name(code: int) -> str:
    try:
        return f"{_Base.Type.Name(code)} ({code})"
    except ValueError:
        return f"command type {code}"


# -- helpers for decoding -------------------------------------------------------------------------


def _request_id(wire: int) -> int:
    """A uint64 request id as Java reads it: a signed long (the auth-failure ERROR uses -1)."""
    return wire - (1 << 64) if wire >= _I64_SIGN else wire


def _text(value: object) -> str:
    # upb hands back proto2 strings that are not valid UTF-8 as bytes. Replace the bad bytes the way
    # Java's String(bytes, UTF_8) does rather than reject the command: a topic name with a bad byte
    # then simply matches nothing.
    if value.__class__ is str:
        return value
    assert isinstance(value, bytes)
    return value.decode("utf-8", "replace")


def _opt_text(msg: Any, field: str) -> str | None:
    return _text(getattr(msg, field)) if msg.HasField(field) else None


def _unknown_varint(msg: Any, number: int) -> int | None:
    """The last varint stored as unknown field ``number``: where proto2 puts an enum value it has no
    name for, so "absent" and "out of range" can be told apart."""
    found: int | None = None
    fields: Any = unknown_fields.UnknownFieldSet(msg)
    for field in fields:
        if field.field_number == number and field.wire_type == _VARINT:
            found = field.data
    return found


def _server_error(msg: Any, field: str, number: int) -> ServerError | None:
    if msg.HasField(field):
        error: ServerError = _SERVER_ERRORS[getattr(msg, field)]
        return error
    if _unknown_varint(msg, number) is not None:
        # A code newer than this codec: still an error, just not one it can name.
        return ServerError.UnknownError
    return None


def _no_body(code: int, field: str) -> MalformedCommand:
    return MalformedCommand(f"{_type_name(code)} without its {field} message")


def _missing(code: int, field: str, request_id: int | None = None) -> MalformedCommand:
    return MalformedCommand(f"{_type_name(code)} without required field {field}", request_id)


def _checked_request_id(msg: Any, code: int) -> int:
    if not msg.HasField("request_id"):
        raise _missing(code, "request_id")
    return _request_id(msg.request_id)


def _feature_flags(msg: Any) -> FeatureFlags:
    return FeatureFlags(
        msg.supports_auth_refresh,
        msg.supports_broker_entry_metadata,
        msg.supports_partial_producer,
        msg.supports_topic_watchers,
        msg.supports_get_partitioned_metadata_without_auto_creation,
        msg.supports_repl_dedup_by_lid_and_eid,
        msg.supports_topic_watcher_reconcile,
        msg.supports_scalable_topics,
        msg.supports_tc_metadata_discovery,
    )


# -- decoders, one per served Type ----------------------------------------------------------------

_Decoder = Callable[[pb.BaseCommand], Command]
_DECODERS: dict[int, _Decoder] = {}

_D = TypeVar("_D", bound=_Decoder)


def _decodes(code: int) -> Callable[[_D], _D]:
    def register(fn: _D) -> _D:
        _DECODERS[code] = fn
        return fn

    return register


@_decodes(_Base.CONNECT)
def _decode_connect(base: pb.BaseCommand) -> Command:
    if not base.HasField("connect"):
        raise _no_body(_Base.CONNECT, "connect")
    m = base.connect
    if not m.HasField("client_version"):
        raise _missing(_Base.CONNECT, "client_version")
    return Connect(
        client_version=_text(m.client_version),
        protocol_version=m.protocol_version,
        auth_method_name=_opt_text(m, "auth_method_name"),
        auth_data=m.auth_data if m.HasField("auth_data") else None,
        feature_flags=_feature_flags(m.feature_flags) if m.HasField("feature_flags") else None,
        proxy_to_broker_url=_opt_text(m, "proxy_to_broker_url"),
        original_principal=_opt_text(m, "original_principal"),
        original_auth_data=_opt_text(m, "original_auth_data"),
        original_auth_method=_opt_text(m, "original_auth_method"),
        proxy_version=_opt_text(m, "proxy_version"),
    )


@_decodes(_Base.CONNECTED)
def _decode_connected(base: pb.BaseCommand) -> Command:
    if not base.HasField("connected"):
        raise _no_body(_Base.CONNECTED, "connected")
    m = base.connected
    if not m.HasField("server_version"):
        raise _missing(_Base.CONNECTED, "server_version")
    return Connected(
        server_version=_text(m.server_version),
        protocol_version=m.protocol_version,
        max_message_size=m.max_message_size if m.HasField("max_message_size") else None,
        feature_flags=_feature_flags(m.feature_flags) if m.HasField("feature_flags") else None,
    )


@_decodes(_Base.AUTH_CHALLENGE)
def _decode_auth_challenge(base: pb.BaseCommand) -> Command:
    if not base.HasField("authChallenge"):
        raise _no_body(_Base.AUTH_CHALLENGE, "authChallenge")
    m = base.authChallenge
    auth = m.challenge
    has_auth = m.HasField("challenge")
    return AuthChallenge(
        server_version=_text(m.server_version),
        challenge_method=_opt_text(auth, "auth_method_name") if has_auth else None,
        challenge_data=auth.auth_data if has_auth and auth.HasField("auth_data") else None,
        protocol_version=m.protocol_version,
    )


@_decodes(_Base.AUTH_RESPONSE)
def _decode_auth_response(base: pb.BaseCommand) -> Command:
    if not base.HasField("authResponse"):
        raise _no_body(_Base.AUTH_RESPONSE, "authResponse")
    m = base.authResponse
    auth = m.response
    has_auth = m.HasField("response")
    return AuthResponse(
        client_version=_text(m.client_version),
        response_method=_opt_text(auth, "auth_method_name") if has_auth else None,
        response_data=auth.auth_data if has_auth and auth.HasField("auth_data") else None,
        protocol_version=m.protocol_version,
    )


# PING and PONG have empty messages; Java sends them, but their absence changes nothing.
_PING: Final = Ping()
_PONG: Final = Pong()
_DECODERS[_Base.PING] = lambda base: _PING
_DECODERS[_Base.PONG] = lambda base: _PONG


@_decodes(_Base.ERROR)
def _decode_error(base: pb.BaseCommand) -> Command:
    if not base.HasField("error"):
        raise _no_body(_Base.ERROR, "error")
    m = base.error
    request_id = _checked_request_id(m, _Base.ERROR)
    error = _server_error(m, "error", 2)
    if error is None:
        raise _missing(_Base.ERROR, "error", request_id)
    return Error(request_id, error, _text(m.message))


@_decodes(_Base.PARTITIONED_METADATA)
def _decode_partitioned_metadata(base: pb.BaseCommand) -> Command:
    if not base.HasField("partitionMetadata"):
        raise _no_body(_Base.PARTITIONED_METADATA, "partitionMetadata")
    m = base.partitionMetadata
    request_id = _checked_request_id(m, _Base.PARTITIONED_METADATA)
    if not m.HasField("topic"):
        raise _missing(_Base.PARTITIONED_METADATA, "topic", request_id)
    return PartitionedMetadata(_text(m.topic), request_id, m.metadata_auto_creation_enabled)


@_decodes(_Base.PARTITIONED_METADATA_RESPONSE)
def _decode_partitioned_metadata_response(base: pb.BaseCommand) -> Command:
    if not base.HasField("partitionMetadataResponse"):
        raise _no_body(_Base.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse")
    m = base.partitionMetadataResponse
    request_id = _checked_request_id(m, _Base.PARTITIONED_METADATA_RESPONSE)
    error = _server_error(m, "error", 4)
    if error is None and m.HasField("response") and m.response == _PM_FAILED:
        error = ServerError.UnknownError
    return PartitionedMetadataResponse(request_id, m.partitions, error, _opt_text(m, "message"))


@_decodes(_Base.LOOKUP)
def _decode_lookup(base: pb.BaseCommand) -> Command:
    if not base.HasField("lookupTopic"):
        raise _no_body(_Base.LOOKUP, "lookupTopic")
    m = base.lookupTopic
    request_id = _checked_request_id(m, _Base.LOOKUP)
    if not m.HasField("topic"):
        raise _missing(_Base.LOOKUP, "topic", request_id)
    return Lookup(_text(m.topic), request_id, m.authoritative)


@_decodes(_Base.LOOKUP_RESPONSE)
def _decode_lookup_response(base: pb.BaseCommand) -> Command:
    if not base.HasField("lookupTopicResponse"):
        raise _no_body(_Base.LOOKUP_RESPONSE, "lookupTopicResponse")
    m = base.lookupTopicResponse
    request_id = _checked_request_id(m, _Base.LOOKUP_RESPONSE)
    # No (or an unnamed) response value fails the lookup in the Java client; say so here too.
    response = _LOOKUP_TYPES[m.response] if m.HasField("response") else LookupType.FAILED
    return LookupResponse(
        request_id=request_id,
        response=response,
        broker_service_url=_opt_text(m, "brokerServiceUrl"),
        broker_service_url_tls=_opt_text(m, "brokerServiceUrlTls"),
        authoritative=m.authoritative,
        error=_server_error(m, "error", 6),
        message=_opt_text(m, "message"),
        proxy_through_service_url=m.proxy_through_service_url,
    )


def _decode_tc_assignment(m: pb.TcAssignment, code: int) -> TcAssignment:
    if not m.HasField("tc_id"):
        raise _missing(code, "assignments.tc_id")
    return TcAssignment(m.tc_id, _opt_text(m, "broker_service_url"), _opt_text(m, "broker_service_url_tls"))


@_decodes(_Base.WATCH_TC_ASSIGNMENTS)
def _decode_watch(base: pb.BaseCommand) -> Command:
    if not base.HasField("watchTcAssignments"):
        raise _no_body(_Base.WATCH_TC_ASSIGNMENTS, "watchTcAssignments")
    m = base.watchTcAssignments
    if not m.HasField("watch_id"):
        raise _missing(_Base.WATCH_TC_ASSIGNMENTS, "watch_id")
    return WatchTcAssignments(m.watch_id)


@_decodes(_Base.WATCH_TC_ASSIGNMENTS_UPDATE)
def _decode_watch_update(base: pb.BaseCommand) -> Command:
    code = _Base.WATCH_TC_ASSIGNMENTS_UPDATE
    if not base.HasField("watchTcAssignmentsUpdate"):
        raise _no_body(code, "watchTcAssignmentsUpdate")
    m = base.watchTcAssignmentsUpdate
    if not m.HasField("watch_id"):
        raise _missing(code, "watch_id")
    snapshot = None
    if m.HasField("snapshot"):
        s = m.snapshot
        if not s.HasField("parallelism"):
            raise _missing(code, "snapshot.parallelism")
        assignments = tuple(_decode_tc_assignment(a, code) for a in s.assignments)
        snapshot = TcAssignmentsSnapshot(s.parallelism, assignments)
    return WatchTcAssignmentsUpdate(
        m.watch_id, snapshot, _server_error(m, "error", 3), _opt_text(m, "message")
    )


@_decodes(_Base.WATCH_TC_ASSIGNMENTS_CLOSE)
def _decode_watch_close(base: pb.BaseCommand) -> Command:
    if not base.HasField("watchTcAssignmentsClose"):
        raise _no_body(_Base.WATCH_TC_ASSIGNMENTS_CLOSE, "watchTcAssignmentsClose")
    m = base.watchTcAssignmentsClose
    if not m.HasField("watch_id"):
        raise _missing(_Base.WATCH_TC_ASSIGNMENTS_CLOSE, "watch_id")
    return WatchTcAssignmentsClose(m.watch_id)


@_decodes(_Base.TC_CLIENT_CONNECT_REQUEST)
def _decode_tc_client_connect(base: pb.BaseCommand) -> Command:
    code = _Base.TC_CLIENT_CONNECT_REQUEST
    if not base.HasField("tcClientConnectRequest"):
        raise _no_body(code, "tcClientConnectRequest")
    m = base.tcClientConnectRequest
    request_id = _checked_request_id(m, code)
    if not m.HasField("tc_id"):
        raise _missing(code, "tc_id", request_id)
    return TcClientConnect(request_id, m.tc_id, m.scalable)


@_decodes(_Base.TC_CLIENT_CONNECT_RESPONSE)
def _decode_tc_client_connect_response(base: pb.BaseCommand) -> Command:
    code = _Base.TC_CLIENT_CONNECT_RESPONSE
    if not base.HasField("tcClientConnectResponse"):
        raise _no_body(code, "tcClientConnectResponse")
    m = base.tcClientConnectResponse
    request_id = _checked_request_id(m, code)
    return TcClientConnectResponse(request_id, _server_error(m, "error", 2), _opt_text(m, "message"))


@_decodes(_Base.NEW_TXN)
def _decode_new_txn(base: pb.BaseCommand) -> Command:
    if not base.HasField("newTxn"):
        raise _no_body(_Base.NEW_TXN, "newTxn")
    m = base.newTxn
    if not m.HasField("request_id"):
        raise _missing(_Base.NEW_TXN, "request_id")
    request_id = m.request_id
    if request_id >= _I64_SIGN:  # _request_id, inlined on the hottest path
        request_id -= 1 << 64
    return NewTxn(request_id, m.txn_ttl_millis, m.tc_id, m.scalable)


@_decodes(_Base.ADD_PARTITION_TO_TXN)
def _decode_add_partition(base: pb.BaseCommand) -> Command:
    if not base.HasField("addPartitionToTxn"):
        raise _no_body(_Base.ADD_PARTITION_TO_TXN, "addPartitionToTxn")
    m = base.addPartitionToTxn
    request_id = _checked_request_id(m, _Base.ADD_PARTITION_TO_TXN)
    return AddPartitionToTxn(
        request_id,
        m.txnid_most_bits,
        m.txnid_least_bits,
        tuple(map(_text, m.partitions)),
        m.scalable,
    )


@_decodes(_Base.ADD_SUBSCRIPTION_TO_TXN)
def _decode_add_subscription(base: pb.BaseCommand) -> Command:
    code = _Base.ADD_SUBSCRIPTION_TO_TXN
    if not base.HasField("addSubscriptionToTxn"):
        raise _no_body(code, "addSubscriptionToTxn")
    m = base.addSubscriptionToTxn
    request_id = _checked_request_id(m, code)
    subscriptions = []
    for s in m.subscription:
        if not (s.HasField("topic") and s.HasField("subscription")):
            raise _missing(code, "subscription.topic / subscription.subscription", request_id)
        subscriptions.append(Subscription(_text(s.topic), _text(s.subscription)))
    return AddSubscriptionToTxn(
        request_id, m.txnid_most_bits, m.txnid_least_bits, tuple(subscriptions), m.scalable
    )


@_decodes(_Base.END_TXN)
def _decode_end_txn(base: pb.BaseCommand) -> Command:
    if not base.HasField("endTxn"):
        raise _no_body(_Base.END_TXN, "endTxn")
    m = base.endTxn
    request_id = _checked_request_id(m, _Base.END_TXN)
    if not m.HasField("txn_action"):
        # Every client sets the action; the v5 TC answers an unknown one with "Unsupported"
        # (docs/pulsar-protocol.md §5). Refuse rather than guess COMMIT, the proto2 default.
        bad = _unknown_varint(m, 4)
        if bad is None:
            raise _missing(_Base.END_TXN, "txn_action", request_id)
        raise MalformedCommand(f"END_TXN (56) with unsupported txn_action {bad}", request_id)
    return EndTxn(request_id, m.txnid_most_bits, m.txnid_least_bits, _TXN_ACTIONS[m.txn_action], m.scalable)


def _end_txn_on_common(m: Any, code: int) -> tuple[int, TxnAction, int]:
    """request id, action and low watermark of END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION. The
    watermark (field 6) is required: a 4.x broker reads it unconditionally (docs/participants.md)."""
    request_id = _checked_request_id(m, code)
    if not m.HasField("txn_action"):
        raise _missing(code, "txn_action", request_id)
    if not m.HasField("txnid_least_bits_of_low_watermark"):
        raise _missing(code, "txnid_least_bits_of_low_watermark", request_id)
    # Java reads the uint64 as a signed long: 2**64-1 is -1, "no txn of this coordinator is ended".
    return request_id, _TXN_ACTIONS[m.txn_action], _request_id(m.txnid_least_bits_of_low_watermark)


@_decodes(_Base.END_TXN_ON_PARTITION)
def _decode_end_txn_on_partition(base: pb.BaseCommand) -> Command:
    code = _Base.END_TXN_ON_PARTITION
    if not base.HasField("endTxnOnPartition"):
        raise _no_body(code, "endTxnOnPartition")
    m = base.endTxnOnPartition
    request_id, action, watermark = _end_txn_on_common(m, code)
    if not m.HasField("topic"):
        raise _missing(code, "topic", request_id)
    return EndTxnOnPartition(request_id, m.txnid_most_bits, m.txnid_least_bits, _text(m.topic), action, watermark)


@_decodes(_Base.END_TXN_ON_SUBSCRIPTION)
def _decode_end_txn_on_subscription(base: pb.BaseCommand) -> Command:
    code = _Base.END_TXN_ON_SUBSCRIPTION
    if not base.HasField("endTxnOnSubscription"):
        raise _no_body(code, "endTxnOnSubscription")
    m = base.endTxnOnSubscription
    request_id, action, watermark = _end_txn_on_common(m, code)
    s = m.subscription
    if not (m.HasField("subscription") and s.HasField("topic") and s.HasField("subscription")):
        raise _missing(code, "subscription.topic / subscription.subscription", request_id)
    return EndTxnOnSubscription(request_id, m.txnid_most_bits, m.txnid_least_bits,
                                Subscription(_text(s.topic), _text(s.subscription)), action, watermark)


_R = TypeVar("_R", bound=_TxnOpResponse)


def _txn_response_decoder(cls: type[_R], code: int, field: str) -> _Decoder:
    def decode(base: pb.BaseCommand) -> Command:
        if not base.HasField(field):
            raise _no_body(code, field)
        m: Any = getattr(base, field)
        request_id = _checked_request_id(m, code)
        return cls(  # type: ignore[return-value]
            request_id,
            m.txnid_most_bits,
            m.txnid_least_bits,
            _server_error(m, "error", 4),
            _opt_text(m, "message"),
        )

    return decode


for _cls, _code, _field in (
    (NewTxnResponse, _Base.NEW_TXN_RESPONSE, "newTxnResponse"),
    (AddPartitionToTxnResponse, _Base.ADD_PARTITION_TO_TXN_RESPONSE, "addPartitionToTxnResponse"),
    (AddSubscriptionToTxnResponse, _Base.ADD_SUBSCRIPTION_TO_TXN_RESPONSE, "addSubscriptionToTxnResponse"),
    (EndTxnResponse, _Base.END_TXN_RESPONSE, "endTxnResponse"),
    (EndTxnOnPartitionResponse, _Base.END_TXN_ON_PARTITION_RESPONSE, "endTxnOnPartitionResponse"),
    (EndTxnOnSubscriptionResponse, _Base.END_TXN_ON_SUBSCRIPTION_RESPONSE, "endTxnOnSubscriptionResponse"),
):
    _DECODERS[_code] = _txn_response_decoder(_cls, _code, _field)


def _decode_unknown(base: pb.BaseCommand, code: int) -> Unknown:
    # By protocol convention a command's message sits in the BaseCommand field numbered like its
    # Type. When our .proto knows that message and it has a request_id, hand it back so the caller
    # can answer the request (e.g. END_TXN_ON_PARTITION sent to a TC).
    field = _Base.DESCRIPTOR.fields_by_number.get(code)
    if field is None or field.message_type is None or not base.HasField(field.name):
        return Unknown(code, None)
    sub = getattr(base, field.name)
    if "request_id" not in field.message_type.fields_by_name or not sub.HasField("request_id"):
        return Unknown(code, None)
    return Unknown(code, _request_id(sub.request_id))


def decode_command(cmd_bytes: bytes) -> Command:
    """Decode the BaseCommand bytes of one frame (as returned by ``FrameDecoder.next_frame``).

    A well-formed command of a type this codec does not serve, including a Type value it has no name
    for, decodes as :class:`Unknown` rather than failing, so the caller can refuse it and go on.

    Raises:
        MalformedCommand: the bytes are not a BaseCommand, ``type`` is missing, the message for the
            type is missing, a required field (``request_id``, ``topic``, …) is missing, or END_TXN's
            action is missing or not COMMIT/ABORT. ``request_id`` is set when it could be read.
    """
    try:
        base = _parse(cmd_bytes)
    except DecodeError as e:
        raise MalformedCommand(f"undecodable BaseCommand: {e}") from None
    code = base.type
    # An unset `type` reads as the enum's first value, CONNECT; only then is presence worth a call.
    if code == _Base.CONNECT and not base.HasField("type"):
        unnamed = _unknown_varint(base, 1)
        if unnamed is None:
            raise MalformedCommand("BaseCommand without required field type")
        return Unknown(unnamed, None)
    decoder = _DECODERS.get(code)
    if decoder is None:
        return _decode_unknown(base, code)
    return decoder(base)


# -- encoders -------------------------------------------------------------------------------------


def _wire_request_id(request_id: int) -> int:
    # The inverse of _request_id: a negative Java long goes out as its two's complement.
    return request_id & _U64_MASK


def _error_message(error: ServerError, message: str | None) -> str:
    # Java's generated getters throw on an unset optional field without a default, and clients read
    # `message` whenever `error` is set, so an error always travels with a message.
    return error.name if message is None else message


def _set_feature_flags(target: pb.FeatureFlags, flags: FeatureFlags) -> None:
    target.SetInParent()
    # Only the true flags go on the wire, as the broker does; absent means false.
    if flags.supports_auth_refresh:
        target.supports_auth_refresh = True
    if flags.supports_broker_entry_metadata:
        target.supports_broker_entry_metadata = True
    if flags.supports_partial_producer:
        target.supports_partial_producer = True
    if flags.supports_topic_watchers:
        target.supports_topic_watchers = True
    if flags.supports_get_partitioned_metadata_without_auto_creation:
        target.supports_get_partitioned_metadata_without_auto_creation = True
    if flags.supports_repl_dedup_by_lid_and_eid:
        target.supports_repl_dedup_by_lid_and_eid = True
    if flags.supports_topic_watcher_reconcile:
        target.supports_topic_watcher_reconcile = True
    if flags.supports_scalable_topics:
        target.supports_scalable_topics = True
    if flags.supports_tc_metadata_discovery:
        target.supports_tc_metadata_discovery = True


def _set_auth_data(target: pb.AuthData, method: str | None, data: bytes | None) -> None:
    if method is None and data is None:
        return
    target.SetInParent()
    if method is not None:
        target.auth_method_name = method
    if data is not None:
        target.auth_data = data


def _encode_connect(c: Connect) -> pb.BaseCommand:
    base = _Base(type=_Base.CONNECT)
    m = base.connect
    m.client_version = c.client_version
    m.protocol_version = c.protocol_version
    if c.auth_method_name is not None:
        m.auth_method_name = c.auth_method_name
    if c.auth_data is not None:
        m.auth_data = c.auth_data
    if c.feature_flags is not None:
        _set_feature_flags(m.feature_flags, c.feature_flags)
    if c.proxy_to_broker_url is not None:
        m.proxy_to_broker_url = c.proxy_to_broker_url
    if c.original_principal is not None:
        m.original_principal = c.original_principal
    if c.original_auth_data is not None:
        m.original_auth_data = c.original_auth_data
    if c.original_auth_method is not None:
        m.original_auth_method = c.original_auth_method
    if c.proxy_version is not None:
        m.proxy_version = c.proxy_version
    return base


def _encode_connected(c: Connected) -> pb.BaseCommand:
    base = _Base(type=_Base.CONNECTED)
    m = base.connected
    m.server_version = c.server_version
    m.protocol_version = c.protocol_version
    if c.max_message_size is not None:
        m.max_message_size = c.max_message_size
    if c.feature_flags is not None:
        _set_feature_flags(m.feature_flags, c.feature_flags)
    return base


def _encode_auth_challenge(c: AuthChallenge) -> pb.BaseCommand:
    base = _Base(type=_Base.AUTH_CHALLENGE)
    m = base.authChallenge
    m.server_version = c.server_version
    _set_auth_data(m.challenge, c.challenge_method, c.challenge_data)
    m.protocol_version = c.protocol_version
    return base


def _encode_auth_response(c: AuthResponse) -> pb.BaseCommand:
    base = _Base(type=_Base.AUTH_RESPONSE)
    m = base.authResponse
    m.client_version = c.client_version
    _set_auth_data(m.response, c.response_method, c.response_data)
    m.protocol_version = c.protocol_version
    return base


def _encode_ping(c: Ping) -> pb.BaseCommand:
    base = _Base(type=_Base.PING)
    base.ping.SetInParent()
    return base


def _encode_pong(c: Pong) -> pb.BaseCommand:
    base = _Base(type=_Base.PONG)
    base.pong.SetInParent()
    return base


def _encode_error(c: Error) -> pb.BaseCommand:
    base = _Base(type=_Base.ERROR)
    m = base.error
    m.request_id = _wire_request_id(c.request_id)
    m.error = c.error  # type: ignore[assignment]
    m.message = c.message
    return base


def _encode_partitioned_metadata(c: PartitionedMetadata) -> pb.BaseCommand:
    base = _Base(type=_Base.PARTITIONED_METADATA)
    m = base.partitionMetadata
    m.topic = c.topic
    m.request_id = _wire_request_id(c.request_id)
    if not c.metadata_auto_creation_enabled:  # the wire default is true
        m.metadata_auto_creation_enabled = False
    return base


def _encode_partitioned_metadata_response(c: PartitionedMetadataResponse) -> pb.BaseCommand:
    base = _Base(type=_Base.PARTITIONED_METADATA_RESPONSE)
    m = base.partitionMetadataResponse
    m.request_id = _wire_request_id(c.request_id)
    m.partitions = c.partitions
    if c.error is None:
        m.response = _PM_SUCCESS  # type: ignore[assignment]
        if c.message is not None:
            m.message = c.message
    else:
        m.response = _PM_FAILED  # type: ignore[assignment]
        m.error = c.error  # type: ignore[assignment]
        m.message = _error_message(c.error, c.message)
    return base


def _encode_lookup(c: Lookup) -> pb.BaseCommand:
    base = _Base(type=_Base.LOOKUP)
    m = base.lookupTopic
    m.topic = c.topic
    m.request_id = _wire_request_id(c.request_id)
    m.authoritative = c.authoritative
    return base


def _encode_lookup_response(c: LookupResponse) -> pb.BaseCommand:
    base = _Base(type=_Base.LOOKUP_RESPONSE)
    m = base.lookupTopicResponse
    if c.broker_service_url is not None:
        m.brokerServiceUrl = c.broker_service_url
    if c.broker_service_url_tls is not None:
        m.brokerServiceUrlTls = c.broker_service_url_tls
    m.response = c.response  # type: ignore[assignment]
    m.request_id = _wire_request_id(c.request_id)
    m.authoritative = c.authoritative
    if c.error is not None:
        m.error = c.error  # type: ignore[assignment]
        m.message = _error_message(c.error, c.message)
    elif c.message is not None:
        m.message = c.message
    if c.proxy_through_service_url:
        m.proxy_through_service_url = True
    return base


def _encode_watch(c: WatchTcAssignments) -> pb.BaseCommand:
    base = _Base(type=_Base.WATCH_TC_ASSIGNMENTS)
    base.watchTcAssignments.watch_id = c.watch_id
    return base


def _encode_watch_update(c: WatchTcAssignmentsUpdate) -> pb.BaseCommand:
    base = _Base(type=_Base.WATCH_TC_ASSIGNMENTS_UPDATE)
    m = base.watchTcAssignmentsUpdate
    m.watch_id = c.watch_id
    if c.snapshot is not None:
        s = m.snapshot
        s.parallelism = c.snapshot.parallelism
        for a in c.snapshot.assignments:
            target = s.assignments.add()
            target.tc_id = a.tc_id
            if a.broker_service_url is not None:
                target.broker_service_url = a.broker_service_url
            if a.broker_service_url_tls is not None:
                target.broker_service_url_tls = a.broker_service_url_tls
    if c.error is not None:
        m.error = c.error  # type: ignore[assignment]
        m.message = _error_message(c.error, c.message)
    elif c.message is not None:
        m.message = c.message
    return base


def _encode_watch_close(c: WatchTcAssignmentsClose) -> pb.BaseCommand:
    base = _Base(type=_Base.WATCH_TC_ASSIGNMENTS_CLOSE)
    base.watchTcAssignmentsClose.watch_id = c.watch_id
    return base


def _encode_tc_client_connect(c: TcClientConnect) -> pb.BaseCommand:
    base = _Base(type=_Base.TC_CLIENT_CONNECT_REQUEST)
    m = base.tcClientConnectRequest
    m.request_id = _wire_request_id(c.request_id)
    m.tc_id = c.tc_id
    if c.scalable:
        m.scalable = True
    return base


def _encode_tc_client_connect_response(c: TcClientConnectResponse) -> pb.BaseCommand:
    base = _Base(type=_Base.TC_CLIENT_CONNECT_RESPONSE)
    m = base.tcClientConnectResponse
    m.request_id = _wire_request_id(c.request_id)
    if c.error is not None:
        m.error = c.error  # type: ignore[assignment]
        m.message = _error_message(c.error, c.message)
    elif c.message is not None:
        m.message = c.message
    return base


def _encode_new_txn(c: NewTxn) -> pb.BaseCommand:
    base = _Base(type=_Base.NEW_TXN)
    m = base.newTxn
    m.request_id = _wire_request_id(c.request_id)
    m.txn_ttl_millis = c.ttl_ms
    m.tc_id = c.tc_id
    if c.scalable:
        m.scalable = True
    return base


def _encode_add_partition(c: AddPartitionToTxn) -> pb.BaseCommand:
    base = _Base(type=_Base.ADD_PARTITION_TO_TXN)
    m = base.addPartitionToTxn
    m.request_id = _wire_request_id(c.request_id)
    m.txnid_least_bits = c.least
    m.txnid_most_bits = c.most
    m.partitions.extend(c.partitions)
    if c.scalable:
        m.scalable = True
    return base


def _encode_add_subscription(c: AddSubscriptionToTxn) -> pb.BaseCommand:
    base = _Base(type=_Base.ADD_SUBSCRIPTION_TO_TXN)
    m = base.addSubscriptionToTxn
    m.request_id = _wire_request_id(c.request_id)
    m.txnid_least_bits = c.least
    m.txnid_most_bits = c.most
    for s in c.subscriptions:
        target = m.subscription.add()
        target.topic = s.topic
        target.subscription = s.subscription
    if c.scalable:
        m.scalable = True
    return base


def _encode_end_txn(c: EndTxn) -> pb.BaseCommand:
    base = _Base(type=_Base.END_TXN)
    m = base.endTxn
    m.request_id = _wire_request_id(c.request_id)
    m.txnid_least_bits = c.least
    m.txnid_most_bits = c.most
    m.txn_action = c.action  # type: ignore[assignment]
    if c.scalable:
        m.scalable = True
    return base


def _encode_end_txn_on_partition(c: EndTxnOnPartition) -> pb.BaseCommand:
    base = _Base(type=_Base.END_TXN_ON_PARTITION)
    m = base.endTxnOnPartition
    m.request_id = _wire_request_id(c.request_id)
    m.txnid_least_bits = c.least
    m.txnid_most_bits = c.most
    m.topic = c.topic
    m.txn_action = c.action  # type: ignore[assignment]
    m.txnid_least_bits_of_low_watermark = c.low_watermark & _U64_MASK
    return base


def _encode_end_txn_on_subscription(c: EndTxnOnSubscription) -> pb.BaseCommand:
    base = _Base(type=_Base.END_TXN_ON_SUBSCRIPTION)
    m = base.endTxnOnSubscription
    m.request_id = _wire_request_id(c.request_id)
    m.txnid_least_bits = c.least
    m.txnid_most_bits = c.most
    m.subscription.topic = c.subscription.topic
    m.subscription.subscription = c.subscription.subscription
    m.txn_action = c.action  # type: ignore[assignment]
    m.txnid_least_bits_of_low_watermark = c.low_watermark & _U64_MASK
    return base


def _txn_response_encoder(code: int, field: str) -> Callable[[Any], pb.BaseCommand]:
    def encode(c: _TxnOpResponse) -> pb.BaseCommand:
        base = _Base(type=code)  # type: ignore[arg-type]
        m = getattr(base, field)
        m.request_id = _wire_request_id(c.request_id)
        m.txnid_least_bits = c.least
        m.txnid_most_bits = c.most
        if c.error is not None:
            m.error = c.error
            m.message = _error_message(c.error, c.message)
        elif c.message is not None:
            m.message = c.message
        return base

    return encode


def _encode_unknown(c: Unknown) -> pb.BaseCommand:
    base = _Base()
    try:
        base.type = c.type_code  # type: ignore[assignment]
    except ValueError:
        # A Type value our enum does not name: proto2 refuses to set it, so build it by hand.
        base.MergeFromString(b"\x08" + _varint(c.type_code & _U64_MASK))
    return base


# Varints below 128 are one byte; txn-id halves and small request ids mostly are.
_SMALL_VARINTS: Final = tuple(bytes((i,)) for i in range(128))


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _u64_varint(value: int, name: str) -> bytes:
    if not 0 <= value <= _U64_MASK:
        raise ValueError(f"{name} {value} is out of range for uint64")
    return _SMALL_VARINTS[value] if value < 0x80 else _varint(value)


def _fast_txn_response_encoder(code: int) -> Callable[[Any], bytes]:
    """The four txn-op responses are most of what the server writes, so they skip the protobuf
    objects (about 2 µs each) and are serialized here directly. The bytes are exactly what protobuf
    would produce, fields in number order; tests/wire compares the two on random input.
    """
    # BaseCommand.type, then the tag of the field numbered like the type (wire type 2).
    prefix = b"\x08" + _varint(code) + _varint(code << 3 | 2)
    pack = _FRAME_HEADER.pack

    def encode(c: _TxnOpResponse) -> bytes:
        body = b"".join(
            (
                b"\x08",  # 1 request_id
                _varint(c.request_id & _U64_MASK),
                b"\x10",  # 2 txnid_least_bits
                _u64_varint(c.least, "txnid_least_bits"),
                b"\x18",  # 3 txnid_most_bits
                _u64_varint(c.most, "txnid_most_bits"),
            )
        )
        if c.error is not None:
            message = _error_message(c.error, c.message).encode()
            body += b"\x20" + _varint(c.error) + b"\x2a" + _varint(len(message)) + message  # 4, 5
        elif c.message is not None:
            message = c.message.encode()
            body += b"\x2a" + _varint(len(message)) + message  # 5 message
        command = prefix + _varint(len(body)) + body
        size = len(command)
        return pack(size + 4, size) + command

    return encode


_ENCODERS: Final[dict[type[Any], Callable[[Any], pb.BaseCommand]]] = {
    Connect: _encode_connect,
    Connected: _encode_connected,
    AuthChallenge: _encode_auth_challenge,
    AuthResponse: _encode_auth_response,
    Ping: _encode_ping,
    Pong: _encode_pong,
    Error: _encode_error,
    PartitionedMetadata: _encode_partitioned_metadata,
    PartitionedMetadataResponse: _encode_partitioned_metadata_response,
    Lookup: _encode_lookup,
    LookupResponse: _encode_lookup_response,
    WatchTcAssignments: _encode_watch,
    WatchTcAssignmentsUpdate: _encode_watch_update,
    WatchTcAssignmentsClose: _encode_watch_close,
    TcClientConnect: _encode_tc_client_connect,
    TcClientConnectResponse: _encode_tc_client_connect_response,
    NewTxn: _encode_new_txn,
    NewTxnResponse: _txn_response_encoder(_Base.NEW_TXN_RESPONSE, "newTxnResponse"),
    AddPartitionToTxn: _encode_add_partition,
    AddPartitionToTxnResponse: _txn_response_encoder(
        _Base.ADD_PARTITION_TO_TXN_RESPONSE, "addPartitionToTxnResponse"
    ),
    AddSubscriptionToTxn: _encode_add_subscription,
    AddSubscriptionToTxnResponse: _txn_response_encoder(
        _Base.ADD_SUBSCRIPTION_TO_TXN_RESPONSE, "addSubscriptionToTxnResponse"
    ),
    EndTxn: _encode_end_txn,
    EndTxnResponse: _txn_response_encoder(_Base.END_TXN_RESPONSE, "endTxnResponse"),
    EndTxnOnPartition: _encode_end_txn_on_partition,
    EndTxnOnPartitionResponse: _txn_response_encoder(_Base.END_TXN_ON_PARTITION_RESPONSE, "endTxnOnPartitionResponse"),
    EndTxnOnSubscription: _encode_end_txn_on_subscription,
    EndTxnOnSubscriptionResponse: _txn_response_encoder(
        _Base.END_TXN_ON_SUBSCRIPTION_RESPONSE, "endTxnOnSubscriptionResponse"
    ),
    Unknown: _encode_unknown,
}


_FAST_ENCODERS: Final[dict[type[Any], Callable[[Any], bytes]]] = {
    NewTxnResponse: _fast_txn_response_encoder(_Base.NEW_TXN_RESPONSE),
    AddPartitionToTxnResponse: _fast_txn_response_encoder(_Base.ADD_PARTITION_TO_TXN_RESPONSE),
    AddSubscriptionToTxnResponse: _fast_txn_response_encoder(_Base.ADD_SUBSCRIPTION_TO_TXN_RESPONSE),
    EndTxnResponse: _fast_txn_response_encoder(_Base.END_TXN_RESPONSE),
}


def _encode_with_protobuf(cmd: Command) -> bytes:
    """``encode_command`` without the hand-written fast paths: the reference they are tested against."""
    encoder = _ENCODERS.get(type(cmd))
    if encoder is None:
        raise TypeError(f"not a wire command: {cmd!r}")
    return encode_frame(encoder(cmd).SerializeToString())


# The wire Type of each command class, for names in logs and metric labels.
_TYPE_OF: Final[dict[type[Any], int]] = {
    Connect: _Base.CONNECT, Connected: _Base.CONNECTED, AuthChallenge: _Base.AUTH_CHALLENGE,
    AuthResponse: _Base.AUTH_RESPONSE, Ping: _Base.PING, Pong: _Base.PONG, Error: _Base.ERROR,
    PartitionedMetadata: _Base.PARTITIONED_METADATA,
    PartitionedMetadataResponse: _Base.PARTITIONED_METADATA_RESPONSE,
    Lookup: _Base.LOOKUP, LookupResponse: _Base.LOOKUP_RESPONSE,
    WatchTcAssignments: _Base.WATCH_TC_ASSIGNMENTS, WatchTcAssignmentsUpdate: _Base.WATCH_TC_ASSIGNMENTS_UPDATE,
    WatchTcAssignmentsClose: _Base.WATCH_TC_ASSIGNMENTS_CLOSE,
    TcClientConnect: _Base.TC_CLIENT_CONNECT_REQUEST, TcClientConnectResponse: _Base.TC_CLIENT_CONNECT_RESPONSE,
    NewTxn: _Base.NEW_TXN, NewTxnResponse: _Base.NEW_TXN_RESPONSE,
    AddPartitionToTxn: _Base.ADD_PARTITION_TO_TXN, AddPartitionToTxnResponse: _Base.ADD_PARTITION_TO_TXN_RESPONSE,
    AddSubscriptionToTxn: _Base.ADD_SUBSCRIPTION_TO_TXN,
    AddSubscriptionToTxnResponse: _Base.ADD_SUBSCRIPTION_TO_TXN_RESPONSE,
    EndTxn: _Base.END_TXN, EndTxnResponse: _Base.END_TXN_RESPONSE,
    EndTxnOnPartition: _Base.END_TXN_ON_PARTITION, EndTxnOnPartitionResponse: _Base.END_TXN_ON_PARTITION_RESPONSE,
    EndTxnOnSubscription: _Base.END_TXN_ON_SUBSCRIPTION,
    EndTxnOnSubscriptionResponse: _Base.END_TXN_ON_SUBSCRIPTION_RESPONSE,
}


def command_name(cmd: Command) -> str:
    """The wire Type name of a command (``LOOKUP``, ``GET_SCHEMA``, …); ``OTHER`` for a type value
    without a name, so that names stay a bounded set (they are metric labels)."""
    code = cmd.type_code if isinstance(cmd, Unknown) else _TYPE_OF[type(cmd)]
    try:
        return str(_Base.Type.Name(code))
    except ValueError:
        return "OTHER"


def encode_command(cmd: Command) -> bytes:
    """Encode a command as a whole frame (size prefixes included), ready to write.

    An error response whose ``message`` is None goes out with the error's name as its message,
    because Java clients read the message of every error.

    Raises:
        TypeError: ``cmd`` is not one of the command classes.
        ValueError: a field is out of range for its wire type (e.g. a negative txn id half).
    """
    fast = _FAST_ENCODERS.get(type(cmd))
    if fast is not None:
        return fast(cmd)
    return _encode_with_protobuf(cmd)
