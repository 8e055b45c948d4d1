"""Property-based tests: no input makes the codec raise anything but a WireError, and valid input
survives any chunking and any field values."""

import dataclasses
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tc_server.wire import (
    AddPartitionToTxn,
    AddPartitionToTxnResponse,
    AddSubscriptionToTxn,
    AddSubscriptionToTxnResponse,
    Command,
    EndTxn,
    EndTxnResponse,
    FrameDecoder,
    MalformedCommand,
    NewTxn,
    NewTxnResponse,
    ServerError,
    Subscription,
    TxnAction,
    WireError,
    decode_command,
    encode_command,
)
from tc_server.wire.codec import _encode_with_protobuf
from tc_server.wire.commands import _TxnOpResponse

from .test_wire_roundtrip import CASES

TxnOpResponse = NewTxnResponse | AddPartitionToTxnResponse | AddSubscriptionToTxnResponse | EndTxnResponse

# Moderate example counts: the whole suite has to stay fast on a 2-core machine.
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
request_ids = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
texts = st.text(max_size=20)
errors = st.none() | st.sampled_from(list(ServerError))


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def run_stream(chunks: list[bytes], max_frame_size: int) -> list[Command]:
    """What a connection does with incoming bytes; stops at the first WireError, like it would."""
    decoder = FrameDecoder(max_frame_size)
    out: list[Command] = []
    try:
        for chunk in chunks:
            decoder.feed(chunk)
            while (body := decoder.next_frame()) is not None:
                try:
                    out.append(decode_command(body))
                except MalformedCommand:
                    continue  # the connection would answer with ERROR and close; keep fuzzing
    except WireError:
        pass
    return out


@FUZZ
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_arbitrary_bytes_only_raise_wire_errors(data: bytes, cuts: list[int]) -> None:
    run_stream(chunked(data, cuts), max_frame_size=256)


@FUZZ
@given(
    bodies=st.lists(st.binary(min_size=1, max_size=60), min_size=1, max_size=5),
    cuts=st.lists(st.integers(min_value=0), max_size=8),
)
def test_well_framed_garbage_only_raises_malformed(bodies: list[bytes], cuts: list[int]) -> None:
    # Valid framing around random command bytes: exercises the protobuf side far more than random
    # frames do, since random size prefixes are nearly always rejected first.
    stream = b"".join(struct.pack(">II", len(b) + 4, len(b)) + b for b in bodies)
    decoder = FrameDecoder(1024)
    seen = 0
    for chunk in chunked(stream, cuts):
        decoder.feed(chunk)
        while (body := decoder.next_frame()) is not None:
            seen += 1
            try:
                decode_command(body)
            except MalformedCommand:
                pass
    assert seen == len(bodies)


@FUZZ
@given(
    case=st.sampled_from(CASES),
    edits=st.lists(
        st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255), st.sampled_from("rid")),
        min_size=1,
        max_size=4,
    ),
)
def test_mutated_commands_only_raise_malformed(case: Command, edits: list[tuple[int, int, str]]) -> None:
    body = bytearray(encode_command(case)[8:])
    for pos, value, op in edits:
        i = pos % (len(body) + 1)
        if op == "r" and i < len(body):
            body[i] = value
        elif op == "i":
            body.insert(i, value)
        elif op == "d" and i < len(body):
            del body[i]
    try:
        decode_command(bytes(body))
    except MalformedCommand:
        pass


@FUZZ
@given(
    cases=st.lists(st.sampled_from(CASES), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=0), max_size=10),
)
def test_valid_stream_any_chunking(cases: list[Command], cuts: list[int]) -> None:
    stream = b"".join(encode_command(c) for c in cases)
    assert run_stream(chunked(stream, cuts), max_frame_size=4096) == cases


txn_commands = st.one_of(
    st.builds(NewTxn, request_ids, u64, u64, st.booleans()),
    st.builds(
        AddPartitionToTxn, request_ids, u64, u64, st.lists(texts, max_size=3).map(tuple), st.booleans()
    ),
    st.builds(
        AddSubscriptionToTxn,
        request_ids,
        u64,
        u64,
        st.lists(st.builds(Subscription, texts, texts), max_size=3).map(tuple),
        st.booleans(),
    ),
    st.builds(EndTxn, request_ids, u64, u64, st.sampled_from(list(TxnAction)), st.booleans()),
    st.builds(NewTxnResponse, request_ids, u64, u64, errors, st.none() | texts),
    st.builds(EndTxnResponse, request_ids, u64, u64, errors, st.none() | texts),
)


@FUZZ
@given(cmd=txn_commands)
def test_txn_commands_round_trip(cmd: Command) -> None:
    decoded = decode_command(encode_command(cmd)[8:])
    if isinstance(cmd, _TxnOpResponse) and cmd.error is not None and cmd.message is None:
        # An error always goes out with a message: its name, when none was given.
        cmd = dataclasses.replace(cmd, message=cmd.error.name)
    assert decoded == cmd


TXN_RESPONSE_CLASSES: list[type[_TxnOpResponse]] = [
    NewTxnResponse,
    AddPartitionToTxnResponse,
    AddSubscriptionToTxnResponse,
    EndTxnResponse,
]
txn_responses = st.sampled_from(TXN_RESPONSE_CLASSES).flatmap(
    lambda cls: st.builds(
        cls,
        request_ids,
        u64,
        u64,
        errors,
        st.none() | st.text(max_size=200),  # past 127 bytes the length takes two varint bytes
    )
)


@FUZZ
@given(cmd=txn_responses)
def test_fast_txn_response_encoder_matches_protobuf(cmd: TxnOpResponse) -> None:
    assert encode_command(cmd) == _encode_with_protobuf(cmd)


@pytest.mark.parametrize(("most", "least"), [(-1, 0), (0, -1), (1 << 64, 0), (0, 1 << 64)])
def test_fast_txn_response_encoder_rejects_out_of_range(most: int, least: int) -> None:
    for encode in (encode_command, _encode_with_protobuf):
        with pytest.raises(ValueError):
            encode(NewTxnResponse(1, most, least))
