"""The one table of the commands the codec knows, and the field helpers every command family uses.

A command is registered once, by :func:`register`, in the module of its family (``session``,
``discovery``, ``txn``): its class, its wire Type, how to decode its BaseCommand and how to encode it
(plus, for the few on the hot path, a hand-written encoder straight to frame bytes). The dispatch
dicts that ``decode_command`` and ``encode_command`` use are built from that one call.

Presence rules: our .proto declares upstream's ``required`` fields ``optional`` (see its header), so
the checks for them live in the decoders, and each one names the field it found missing.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import Any, Final, TypeVar

from google.protobuf import unknown_fields

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.wire.commands import Command
from tc_server.wire.errors import MalformedCommand, ServerError

_Base = pb.BaseCommand

Decoder = Callable[[pb.BaseCommand], Command]
# Encoders take their own command class; the table holds them for any.
Encoder = Callable[[Any], pb.BaseCommand]
FastEncoder = Callable[[Any], bytes]

# Wire Type value -> decoder; command class -> encoder, fast encoder, wire Type. Filled by register().
DECODERS: Final[dict[int, Decoder]] = {}
ENCODERS: Final[dict[type[Any], Encoder]] = {}
FAST_ENCODERS: Final[dict[type[Any], FastEncoder]] = {}
TYPE_OF: Final[dict[type[Any], int]] = {}

_C = TypeVar("_C")


def register(cls: type[_C], code: int, *, decode: Decoder, encode: Callable[[_C], pb.BaseCommand],
             fast_encode: Callable[[_C], bytes] | None = None) -> None:
    """Make ``cls`` (wire Type ``code``) known to the codec: ``decode`` turns a BaseCommand of that type
    into it, ``encode`` builds the BaseCommand for it, ``fast_encode`` (optional) writes its whole
    frame without protobuf objects and must produce the same bytes (tests/wire checks it).

    Raises ValueError when the class or the Type is registered already."""
    if cls in TYPE_OF or code in DECODERS:
        raise ValueError(f"{cls.__name__} / {type_name(code)} is registered twice")
    TYPE_OF[cls] = code
    DECODERS[code] = decode
    ENCODERS[cls] = encode
    if fast_encode is not None:
        FAST_ENCODERS[cls] = fast_encode


# -- decoding helpers -----------------------------------------------------------------------------

U64_MASK: Final = (1 << 64) - 1


I64_SIGN: Final = 1 << 63


# Indexed by wire value; ServerError's values are exactly 0..25.
SERVER_ERRORS: Final = tuple(ServerError)


VARINT_WIRE_TYPE: Final = 0  # protobuf wire type of varint fields


def type_name(code: int) -> str:
    try:
        return f"{_Base.Type.Name(code)} ({code})"
    except ValueError:
        return f"command type {code}"


def signed_long(wire: int) -> int:
    """A uint64 request id as Java reads it: a signed long (the auth-failure ERROR uses -1)."""
    return wire - (1 << 64) if wire >= I64_SIGN else wire


def text(value: object) -> str:
    # upb hands back proto2 strings that are not valid UTF-8 as bytes. Replace the bad bytes the way
    # Java's String(bytes, UTF_8) does rather than reject the command: a topic name with a bad byte
    # then simply matches nothing.
    if value.__class__ is str:
        return value
    assert isinstance(value, bytes)
    return value.decode("utf-8", "replace")


def opt_text(msg: Any, field: str) -> str | None:
    return text(getattr(msg, field)) if msg.HasField(field) else None


def unknown_varint(msg: Any, number: int) -> int | None:
    """The last varint stored as unknown field ``number``: where proto2 puts an enum value it has no
    name for, so "absent" and "out of range" can be told apart."""
    found: int | None = None
    fields: Any = unknown_fields.UnknownFieldSet(msg)
    for field in fields:
        if field.field_number == number and field.wire_type == VARINT_WIRE_TYPE:
            found = field.data
    return found


def server_error(msg: Any, field: str, number: int) -> ServerError | None:
    if msg.HasField(field):
        error: ServerError = SERVER_ERRORS[getattr(msg, field)]
        return error
    if unknown_varint(msg, number) is not None:
        # A code newer than this codec: still an error, just not one it can name.
        return ServerError.UnknownError
    return None


def no_body(code: int, field: str) -> MalformedCommand:
    return MalformedCommand(f"{type_name(code)} without its {field} message")


def missing(code: int, field: str, request_id: int | None = None) -> MalformedCommand:
    return MalformedCommand(f"{type_name(code)} without required field {field}", request_id)


# Entries one request's repeated field may list (an ADD_*'s topics or subscriptions, a LOOKUP's properties).
# Each became Python objects before anything could refuse the request: one 5 MB LOOKUP of 870,000 empty
# properties, sent before CONNECT, held the event loop for over a second (a review). Far above what clients
# send (one topic per ADD, a few properties); the coordinator refuses more than 256 participants anyway.
MAX_LISTED: Final = 4096


def checked_count(entries: Sized, code: int, field: str, request_id: int) -> None:
    """Refuse a request whose repeated ``field`` lists more than MAX_LISTED entries (counted, not read)."""
    if len(entries) > MAX_LISTED:
        raise MalformedCommand(f"{type_name(code)} lists {len(entries)} {field}; at most {MAX_LISTED}", request_id)


def checked_request_id(msg: Any, code: int) -> int:
    if not msg.HasField("request_id"):
        raise missing(code, "request_id")
    return signed_long(msg.request_id)


# -- encoding helpers -----------------------------------------------------------------------------


def wire_request_id(request_id: int) -> int:
    # The inverse of signed_long: a negative Java long goes out as its two's complement.
    return request_id & U64_MASK


def error_message(error: ServerError, message: str | None) -> str:
    # Java's generated getters throw on an unset optional field without a default, and clients read
    # `message` whenever `error` is set, so an error always travels with a message.
    return error.name if message is None else message


# Varints below 128 are one byte; coordinator ids and small request ids are.
SMALL_VARINTS: Final = tuple(bytes((i,)) for i in range(128))
# A varint's first byte when more follow: the low 7 bits with the continuation bit (issue 13: built
# from a table and a memo rather than bit by bit, every varint of two bytes or more is a concatenation).
_CONTINUED: Final = tuple(bytes((i | 0x80,)) for i in range(128))
# Txn ids (least bits) start at the clock's floor (coordinator/ids.py): 19 digits, a 9-byte varint that took
# ~1.2 us a loop, twice per pair (issue 13). A coordinator's consecutive ids share all their bytes but the
# first (the low 7 bits), so a value from here on takes the rest of its encoding from a memo of them: one
# entry per coordinator's run of 128 ids (one entry for all coordinators missed at every turn).
_SHARED_TAIL_FROM: Final = 1 << 28
_TAIL_MEMO_SIZE: Final = 256  # past it the memo starts again: it holds the runs in use, not every one seen
_tails: dict[int, bytes] = {}  # value >> 7 -> its varint


def _varint_loop(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint(value: int) -> bytes:
    if value < 0x80:
        return SMALL_VARINTS[value]
    if value < 0x4000:  # two bytes: most request ids
        return _CONTINUED[value & 0x7F] + SMALL_VARINTS[value >> 7]
    if value < _SHARED_TAIL_FROM:
        return _varint_loop(value)
    high = value >> 7
    tail = _tails.get(high)
    if tail is None:
        if len(_tails) >= _TAIL_MEMO_SIZE:
            _tails.clear()
        tail = _tails[high] = _varint_loop(high)
    return _CONTINUED[value & 0x7F] + tail


def u64_varint(value: int, name: str) -> bytes:
    if not 0 <= value <= U64_MASK:
        raise ValueError(f"{name} {value} is out of range for uint64")
    return SMALL_VARINTS[value] if value < 0x80 else varint(value)
