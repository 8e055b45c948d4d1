"""Every command survives encode → frame decoder → decode unchanged, with defaults and with every
field set; plus the decode rules that are not plain round trips."""

from typing import cast

import pytest

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.wire import (
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
    FrameDecoder,
    Lookup,
    LookupResponse,
    LookupType,
    NewTxn,
    NewTxnResponse,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    Ping,
    Pong,
    ServerError,
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
    decode_command,
    encode_command,
)
from tc_server.wire.commands import _TxnOpResponse

ALL_FLAGS = FeatureFlags(*([True] * 9))
U64_MAX = (1 << 64) - 1

CASES: list[Command] = [
    Connect("Pulsar-CPP-v4.2.0"),
    Connect(
        "Pulsar-Java-v4.0.0",
        protocol_version=21,
        auth_method_name="token",
        auth_data=b"\x00secret\xff",
        feature_flags=FeatureFlags(supports_auth_refresh=True, supports_partial_producer=True),
        proxy_to_broker_url="pulsar://broker:6650",
        original_principal="alice",
        original_auth_data="data",
        original_auth_method="token",
        proxy_version="Pulsar-Proxy-v4",
    ),
    Connected("tc-server", 20),
    Connected("tc-server", 21, max_message_size=5242880, feature_flags=ALL_FLAGS),
    Connected("tc-server", 21, feature_flags=FeatureFlags()),
    AuthChallenge("tc-server", "token", b"PulsarAuthRefresh", 21),
    AuthChallenge("tc-server", None, None, 21),
    AuthChallenge("tc-server", None, b"only-data", 14),
    AuthResponse("Pulsar-Java-v4.0.0", "token", b"jwt", 21),
    AuthResponse("Pulsar-Java-v4.0.0", "token", None, 21),
    Ping(),
    Pong(),
    Error(3, ServerError.NotAllowedError, "not served by a transaction coordinator"),
    Error(-1, ServerError.AuthenticationError, ""),
    PartitionedMetadata("persistent://pulsar/system/transaction_coordinator_assign", 1),
    PartitionedMetadata("persistent://t/n/x", 2, metadata_auto_creation_enabled=False),
    PartitionedMetadataResponse(1, partitions=16),
    PartitionedMetadataResponse(1),
    PartitionedMetadataResponse(2, error=ServerError.ServiceNotReady, message="not yet"),
    Lookup("persistent://pulsar/system/transaction_coordinator_assign-partition-3", 4),
    Lookup("persistent://t/n/x", 5, authoritative=True),
    Lookup("persistent://t/n/x", 6, advertised_listener_name="external", properties=(("region", "eu"), ("a", ""))),
    LookupResponse(4, LookupType.CONNECT, "pulsar://tc:6650"),
    LookupResponse(
        4,
        LookupType.REDIRECT,
        "pulsar://b:6650",
        "pulsar+ssl://b:6651",
        authoritative=True,
        proxy_through_service_url=True,
    ),
    LookupResponse(6, LookupType.FAILED, error=ServerError.TopicNotFound, message="no such topic"),
    WatchTcAssignments(1),
    WatchTcAssignmentsUpdate(1),
    WatchTcAssignmentsUpdate(
        2,
        TcAssignmentsSnapshot(
            16,
            (
                TcAssignment(0, "pulsar://a:6650"),
                TcAssignment(3, None, "pulsar+ssl://b:6651"),
                TcAssignment(7),
            ),
        ),
    ),
    WatchTcAssignmentsUpdate(3, TcAssignmentsSnapshot(4)),
    WatchTcAssignmentsUpdate(4, error=ServerError.NotAllowedError, message="disabled"),
    WatchTcAssignmentsClose(5),
    TcClientConnect(7, 0),
    TcClientConnect(8, 15, scalable=True),
    TcClientConnectResponse(7),
    TcClientConnectResponse(8, ServerError.TransactionCoordinatorNotFound, "not the leader of 15"),
    NewTxn(9),
    NewTxn(10, ttl_ms=60000, tc_id=3, scalable=True),
    NewTxn(U64_MAX >> 1, ttl_ms=U64_MAX, tc_id=U64_MAX),
    AddPartitionToTxn(11, 3, 0),
    AddPartitionToTxn(12, 3, 1 << 40, ("persistent://t/n/a", "persistent://t/n/b-partition-0"), True),
    AddSubscriptionToTxn(13, 3, 4),
    AddSubscriptionToTxn(14, 3, 5, (Subscription("persistent://t/n/a", "sub"), Subscription("x", "ü")), True),
    EndTxn(15, 3, 6, TxnAction.COMMIT),
    EndTxn(16, 3, 7, TxnAction.ABORT, scalable=True),
    EndTxnOnPartition(17, 3, 8, "persistent://t/n/a-partition-0", TxnAction.COMMIT, 7),
    EndTxnOnPartition(18, 3, 0, "persistent://t/n/a", TxnAction.ABORT, -1),  # Java's -1: 2**64-1 on the wire
    EndTxnOnSubscription(19, 3, 9, Subscription("persistent://t/n/a", "sub"), TxnAction.ABORT, 8),
    Unknown(6),  # SEND
    Unknown(4242),  # a Type value no version of this codec names
]
for cls in (NewTxnResponse, AddPartitionToTxnResponse, AddSubscriptionToTxnResponse, EndTxnResponse,
            EndTxnOnPartitionResponse, EndTxnOnSubscriptionResponse):
    CASES += [
        cls(20, 3, 9),
        cls(21, U64_MAX, U64_MAX),
        cls(22, 3, error=ServerError.InvalidTxnStatus, message="txn is COMMITTED"),
        cls(23, 3, 9, ServerError.TransactionConflict, ""),
    ]


