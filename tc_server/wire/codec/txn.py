"""Transaction commands: NEW_TXN, ADD_PARTITION_TO_TXN, ADD_SUBSCRIPTION_TO_TXN, END_TXN, the
coordinator-to-broker END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION, and their responses
(docs/pulsar-protocol.md §2). The four responses a client waits for are the server's hot path: they
also get a hand-written encoder straight to frame bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.wire.codec.registry import (
    I64_SIGN,
    SMALL_VARINTS,
    U64_MASK,
    Decoder,
    checked_count,
    checked_request_id,
    error_message,
    missing,
    no_body,
    opt_text,
    register,
    server_error,
    signed_long,
    text,
    u64_varint,
    unknown_varint,
    varint,
    wire_request_id,
)
from tc_server.wire.commands import (
    AddPartitionToTxn,
    AddPartitionToTxnResponse,
    AddSubscriptionToTxn,
    AddSubscriptionToTxnResponse,
    Command,
    EndTxn,
    EndTxnOnPartition,
    EndTxnOnPartitionResponse,
    EndTxnOnSubscription,
    EndTxnOnSubscriptionResponse,
    EndTxnResponse,
    NewTxn,
    NewTxnResponse,
    Subscription,
    TxnAction,
    _TxnOpResponse,
)
from tc_server.wire.errors import MalformedCommand
from tc_server.wire.framing import _HEADER as _FRAME_HEADER

_Base = pb.BaseCommand


_TXN_ACTIONS: Final = tuple(TxnAction)


def _decode_new_txn(base: pb.BaseCommand) -> Command:
    if not base.HasField("newTxn"):
        raise no_body(_Base.NEW_TXN, "newTxn")
    m = base.newTxn
    if not m.HasField("request_id"):
        raise missing(_Base.NEW_TXN, "request_id")
    request_id = m.request_id
    if request_id >= I64_SIGN:  # signed_long, inlined on the hottest path
        request_id -= 1 << 64
    return NewTxn(request_id, m.txn_ttl_millis, m.tc_id, m.scalable)


def _decode_add_partition(base: pb.BaseCommand) -> Command:
    if not base.HasField("addPartitionToTxn"):
        raise no_body(_Base.ADD_PARTITION_TO_TXN, "addPartitionToTxn")
    m = base.addPartitionToTxn
    request_id = checked_request_id(m, _Base.ADD_PARTITION_TO_TXN)
    checked_count(m.partitions, _Base.ADD_PARTITION_TO_TXN, "partitions", request_id)
    return AddPartitionToTxn(
        request_id,
        m.txnid_most_bits,
        m.txnid_least_bits,
        tuple(map(text, m.partitions)),
        m.scalable,
    )


def _decode_add_subscription(base: pb.BaseCommand) -> Command:
    code = _Base.ADD_SUBSCRIPTION_TO_TXN
    if not base.HasField("addSubscriptionToTxn"):
        raise no_body(code, "addSubscriptionToTxn")
    m = base.addSubscriptionToTxn
    request_id = checked_request_id(m, code)
    checked_count(m.subscription, code, "subscriptions", request_id)
    subscriptions = []
    for s in m.subscription:
        if not (s.HasField("topic") and s.HasField("subscription")):
            raise missing(code, "subscription.topic / subscription.subscription", request_id)
        subscriptions.append(Subscription(text(s.topic), text(s.subscription)))
    return AddSubscriptionToTxn(
        request_id, m.txnid_most_bits, m.txnid_least_bits, tuple(subscriptions), m.scalable
    )


def _decode_end_txn(base: pb.BaseCommand) -> Command:
    if not base.HasField("endTxn"):
        raise no_body(_Base.END_TXN, "endTxn")
    m = base.endTxn
    if not m.HasField("request_id"):
        raise missing(_Base.END_TXN, "request_id")
    request_id = m.request_id
    if request_id >= I64_SIGN:  # checked_request_id and signed_long, inlined as for NEW_TXN
        request_id -= 1 << 64
    if not m.HasField("txn_action"):
        # Every client sets the action; the v5 TC answers an unknown one with "Unsupported"
        # (docs/pulsar-protocol.md §5). Refuse rather than guess COMMIT, the proto2 default.
        bad = unknown_varint(m, 4)
        if bad is None:
            raise missing(_Base.END_TXN, "txn_action", request_id)
        raise MalformedCommand(f"END_TXN (56) with unsupported txn_action {bad}", request_id)
    return EndTxn(request_id, m.txnid_most_bits, m.txnid_least_bits, _TXN_ACTIONS[m.txn_action], m.scalable)


def _end_txn_on_common(m: Any, code: int) -> tuple[int, TxnAction, int]:
    """request id, action and low watermark of END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION. The
    watermark (field 6) is required: a 4.x broker reads it unconditionally (docs/participants.md)."""
    request_id = checked_request_id(m, code)
    if not m.HasField("txn_action"):
        raise missing(code, "txn_action", request_id)
    if not m.HasField("txnid_least_bits_of_low_watermark"):
        raise missing(code, "txnid_least_bits_of_low_watermark", request_id)
    # Java reads the uint64 as a signed long: 2**64-1 is -1, "no txn of this coordinator is ended".
    return request_id, _TXN_ACTIONS[m.txn_action], signed_long(m.txnid_least_bits_of_low_watermark)


def _decode_end_txn_on_partition(base: pb.BaseCommand) -> Command:
    code = _Base.END_TXN_ON_PARTITION
    if not base.HasField("endTxnOnPartition"):
        raise no_body(code, "endTxnOnPartition")
    m = base.endTxnOnPartition
    request_id, action, watermark = _end_txn_on_common(m, code)
    if not m.HasField("topic"):
        raise missing(code, "topic", request_id)
    return EndTxnOnPartition(request_id, m.txnid_most_bits, m.txnid_least_bits, text(m.topic), action, watermark)


def _decode_end_txn_on_subscription(base: pb.BaseCommand) -> Command:
    code = _Base.END_TXN_ON_SUBSCRIPTION
    if not base.HasField("endTxnOnSubscription"):
        raise no_body(code, "endTxnOnSubscription")
    m = base.endTxnOnSubscription
    request_id, action, watermark = _end_txn_on_common(m, code)
    s = m.subscription
    if not (m.HasField("subscription") and s.HasField("topic") and s.HasField("subscription")):
        raise missing(code, "subscription.topic / subscription.subscription", request_id)
    return EndTxnOnSubscription(request_id, m.txnid_most_bits, m.txnid_least_bits,
                                Subscription(text(s.topic), text(s.subscription)), action, watermark)


_R = TypeVar("_R", bound=_TxnOpResponse)


def _txn_response_decoder(cls: type[_R], code: int, field: str) -> Decoder:
    def decode(base: pb.BaseCommand) -> Command:
        if not base.HasField(field):
            raise no_body(code, field)
        m: Any = getattr(base, field)
        request_id = checked_request_id(m, code)
        return cls(  # type: ignore[return-value]
            request_id,
            m.txnid_most_bits,
            m.txnid_least_bits,
            server_error(m, "error", 4),
            opt_text(m, "message"),
        )

    return decode


def _encode_new_txn(c: NewTxn) -> pb.BaseCommand:
    base = _Base(type=_Base.NEW_TXN)
    m = base.newTxn
    m.request_id = wire_request_id(c.request_id)
    m.txn_ttl_millis = c.ttl_ms
    m.tc_id = c.tc_id
    if c.scalable:
        m.scalable = True
    return base


def _encode_add_partition(c: AddPartitionToTxn) -> pb.BaseCommand:
    base = _Base(type=_Base.ADD_PARTITION_TO_TXN)
    m = base.addPartitionToTxn
    m.request_id = wire_request_id(c.request_id)
    m.txnid_least_bits = c.least
    m.txnid_most_bits = c.most
    m.partitions.extend(c.partitions)
    if c.scalable:
        m.scalable = True
    return base


def _encode_add_subscription(c: AddSubscriptionToTxn) -> pb.BaseCommand:
    base = _Base(type=_Base.ADD_SUBSCRIPTION_TO_TXN)
    m = base.addSubscriptionToTxn
    m.request_id = wire_request_id(c.request_id)
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
    m.request_id = wire_request_id(c.request_id)
    m.txnid_least_bits = c.least
    m.txnid_most_bits = c.most
    m.txn_action = c.action  # type: ignore[assignment]
    if c.scalable:
        m.scalable = True
    return base


def _encode_end_txn_on_partition(c: EndTxnOnPartition) -> pb.BaseCommand:
    base = _Base(type=_Base.END_TXN_ON_PARTITION)
    m = base.endTxnOnPartition
    m.request_id = wire_request_id(c.request_id)
    m.txnid_least_bits = c.least
    m.txnid_most_bits = c.most
    m.topic = c.topic
    m.txn_action = c.action  # type: ignore[assignment]
    m.txnid_least_bits_of_low_watermark = c.low_watermark & U64_MASK
    return base


def _encode_end_txn_on_subscription(c: EndTxnOnSubscription) -> pb.BaseCommand:
    base = _Base(type=_Base.END_TXN_ON_SUBSCRIPTION)
    m = base.endTxnOnSubscription
    m.request_id = wire_request_id(c.request_id)
    m.txnid_least_bits = c.least
    m.txnid_most_bits = c.most
    m.subscription.topic = c.subscription.topic
    m.subscription.subscription = c.subscription.subscription
    m.txn_action = c.action  # type: ignore[assignment]
    m.txnid_least_bits_of_low_watermark = c.low_watermark & U64_MASK
    return base


def _txn_response_encoder(code: int, field: str) -> Callable[[Any], pb.BaseCommand]:
    def encode(c: _TxnOpResponse) -> pb.BaseCommand:
        base = _Base(type=code)  # type: ignore[arg-type]
        m = getattr(base, field)
        m.request_id = wire_request_id(c.request_id)
        m.txnid_least_bits = c.least
        m.txnid_most_bits = c.most
        if c.error is not None:
            m.error = c.error
            m.message = error_message(c.error, c.message)
        elif c.message is not None:
            m.message = c.message
        return base

    return encode


def _fast_txn_response_encoder(code: int) -> Callable[[Any], bytes]:
    """The four txn-op responses are most of what the server writes, so they skip the protobuf
    objects (about 2 µs each) and are serialized here directly. The bytes are exactly what protobuf
    would produce, fields in number order; tests/wire compares the two on random input.
    """
    # BaseCommand.type, then the tag of the field numbered like the type (wire type 2).
    prefix = b"\x08" + varint(code) + varint(code << 3 | 2)
    pack = _FRAME_HEADER.pack

    def encode(c: _TxnOpResponse) -> bytes:
        # The varints inline where they are small or in range (one call each less: 4 per pair, issue 13);
        # an id out of range goes to u64_varint, which refuses it naming the field.
        request_id = c.request_id & U64_MASK
        least = c.least
        most = c.most
        body = b"".join((
            b"\x08",  # 1 request_id
            SMALL_VARINTS[request_id] if request_id < 0x80 else varint(request_id),
            b"\x10",  # 2 txnid_least_bits
            varint(least) if 0 <= least <= U64_MASK else u64_varint(least, "txnid_least_bits"),
            b"\x18",  # 3 txnid_most_bits
            SMALL_VARINTS[most] if 0 <= most < 0x80 else u64_varint(most, "txnid_most_bits"),
        ))
        if c.error is not None:
            message = error_message(c.error, c.message).encode()
            body += b"\x20" + varint(c.error) + b"\x2a" + varint(len(message)) + message  # 4, 5
        elif c.message is not None:
            message = c.message.encode()
            body += b"\x2a" + varint(len(message)) + message  # 5 message
        size = len(body)
        command = prefix + (SMALL_VARINTS[size] if size < 0x80 else varint(size)) + body
        size = len(command)
        return pack(size + 4, size) + command

    return encode


register(NewTxn, _Base.NEW_TXN, decode=_decode_new_txn, encode=_encode_new_txn)
register(AddPartitionToTxn, _Base.ADD_PARTITION_TO_TXN, decode=_decode_add_partition, encode=_encode_add_partition)
register(AddSubscriptionToTxn, _Base.ADD_SUBSCRIPTION_TO_TXN,
         decode=_decode_add_subscription, encode=_encode_add_subscription)
register(EndTxn, _Base.END_TXN, decode=_decode_end_txn, encode=_encode_end_txn)
register(EndTxnOnPartition, _Base.END_TXN_ON_PARTITION,
         decode=_decode_end_txn_on_partition, encode=_encode_end_txn_on_partition)
register(EndTxnOnSubscription, _Base.END_TXN_ON_SUBSCRIPTION,
         decode=_decode_end_txn_on_subscription, encode=_encode_end_txn_on_subscription)

# The responses share one shape (request_id, txnid_least_bits, txnid_most_bits, error, message).
_RESPONSES: Final[tuple[tuple[type[_TxnOpResponse], int, str, bool], ...]] = (
    # class, wire Type, BaseCommand field, hand-written encoder (a client waits for it)
    (NewTxnResponse, _Base.NEW_TXN_RESPONSE, "newTxnResponse", True),
    (AddPartitionToTxnResponse, _Base.ADD_PARTITION_TO_TXN_RESPONSE, "addPartitionToTxnResponse", True),
    (AddSubscriptionToTxnResponse, _Base.ADD_SUBSCRIPTION_TO_TXN_RESPONSE, "addSubscriptionToTxnResponse", True),
    (EndTxnResponse, _Base.END_TXN_RESPONSE, "endTxnResponse", True),
    (EndTxnOnPartitionResponse, _Base.END_TXN_ON_PARTITION_RESPONSE, "endTxnOnPartitionResponse", False),
    (EndTxnOnSubscriptionResponse, _Base.END_TXN_ON_SUBSCRIPTION_RESPONSE, "endTxnOnSubscriptionResponse", False),
)
for _cls, _code, _field, _fast in _RESPONSES:
    register(_cls, _code, decode=_txn_response_decoder(_cls, _code, _field),
             encode=_txn_response_encoder(_code, _field),
             fast_encode=_fast_txn_response_encoder(_code) if _fast else None)
