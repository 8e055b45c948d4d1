"""BaseCommand bytes ⇄ typed commands. The only package that touches the generated protobuf classes.

Each command family has its module, and each command is registered once there (``registry.register``):
``session`` (CONNECT, AUTH_*, PING/PONG, ERROR), ``discovery`` (PARTITIONED_METADATA, LOOKUP,
TC_CLIENT_CONNECT, WATCH_TC_ASSIGNMENTS*) and ``txn`` (NEW_TXN, ADD_*, END_TXN*, their responses).

``decode_command`` is the server's hot path, so both directions dispatch through dicts built once
(Type value → decoder, command class → encoder) and each codec function is written out by hand
rather than driven by reflection.
"""

from __future__ import annotations

from typing import Final

from google.protobuf.message import DecodeError

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.wire.codec import discovery, session, txn  # noqa: F401 - importing them registers their commands
from tc_server.wire.codec.registry import (
    DECODERS,
    ENCODERS,
    FAST_ENCODERS,
    TYPE_OF,
    U64_MASK,
    signed_long,
    unknown_varint,
    varint,
)
from tc_server.wire.commands import Command, Unknown
from tc_server.wire.errors import MalformedCommand
from tc_server.wire.framing import encode_frame

__all__ = ["command_name", "decode_command", "encode_command"]

_Base = pb.BaseCommand
_parse: Final = _Base.FromString


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
    return Unknown(code, signed_long(sub.request_id))


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
        unnamed = unknown_varint(base, 1)
        if unnamed is None:
            raise MalformedCommand("BaseCommand without required field type")
        return Unknown(unnamed, None)
    decoder = DECODERS.get(code)
    if decoder is None:
        return _decode_unknown(base, code)
    return decoder(base)


def _encode_unknown(c: Unknown) -> pb.BaseCommand:
    base = _Base()
    try:
        base.type = c.type_code  # type: ignore[assignment]
    except ValueError:
        # A Type value our enum does not name: proto2 refuses to set it, so build it by hand.
        base.MergeFromString(b"\x08" + varint(c.type_code & U64_MASK))
    return base


def _encode_with_protobuf(cmd: Command) -> bytes:
    """``encode_command`` without the hand-written fast paths: the reference they are tested against."""
    if isinstance(cmd, Unknown):
        return encode_frame(_encode_unknown(cmd).SerializeToString())
    encoder = ENCODERS.get(type(cmd))
    if encoder is None:
        raise TypeError(f"not a wire command: {cmd!r}")
    return encode_frame(encoder(cmd).SerializeToString())


def command_name(cmd: Command) -> str:
    """The wire Type name of a command (``LOOKUP``, ``GET_SCHEMA``, …); ``OTHER`` for a type value
    without a name, so that names stay a bounded set (they are metric labels)."""
    code = cmd.type_code if isinstance(cmd, Unknown) else TYPE_OF[type(cmd)]
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
    fast = FAST_ENCODERS.get(type(cmd))
    if fast is not None:
        return fast(cmd)
    return _encode_with_protobuf(cmd)
