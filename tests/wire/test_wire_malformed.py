"""decode_command refuses bad commands with MalformedCommand, naming the problem and keeping the
request id whenever the bytes still hold it."""

import pytest

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.wire import MalformedCommand, WireError, decode_command


def _raw(**fields: object) -> bytes:
    return pb.BaseCommand(**fields).SerializeToString()  # type: ignore[arg-type]


T = pb.BaseCommand


@pytest.mark.parametrize(
    ("raw", "reason", "request_id"),
    [
        (b"\xff\xff\xff", "undecodable", None),
        (b"\x0a\x05ab", "undecodable", None),  # length-delimited field running past the end
        (b"\x08", "undecodable", None),  # truncated varint
        (b"", "type", None),
        (_raw(connect=pb.CommandConnect(client_version="x")), "type", None),
        (_raw(type=T.NEW_TXN), "newTxn", None),
        (_raw(type=T.NEW_TXN, newTxn=pb.CommandNewTxn(tc_id=1)), "request_id", None),
        (_raw(type=T.CONNECT, connect=pb.CommandConnect()), "client_version", None),
        (_raw(type=T.CONNECTED, connected=pb.CommandConnected()), "server_version", None),
        (_raw(type=T.END_TXN, endTxn=pb.CommandEndTxn(txn_action=pb.ABORT)), "request_id", None),
        (_raw(type=T.END_TXN, endTxn=pb.CommandEndTxn(request_id=4)), "txn_action", 4),
        (_raw(type=T.LOOKUP, lookupTopic=pb.CommandLookupTopic(request_id=5)), "topic", 5),
        (
            _raw(
                type=T.PARTITIONED_METADATA,
                partitionMetadata=pb.CommandPartitionedTopicMetadata(request_id=6),
            ),
            "topic",
            6,
        ),
        (
            _raw(
                type=T.TC_CLIENT_CONNECT_REQUEST,
                tcClientConnectRequest=pb.CommandTcClientConnectRequest(request_id=7),
            ),
            "tc_id",
            7,
        ),
        (
            _raw(
                type=T.ADD_SUBSCRIPTION_TO_TXN,
                addSubscriptionToTxn=pb.CommandAddSubscriptionToTxn(
                    request_id=8, subscription=[pb.Subscription(topic="t")]
                ),
            ),
            "subscription",
            8,
        ),
        (_raw(type=T.ERROR, error=pb.CommandError(request_id=9, message="m")), "error", 9),
        (_raw(type=T.NEW_TXN_RESPONSE, newTxnResponse=pb.CommandNewTxnResponse()), "request_id", None),
        (
            _raw(type=T.WATCH_TC_ASSIGNMENTS, watchTcAssignments=pb.CommandWatchTcAssignments()),
            "watch_id",
            None,
        ),
    ],
)
def test_malformed(raw: bytes, reason: str, request_id: int | None) -> None:
    with pytest.raises(MalformedCommand) as info:
        decode_command(raw)
    assert reason in info.value.reason
    assert info.value.request_id == request_id
    assert isinstance(info.value, WireError)


@pytest.mark.parametrize("action", [2, 7, 300])
def test_end_txn_bad_action_recovers_request_id(action: int) -> None:
    # END_TXN{request_id=5, txnid_most_bits=1, txn_action=<action>}, written by hand because the
    # generated class refuses out-of-range enum values.
    varint = bytearray()
    v = action
    while v >= 0x80:
        varint.append(v & 0x7F | 0x80)
        v >>= 7
    varint.append(v)
    body = b"\x08\x05\x18\x01\x20" + bytes(varint)
    raw = b"\x08\x38\xc2\x03" + bytes([len(body)]) + body
    with pytest.raises(MalformedCommand) as info:
        decode_command(raw)
    assert info.value.request_id == 5
    assert str(action) in info.value.reason


def test_request_id_of_minus_one_is_recovered_signed() -> None:
    raw = _raw(type=T.LOOKUP, lookupTopic=pb.CommandLookupTopic(request_id=(1 << 64) - 1))
    with pytest.raises(MalformedCommand) as info:
        decode_command(raw)
    assert info.value.request_id == -1
