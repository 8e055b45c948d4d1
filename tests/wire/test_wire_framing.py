"""FrameDecoder: any chunking, size checks as early as possible, payload frames, encode_frame."""

import struct

import pytest

from tc_server.wire import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    MESSAGE_SIZE_FRAME_PADDING,
    FrameDecoder,
    FrameError,
    encode_frame,
)


def frame(cmd: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(cmd) + len(payload), len(cmd)) + cmd + payload


CMDS = [b"\x08\x12\x92\x01\x00", b"\x08\x13", bytes(range(200)), b"x"]
# A SEND-like payload command: magic 0x0e01, a checksum, metadata size and metadata, then payload.
PAYLOAD = b"\x0e\x01" + b"\xde\xad\xbe\xef" + b"\x00\x00\x00\x02" + b"md" + b"payload bytes"
STREAM = frame(CMDS[0]) + frame(CMDS[1], PAYLOAD) + frame(CMDS[2]) + frame(CMDS[3])
EXPECTED = [CMDS[0], CMDS[1], CMDS[2], CMDS[3]]


def drain(decoder: FrameDecoder) -> list[bytes]:
    out = []
    while (body := decoder.next_frame()) is not None:
        out.append(body)
    return out


def test_constants_match_pulsar() -> None:
    assert DEFAULT_MAX_MESSAGE_SIZE == 5242880
    assert MESSAGE_SIZE_FRAME_PADDING == 10240
    assert DEFAULT_MAX_FRAME_SIZE == 5253120


def test_encode_frame() -> None:
    assert encode_frame(b"\x08\x13") == b"\x00\x00\x00\x06\x00\x00\x00\x02\x08\x13"


def test_many_frames_in_one_feed() -> None:
    decoder = FrameDecoder(1024)
    decoder.feed(STREAM)
    assert drain(decoder) == EXPECTED
    assert decoder.buffered == 0


@pytest.mark.parametrize("split", range(len(STREAM) + 1))
def test_split_at_every_byte(split: int) -> None:
    decoder = FrameDecoder(1024)
    decoder.feed(STREAM[:split])
    got = drain(decoder)
    decoder.feed(STREAM[split:])
    got += drain(decoder)
    assert got == EXPECTED


def test_one_byte_at_a_time() -> None:
    decoder = FrameDecoder(1024)
    got = []
    for i in range(len(STREAM)):
        decoder.feed(STREAM[i : i + 1])
        got += drain(decoder)
    assert got == EXPECTED and decoder.buffered == 0


def test_payload_is_dropped() -> None:
    decoder = FrameDecoder(1024)
    decoder.feed(frame(b"\x08\x06", PAYLOAD) + frame(b"\x08\x12"))
    assert decoder.next_frame() == b"\x08\x06"
    assert decoder.next_frame() == b"\x08\x12"


def test_oversize_rejected_from_the_header_alone() -> None:
    decoder = FrameDecoder(100)
    decoder.feed(struct.pack(">I", 97))  # no cmdSize, no body: the size alone is enough
    with pytest.raises(FrameError, match="101"):
        decoder.next_frame()


def test_limit_counts_the_size_field_as_a_broker_does() -> None:
    # A broker's LengthFieldBasedFrameDecoder(max, 0, 4, 0, 4) takes the frame length as totalSize + 4
    # (the length field's end offset) and refuses it above max. Before, totalSize = max passed here,
    # 4 bytes more than any broker takes.
    cmd = b"c" * 92
    decoder = FrameDecoder(100)
    decoder.feed(frame(cmd))  # totalSize = 96: 100 bytes with the size field, the limit itself
    assert decoder.next_frame() == cmd
    decoder.feed(frame(cmd + b"c"))  # totalSize = 97
    with pytest.raises(FrameError, match="101 bytes"):
        decoder.next_frame()


def test_limit_can_be_changed_after_handshake() -> None:
    decoder = FrameDecoder(DEFAULT_MAX_FRAME_SIZE)
    decoder.max_frame_size = 10
    decoder.feed(frame(b"c" * 7))
    with pytest.raises(FrameError):
        decoder.next_frame()


def test_command_size_larger_than_frame() -> None:
    decoder = FrameDecoder(1024)
    decoder.feed(struct.pack(">II", 10, 7))  # 7 > 10 - 4; rejected before the body arrives
    with pytest.raises(FrameError, match="does not fit"):
        decoder.next_frame()


def test_zero_command_size() -> None:
    decoder = FrameDecoder(1024)
    decoder.feed(struct.pack(">II", 8, 0) + b"abcd")
    with pytest.raises(FrameError, match="empty"):
        decoder.next_frame()


@pytest.mark.parametrize("total", [0, 1, 4])
def test_total_size_too_small_for_a_command(total: int) -> None:
    decoder = FrameDecoder(1024)
    decoder.feed(struct.pack(">I", total))
    with pytest.raises(FrameError):
        decoder.next_frame()


def test_decoder_stays_failed() -> None:
    decoder = FrameDecoder(8)
    decoder.feed(struct.pack(">I", 9))
    for _ in range(2):
        with pytest.raises(FrameError):
            decoder.next_frame()


def test_partial_header_needs_more() -> None:
    decoder = FrameDecoder(1024)
    decoder.feed(b"\x00\x00")
    assert decoder.next_frame() is None
    decoder.feed(b"\x00\x06\x00\x00\x00")
    assert decoder.next_frame() is None
    assert decoder.buffered == 7


def test_large_backlog_is_linear() -> None:
    # 200k frames of 10 bytes in one feed: quadratic buffer handling would take minutes, not
    # the fraction of a second this takes. Also crosses the compaction threshold many times.
    one = frame(b"\x08\x12")
    decoder = FrameDecoder(1024)
    decoder.feed(one * 200_000 + one[:5])
    assert sum(1 for _ in iter(decoder.next_frame, None)) == 200_000
    assert decoder.buffered == 5
    decoder.feed(one[5:])
    assert decoder.next_frame() == b"\x08\x12"


def test_invalid_limit() -> None:
    with pytest.raises(ValueError):
        FrameDecoder(0)