@pytest.mark.parametrize("cmd", CASES, ids=lambda c: type(c).__name__)
def test_round_trip(cmd: Command) -> None:
    frame = encode_command(cmd)
    decoder = FrameDecoder(len(frame))
    decoder.feed(frame)
    body = decoder.next_frame()
    assert body is not None and decoder.buffered == 0
    assert decode_command(body) == cmd


def test_every_command_class_is_covered() -> None:
    import tc_server.wire.commands as commands

    served = {t for t in commands.Command.__args__}
    assert served == {type(c) for c in CASES}


def test_response_classes_are_distinct() -> None:
    # They share a shape but must not compare equal, or a test could confuse an END_TXN answer with
    # a NEW_TXN answer.
    assert NewTxnResponse(1, 2) != cast(object, EndTxnResponse(1, 2))
    assert all(issubclass(c, _TxnOpResponse) for c in (NewTxnResponse, EndTxnResponse))


@pytest.mark.parametrize(
    "cmd",
    [
        NewTxnResponse(1, 3, error=ServerError.TransactionNotFound),
        PartitionedMetadataResponse(1, error=ServerError.ServiceNotReady),
        LookupResponse(1, LookupType.FAILED, error=ServerError.ServiceNotReady),
        TcClientConnectResponse(1, ServerError.NotAllowedError),
    ],
    ids=lambda c: type(c).__name__,
)
def test_error_without_message_gets_its_name(cmd: Command) -> None:
    # Java's getters throw on an unset message, and clients read it with every error.
    decoded = decode_command(encode_command(cmd)[8:])
    assert decoded.message == decoded.error.name  # type: ignore[union-attr]


def test_partitioned_metadata_response_flag_follows_error() -> None:
    ok = pb.BaseCommand.FromString(encode_command(PartitionedMetadataResponse(1, 16))[8:])
    failed = pb.BaseCommand.FromString(
        encode_command(PartitionedMetadataResponse(1, error=ServerError.MetadataError))[8:]
    )
    assert ok.partitionMetadataResponse.HasField("response")
    assert ok.partitionMetadataResponse.response == 0  # Success
    assert failed.partitionMetadataResponse.response == 1  # Failed


def _raw(**fields: object) -> bytes:
    return pb.BaseCommand(**fields).SerializeToString()  # type: ignore[arg-type]


def test_failed_partitioned_metadata_without_error_code_is_unknown_error() -> None:
    raw = _raw(
        type=pb.BaseCommand.PARTITIONED_METADATA_RESPONSE,
        partitionMetadataResponse=pb.CommandPartitionedTopicMetadataResponse(
            request_id=1, response=pb.CommandPartitionedTopicMetadataResponse.Failed
        ),
    )
    assert decode_command(raw) == PartitionedMetadataResponse(1, error=ServerError.UnknownError)


def test_lookup_response_without_response_field_is_failed() -> None:
    raw = _raw(
        type=pb.BaseCommand.LOOKUP_RESPONSE,
        lookupTopicResponse=pb.CommandLookupTopicResponse(request_id=1, brokerServiceUrl="pulsar://x:1"),
    )
    assert decode_command(raw) == LookupResponse(1, LookupType.FAILED, "pulsar://x:1")


def test_error_code_newer_than_codec_decodes_as_unknown_error() -> None:
    # NEW_TXN_RESPONSE{request_id=1, txnid_most_bits=3, error=99}: proto2 keeps 99 as an unknown
    # field, and an error must never read as success.
    raw = bytes.fromhex("0833 9a03 06 0801 1803 2063")
    assert decode_command(raw) == NewTxnResponse(1, 3, error=ServerError.UnknownError)


def test_invalid_utf8_is_replaced_not_rejected() -> None:
    # LOOKUP{topic=b"a\xffb", request_id=2}: Java decodes strings leniently, so do we.
    raw = bytes.fromhex("0817 ba01 07 0a03 61ff62 1002")
    assert decode_command(raw) == Lookup("a\ufffdb", 2)


def test_unserved_command_recovers_request_id() -> None:
    # GET_SCHEMA (34) is a broker's command, not a TC's: Unknown, but answerable (or forwarded).
    raw = _raw(
        type=pb.BaseCommand.GET_SCHEMA,
        getSchema=pb.CommandGetSchema(request_id=77),
    )
    assert decode_command(raw) == Unknown(34, 77)


def test_unserved_command_without_known_layout() -> None:
    # SUBSCRIBE (4) with some body: its layout is not ours to know, so no request id.
    assert decode_command(bytes.fromhex("0804 2203 0801 02")) == Unknown(4, None)


def test_type_value_outside_enum_is_unknown() -> None:
    assert decode_command(bytes.fromhex("08 e4 00")) == Unknown(100, None)


def test_ping_without_body_is_still_ping() -> None:
    assert decode_command(bytes.fromhex("0812")) == Ping()


def test_encode_rejects_non_commands() -> None:
    with pytest.raises(TypeError):
        encode_command("PING")  # type: ignore[arg-type]
