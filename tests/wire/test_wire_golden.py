"""Golden bytes, assembled by hand from the protobuf wire-format rules, not by calling the encoder.

Rules used: a field's tag is the varint ``(field_number << 3) | wire_type``; wire type 0 is a varint
(7 bits per byte, low group first, high bit = "more follows"), wire type 2 is a varint length and
then the bytes. A frame is ``[totalSize:u32 BE][cmdSize:u32 BE][BaseCommand]``, totalSize = 4 + cmdSize.
BaseCommand's field 1 is ``type``; each command's message sits in the field numbered like its Type.
"""

from tc_server.wire import (
    Connected,
    EndTxn,
    Error,
    FeatureFlags,
    FrameDecoder,
    NewTxn,
    NewTxnResponse,
    Ping,
    Pong,
    ServerError,
    TxnAction,
    decode_command,
    encode_command,
)

PING_FRAME = bytes.fromhex(
    "00000009"  # totalSize = 4 + 5
    "00000005"  # cmdSize
    "08 12"  # field 1 (type), varint: PING = 18
    "92 01 00"  # field 18 (ping), length-delimited: tag 18<<3|2 = 146 = 0x92 0x01; empty message
)

PONG_FRAME = bytes.fromhex("00000009 00000005 08 13 9a 01 00")  # PONG = 19, tag 19<<3|2 = 154

CONNECTED_FRAME = bytes.fromhex(
    "0000001e"  # totalSize = 4 + 26
    "0000001a"  # cmdSize = 26
    "08 03"  # type = CONNECTED (3)
    "1a 16"  # field 3 (connected), tag 3<<3|2 = 0x1a, 22 bytes follow
    "0a 09 74632d736572766572"  # server_version = "tc-server" (field 1, 9 bytes)
    "10 15"  # protocol_version = 21 (field 2, varint)
    "18 80 80 c0 02"  # max_message_size = 5242880 = 0x500000 -> 7-bit groups 0,0,0x40,2 (field 3)
    "22 02"  # feature_flags (field 4), 2 bytes
    "48 01"  # supports_tc_metadata_discovery = true (field 9, tag 9<<3|0 = 72 = 0x48)
)

NEW_TXN_RESPONSE_ERROR_FRAME = bytes.fromhex(
    "00000020"  # totalSize = 4 + 28
    "0000001c"  # cmdSize = 28
    "08 33"  # type = NEW_TXN_RESPONSE (51)
    "9a 03 17"  # field 51: tag 51<<3|2 = 410 = 0x9a 0x03; 23 bytes follow
    "08 07"  # request_id = 7
    "10 00"  # txnid_least_bits = 0 (always sent)
    "18 03"  # txnid_most_bits = 3: the tcId, on errors too
    "20 18"  # error = TransactionNotFound (24)
    "2a 0d 74786e206e6f7420666f756e64"  # message = "txn not found" (13 bytes)
)

NEW_TXN_CMD = bytes.fromhex(
    "08 32"  # type = NEW_TXN (50)
    "92 03 08"  # field 50: tag 50<<3|2 = 402 = 0x92 0x03; 8 bytes follow
    "08 2a"  # request_id = 42
    "10 e0 d4 03"  # txn_ttl_millis = 60000 = 0b11_1010100_1100000 -> 0xe0 0xd4 0x03
    "18 05"  # tc_id = 5
)

END_TXN_ABORT_CMD = bytes.fromhex(
    "08 38"  # type = END_TXN (56)
    "c2 03 08"  # field 56: tag 56<<3|2 = 450 = 0xc2 0x03; 8 bytes
    "08 09"  # request_id = 9
    "10 04"  # txnid_least_bits = 4
    "18 02"  # txnid_most_bits = 2
    "20 01"  # txn_action = ABORT (1)
)

AUTH_ERROR_FRAME = bytes.fromhex(
    "00000019 00000015"  # totalSize 25, cmdSize 21
    "08 0e"  # type = ERROR (14)
    "72 11"  # field 14: tag 14<<3|2 = 114 = 0x72; 17 bytes
    "08 ffffffffffffffffff 01"  # request_id = -1 as uint64 (2^64-1): nine 0xff groups and a 0x01
    "10 03"  # error = AuthenticationError (3)
    "1a 02 6e6f"  # message = "no"
)


def test_ping_frame() -> None:
    assert encode_command(Ping()) == PING_FRAME
    assert decode_command(PING_FRAME[8:]) == Ping()


def test_pong_frame() -> None:
    assert encode_command(Pong()) == PONG_FRAME
    assert decode_command(PONG_FRAME[8:]) == Pong()


def test_connected() -> None:
    cmd = Connected("tc-server", 21, 5242880, FeatureFlags(supports_tc_metadata_discovery=True))
    assert encode_command(cmd) == CONNECTED_FRAME
    assert decode_command(CONNECTED_FRAME[8:]) == cmd


def test_new_txn_response_with_error() -> None:
    cmd = NewTxnResponse(7, most=3, error=ServerError.TransactionNotFound, message="txn not found")
    assert encode_command(cmd) == NEW_TXN_RESPONSE_ERROR_FRAME
    assert decode_command(NEW_TXN_RESPONSE_ERROR_FRAME[8:]) == cmd


def test_new_txn_request() -> None:
    assert decode_command(NEW_TXN_CMD) == NewTxn(request_id=42, ttl_ms=60000, tc_id=5)
    assert encode_command(NewTxn(42, 60000, 5))[8:] == NEW_TXN_CMD


def test_end_txn_request() -> None:
    assert decode_command(END_TXN_ABORT_CMD) == EndTxn(9, most=2, least=4, action=TxnAction.ABORT)
    assert encode_command(EndTxn(9, 2, 4, TxnAction.ABORT))[8:] == END_TXN_ABORT_CMD


def test_auth_error_uses_java_minus_one() -> None:
    cmd = Error(-1, ServerError.AuthenticationError, "no")
    assert encode_command(cmd) == AUTH_ERROR_FRAME
    assert decode_command(AUTH_ERROR_FRAME[8:]) == cmd


def test_golden_frames_through_decoder() -> None:
    decoder = FrameDecoder(1024)
    decoder.feed(PING_FRAME + CONNECTED_FRAME + NEW_TXN_RESPONSE_ERROR_FRAME)
    assert decoder.next_frame() == PING_FRAME[8:]
    assert decoder.next_frame() == CONNECTED_FRAME[8:]
    assert decoder.next_frame() == NEW_TXN_RESPONSE_ERROR_FRAME[8:]
    assert decoder.next_frame() is None
