"""One registration per command (tc_server/wire/codec/registry.py): every command class of the
``Command`` union but ``Unknown`` is known to the codec in both directions, under its own wire Type."""

from __future__ import annotations

import re
import typing

import pytest

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.wire import Command, NewTxn, Unknown, command_name
from tc_server.wire.codec.registry import DECODERS, ENCODERS, FAST_ENCODERS, TYPE_OF, register, varint

COMMAND_CLASSES = [cls for cls in typing.get_args(Command) if cls is not Unknown]


def test_every_command_class_is_registered_once() -> None:
    assert set(TYPE_OF) == set(COMMAND_CLASSES)
    assert set(ENCODERS) == set(COMMAND_CLASSES)
    codes = list(TYPE_OF.values())
    assert len(codes) == len(set(codes)), "two classes share a wire Type"
    assert set(DECODERS) == set(codes)
    assert set(FAST_ENCODERS) <= set(COMMAND_CLASSES)


# Where the wire name is not the class name in UPPER_SNAKE_CASE.
WIRE_NAMES = {"TcClientConnect": "TC_CLIENT_CONNECT_REQUEST"}


@pytest.mark.parametrize("cls", COMMAND_CLASSES, ids=lambda cls: cls.__name__)
def test_each_class_is_registered_under_its_own_wire_type(cls: type) -> None:
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).upper()
    assert pb.BaseCommand.Type.Name(TYPE_OF[cls]) == WIRE_NAMES.get(cls.__name__, snake)


def test_registering_a_command_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register(NewTxn, pb.BaseCommand.NEW_TXN, decode=DECODERS[pb.BaseCommand.NEW_TXN], encode=ENCODERS[NewTxn])
    assert command_name(NewTxn(1, 1000, 0)) == "NEW_TXN"


def test_varints_of_txn_ids_from_the_clock_s_floor_are_protobuf_s():
    # varint() takes high bytes from a memo (ids from the clock's floor share them): whatever came
    # before, each value's bytes are protobuf's own encoding of it.
    def protobuf(value: int) -> bytes:
        return pb.CommandEndTxnResponse(request_id=value).SerializeToString()[1:]

    values = [*range(0, 1 << 15, 7), (1 << 28) - 1, 1 << 28, (1 << 64) - 1, 1 << 63, 1 << 63, 5]
    first = 1795958457624000000
    values += [first + i for i in range(-(1 << 14), 1 << 14, 3)] + [first, 1 << 40, first + 1, first]
    values += [first + tc * 10**9 + i for i in range(300) for tc in range(16)]  # coordinators in turn
    values += [first + (run << 14) for run in range(600)]  # past the memo's size
    for value in values:
        assert varint(value) == protobuf(value), value
