"""Where every transaction record lives: keys, partition keys, index keys and JSON shapes.

This is the record layout Pulsar 5's own v5 coordinator and participants write and read (PIP-473;
``TxnPaths``, ``TxnMetadataStore``, and Pulsar's Oxia metadata store, which prefixes every secondary
key with the record's parent path), kept in one module so that a broker sharing the store sees the
same records, byte for byte. docs/record-layout.md describes every key, index and JSON shape with a
golden example, the form tc-server wrote before (still read), and the upgrade behaviour.

Writers produce Pulsar 5's form only. Readers accept Pulsar 5's form (also what Pulsar's own v5
coordinator wrote: decimal seconds, or ISO-8601 if Jackson ever writes that) and tc-server's earlier
form, and ignore unknown fields, as Pulsar's ObjectMapper does.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_FLOOR, Decimal, DecimalException
from enum import Enum
from typing import Any
from urllib.parse import quote_plus

from tc_server.store.api import exact_index_range

TXN_ROOT = "/txn"
# Parents of the header and op records: Pulsar's Oxia store writes every secondary key of a record
# as ``<parent>/<key>`` (docs/record-layout.md, "Secondary index keys").
HEADER_PARENT = "/txn/id"
OP_PARENT = "/txn/op"
HEADER_PREFIX = HEADER_PARENT + "/"
OP_PREFIX = OP_PARENT + "/"
SEGMENT_EVENTS_PREFIX = "/txn/segment-events/"
SUBSCRIPTION_EVENTS_PREFIX = "/txn/subscription-events/"
TC_SEQ_PREFIX = "/txn/tc-seq/"
LEADER_PREFIX = "/txn/tc/leader/"
# Ephemeral record per live tc-server instance, so instances can split the coordinators evenly
# (ours; Pulsar brokers find their peers through their own registry).
MEMBER_PREFIX = "/txn/tc/members/"
# The number of coordinators, written once by the first coordinator to start (Pulsar's
# TxnPaths.TXN_TC_PARALLELISM_PATH): the plain decimal text Pulsar writes and parses.
PARALLELISM_PATH = "/txn/tc/parallelism"

IDX_TXN_BY_DEADLINE = "idx:txn-by-deadline"
IDX_TXN_BY_FINAL_STATE = "idx:txn-by-final-state"
IDX_OPS_BY_TXN = "idx:ops-by-txn"
IDX_WRITES_BY_SEGMENT = "idx:writes-by-segment"
IDX_ACKS_BY_SEGMENT_SUBSCRIPTION = "idx:acks-by-segment-subscription"

# Index keys are zero-padded to 20 digits so that string order is numeric order.
PAD = 20


class TxnState(Enum):
    __hash__ = object.__hash__  # as Request's (coordinator/state.py): a Python call less per table lookup

    OPEN = "OPEN"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"

    @property
    def terminal(self) -> bool:
        return self is not TxnState.OPEN


class OpKind(Enum):
    WRITE = "WRITE"
    ACK = "ACK"


def pad(ms: int) -> str:
    return f"{ms:0{PAD}d}"


def enc(name: str) -> str:
    """Pulsar's ``Codec.encode``, i.e. Java's ``URLEncoder.encode(name, UTF_8)``: letters, digits and
    ``.-*_`` stay, a space becomes ``+``, everything else ``%XX`` of its UTF-8 bytes (``~`` too); an
    unpaired surrogate is encoded as ``?`` (``%3F``), as Java's encoder replaces it."""
    # quote_plus keeps "~" (RFC 3986 unreserved) where URLEncoder encodes it; no "~" can come out of
    # the percent-encoding itself, so replacing the kept ones afterwards is exact.
    return quote_plus(name.encode("utf-8", "replace"), safe="*").replace("~", "%7E")


# Canonical decimals only, as Java's Long.toString writes them: no leading zero, no "-0". Another
# spelling would name the same txn under a second key (and partition key).
_TXN_KEY = re.compile(r"(0|-?[1-9][0-9]*)_(0|-?[1-9][0-9]*)", re.ASCII)


def txn_key(most: int, least: int) -> str:
    """``TxnIds.toKey``: decimal ``<mostSigBits>_<leastSigBits>``."""
    return f"{most}_{least}"


def parse_txn_key(key: str) -> tuple[int, int]:
    """``<most>_<least>`` -> (most, least); ValueError for anything else (``1_0_0``, `` 1_0``, ``1_0x``)."""
    match = _TXN_KEY.fullmatch(key)
    if match is None or len(key) > 41:  # two int64s and the "_": no int() of thousands of digits
        raise ValueError(f"not a txn key: {key!r}")
    most, least = int(match[1]), int(match[2])
    if not (-_INT64_MAX - 1 <= most <= _INT64_MAX and -_INT64_MAX - 1 <= least <= _INT64_MAX):
        raise ValueError(f"not a txn key: {key!r} (beyond 64 bits)")
    return most, least


def header_path(most: int, least: int) -> str:
    return f"{HEADER_PREFIX}{most}_{least}"  # HEADER_PREFIX + txn_key(), one call less per request


def parse_header_path(path: str) -> tuple[int, int]:
    """``/txn/id/<most>_<least>`` -> (most, least); ValueError for any other key."""
    if not path.startswith(HEADER_PREFIX):
        raise ValueError(f"not a txn header key: {path!r}")
    return parse_txn_key(path[len(HEADER_PREFIX):])


def op_prefix(most: int, least: int) -> str:
    """What a participant appends a txn's op records under (Pulsar's ``TxnPaths.opParent``); the store
    adds ``-<20-digit seq>``. Partition key: the txn key."""
    return OP_PREFIX + txn_key(most, least)


def parse_op_key(key: str) -> tuple[int, int]:
    """``/txn/op/<most>_<least>-<seq>`` (an op record's key) -> (most, least); ValueError for any other."""
    txn, dash, seq = key[len(OP_PREFIX):].rpartition("-") if key.startswith(OP_PREFIX) else ("", "", "")
    if not dash or not seq.isdigit():
        raise ValueError(f"not an op record key: {key[:120]!r}")
    return parse_txn_key(txn)


def op_records_prefix(most: int, least: int) -> str:
    """Every op record of one txn, and nothing else, starts with this (``/txn/op/1_0-`` cannot be the
    start of txn ``1_01``'s keys); with the txn key as partition key the scan reads one shard."""
    return op_prefix(most, least) + "-"


def segment_events_prefix(segment: str) -> str:
    return SEGMENT_EVENTS_PREFIX + enc(segment)


def subscription_partition_key(segment: str, subscription: str) -> str:
    """``TxnPaths.ackIndexKey``: ``<enc(segment)>:<enc(subscription)>``."""
    return f"{enc(segment)}:{enc(subscription)}"


def subscription_events_prefix(segment: str, subscription: str) -> str:
    return SUBSCRIPTION_EVENTS_PREFIX + subscription_partition_key(segment, subscription)


def tc_seq_path(tc_id: int) -> str:
    return f"{TC_SEQ_PREFIX}{tc_id}"


def leader_path(tc_id: int) -> str:
    return f"{LEADER_PREFIX}{tc_id}"


def member_path(instance_id: str) -> str:
    return f"{MEMBER_PREFIX}{instance_id}"


# -- secondary index keys (docs/record-layout.md, "Secondary index keys") ----------------------------
#
# Pulsar's TxnMetadataStore names a key per index (a 20-digit deadline, "COMMITTED:" + 20 digits, a
# txn key, an encoded segment), and Pulsar's Oxia metadata store stores it as "<parent path>/<key>"
# (the header's parent is /txn/id, an op record's /txn/op). Those prefixed keys are the ones a broker
# writes and scans, so tc-server writes and scans them on every store.


def secondary_key(parent: str, key: str) -> str:
    """The secondary key Pulsar's Oxia store writes for ``key`` on a record under ``parent``."""
    return f"{parent}/{key}"


def deadline_index_key(deadline_ms: int) -> str:
    """``idx:txn-by-deadline`` of an OPEN header: ``/txn/id/`` + 20-digit deadline ms."""
    # secondary_key(HEADER_PARENT, pad(deadline_ms)) as one f-string: one is built per NEW_TXN.
    return f"{HEADER_PARENT}/{deadline_ms:020d}"


def final_state_index_key(state: TxnState, finalized_ms: int) -> str:
    """``idx:txn-by-final-state`` of a terminal header: ``/txn/id/<STATE>:`` + 20-digit ms."""
    # One f-string (one is built per END_TXN); state._value_: Enum.value is a Python-level property.
    return f"{HEADER_PARENT}/{state._value_}:{finalized_ms:020d}"


def ops_by_txn_index_key(most: int, least: int) -> str:
    """``idx:ops-by-txn`` of an op record: ``/txn/op/<most>_<least>``."""
    return secondary_key(OP_PARENT, txn_key(most, least))


def writes_by_segment_index_key(segment: str) -> str:
    """``idx:writes-by-segment`` of a WRITE op record: ``/txn/op/<enc(segment)>``."""
    return secondary_key(OP_PARENT, enc(segment))


def acks_by_subscription_index_key(segment: str, subscription: str) -> str:
    """``idx:acks-by-segment-subscription`` of an ACK op record: ``/txn/op/<enc(seg)>:<enc(sub)>``."""
    return secondary_key(OP_PARENT, subscription_partition_key(segment, subscription))


# tc-server before Pulsar 5's layout wrote the header index keys without the parent path. Headers
# written then still carry them (an OPEN one until it ends, a terminal one until GC deletes it), so
# every scan of those two indexes also reads the old range: upgrading needs no migration step, and
# an instance of the old version still running next to a new one is read too. Once every old header
# has ended and been collected the old ranges are empty and cost one empty scan each.
# (docs/record-layout.md, "Upgrading from the earlier tc-server layout".)


def legacy_deadline_index_key(deadline_ms: int) -> str:
    return pad(deadline_ms)


def legacy_final_state_index_key(state: TxnState, finalized_ms: int) -> str:
    return f"{state.value}:{pad(finalized_ms)}"


# A [start, end) range of secondary keys.
IndexRange = tuple[str, str]

# Sorts after any 20-digit number: the end of a scan over every deadline / finalization time.
INDEX_END = "~"


def ops_by_txn_range(most: int, least: int) -> IndexRange:
    return exact_index_range(ops_by_txn_index_key(most, least))


def ops_by_txn_coordinator_range(most: int) -> IndexRange:
    """Every ``idx:ops-by-txn`` entry of coordinator ``most``'s txns: ``/txn/op/<most>_`` up to
    ``/txn/op/<most>_~`` (``/txn/op/1_`` is no start of coordinator 10's keys; both bounds have the
    secondary keys' count of ``/``, see participants_by_coordinator_range)."""
    prefix = secondary_key(OP_PARENT, f"{most}_")
    return prefix, prefix + INDEX_END


def deadline_ranges(before_ms: int | None = None) -> tuple[IndexRange, IndexRange]:
    """Where ``idx:txn-by-deadline`` holds the OPEN headers whose deadline is before ``before_ms``
    (all of them when None): Pulsar 5's keys, then the earlier tc-server keys."""
    end = INDEX_END if before_ms is None else pad(before_ms)
    return (
        (secondary_key(HEADER_PARENT, pad(0)), secondary_key(HEADER_PARENT, end)),
        (pad(0), end),
    )


def final_state_ranges(state: TxnState, before_ms: int) -> tuple[IndexRange, IndexRange]:
    """Where ``idx:txn-by-final-state`` holds the headers that ended in ``state`` before ``before_ms``:
    Pulsar 5's keys, then the earlier tc-server keys."""
    prefix = f"{state.value}:"
    return (
        (secondary_key(HEADER_PARENT, prefix), secondary_key(HEADER_PARENT, prefix + pad(before_ms))),
        (prefix, prefix + pad(before_ms)),
    )


# -- JSON (docs/record-layout.md, "Values") -----------------------------------------------------------
#
# Pulsar writes its records with Jackson: compact, fields in declaration order, null fields left out,
# strings in UTF-8 with \uXXXX escapes (upper-case hex) only for control characters and UTF-16
# surrogates (below). The writers here produce exactly those bytes; the readers take any valid JSON with
# the same fields.

_INT64_MAX = 2**63 - 1
# Jackson's \u00XX escapes use upper-case hex, Python's lower-case. An escape is a backslash that
# an even run of (escaped) backslashes precedes; "\\\\u001f" is an escaped backslash and text.
_LOWER_HEX_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u00([0-9a-f]{2})")


# Jackson's UTF-8 generator (ObjectMapper.writeValueAsBytes) escapes each UTF-16 surrogate it meets
# (jackson-core 2.x's default: COMBINE_UNICODE_SURROGATES_IN_UTF8 is off): a character beyond U+FFFF is
# written as its two surrogates' escapes, a lone surrogate (which UTF-8 cannot hold) as its own. Left
# raw, a lone surrogate could not even be encoded: a role named so (a JWT "sub" may hold one) made its
# txns impossible to write or end.
_SURROGATE_OR_ASTRAL = re.compile("[\ud800-\udfff\U00010000-\U0010ffff]")


def _utf16_escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    if code < 0x10000:
        return f"\\u{code:04X}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04X}\\u{0xDC00 + (code & 0x3FF):04X}"


def _json_string(text: str) -> str:
    quoted = json.dumps(text, ensure_ascii=False)
    quoted = _LOWER_HEX_ESCAPE.sub(lambda m: f"{m[1]}\\u00{m[2].upper()}", quoted)
    return _SURROGATE_OR_ASTRAL.sub(_utf16_escape, quoted)


def _json_object(fields: list[tuple[str, str]]) -> bytes:
    """``{"name":value,...}`` from already encoded values."""
    return ("{" + ",".join(f'"{name}":{value}' for name, value in fields) + "}").encode()


class MalformedRecord(ValueError):
    """A stored value that is not the record its key says; the message names the problem."""


def _no_constants(name: str) -> Any:
    raise MalformedRecord(f"{name} is not a JSON number")


def load_json_object(raw: bytes) -> dict[str, Any]:
    """A record's JSON object, with fractions as exact :class:`Decimal` (a header's
    ``1795447209.230663502`` must not become a binary float). ValueError naming the problem."""
    try:
        doc = json.loads(raw, parse_float=Decimal, parse_constant=_no_constants)
    except DecimalException as exc:  # an ArithmeticError: every reader's `except ValueError` missed it
        raise MalformedRecord("a number is out of range") from exc
    except RecursionError as exc:
        raise MalformedRecord("value is nested too deeply") from exc
    except UnicodeDecodeError as exc:
        raise MalformedRecord(f"value is not UTF-8: {exc}") from exc
    if not isinstance(doc, dict):
        raise MalformedRecord(f"value is not a JSON object but {type(doc).__name__}")
    return doc


def _str_field(doc: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = doc.get(name)
    if value is None and required:
        raise MalformedRecord(f"missing field {name!r}")
    if value is not None and not isinstance(value, str):
        raise MalformedRecord(f"field {name!r} is not a string: {value!r}")
    return value


def _int_field(doc: dict[str, Any], name: str, *, required: bool = False) -> int | None:
    value = doc.get(name)
    if value is None and required:
        raise MalformedRecord(f"missing field {name!r}")
    # bool is an int in Python, not in JSON.
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise MalformedRecord(f"field {name!r} is not an integer: {value!r}")
    return value


def _required_int(doc: dict[str, Any], name: str) -> int:
    value = _int_field(doc, name, required=True)
    assert value is not None
    return value


def _required_str(doc: dict[str, Any], name: str) -> str:
    value = _str_field(doc, name, required=True)
    assert value is not None
    return value


def _bool_field(doc: dict[str, Any], name: str) -> bool | None:
    value = doc.get(name)
    if value is not None and not isinstance(value, bool):
        raise MalformedRecord(f"field {name!r} is not a boolean: {value!r}")
    return value


# Java's Duration.parse: [-+]P[nD][T[nH][nM][n[.fraction]S]], each number signed.
_ISO_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?[0-9]+)D)?(?:T(?:([-+]?[0-9]+)H)?(?:([-+]?[0-9]+)M)?(?:([-+]?)([0-9]+)(?:[.,]([0-9]{0,9}))?S)?)?",
    re.ASCII | re.IGNORECASE,
)
_DECIMAL_TEXT = re.compile(r"[-+]?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?", re.ASCII)
# Bound before multiplying by 1000: ms must fit a Java long, and a huge exponent must not reach the
# decimal context (which would raise an ArithmeticError, not a ValueError).
_MAX_SECONDS = Decimal(_INT64_MAX) / 1000


def _seconds_to_ms(seconds: Decimal, what: str) -> int:
    """Floor to whole ms, as Java's ``Instant.toEpochMilli`` / ``Duration.toMillis`` do."""
    if not -_MAX_SECONDS <= seconds <= _MAX_SECONDS:
        raise MalformedRecord(f"{what} {seconds} s is out of range")
    return int((seconds * 1000).to_integral_value(rounding=ROUND_FLOOR))


def _json_seconds(value: Any, what: str) -> Decimal | None:
    """A JSON number (Jackson's timestamp form: seconds, with a fraction or not) or a decimal string."""
    if isinstance(value, bool):
        raise MalformedRecord(f"{what} is a boolean")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, Decimal):
        return value
    if isinstance(value, str) and _DECIMAL_TEXT.fullmatch(value.strip()):
        return Decimal(value.strip())
    return None


def parse_duration_ms(value: Any, what: str = "duration") -> int:
    """A ``java.time.Duration`` as Jackson writes it (``60.000000000``: seconds) or reads it (also an
    ISO-8601 string such as ``PT1M`` or ``PT0.5S``), in whole ms. ValueError naming ``what``."""
    seconds = _json_seconds(value, what)
    if seconds is None:
        match = _ISO_DURATION.fullmatch(value.strip()) if isinstance(value, str) else None
        if match is None or not any(match.group(i) for i in (2, 3, 4, 6)):
            raise MalformedRecord(f"{what} is neither seconds nor an ISO-8601 duration: {value!r}")
        sign, days, hours, minutes, seconds_sign, whole, fraction = match.groups()
        part = Decimal(f"{whole or 0}.{fraction or 0}")
        seconds = (
            Decimal(int(days or 0) * 86_400 + int(hours or 0) * 3_600 + int(minutes or 0) * 60)
            + (-part if seconds_sign == "-" else part)
        )
        if sign == "-":
            seconds = -seconds
    return _seconds_to_ms(seconds, what)


def parse_instant_ms(value: Any, what: str = "instant") -> int:
    """A ``java.time.Instant`` as Jackson writes it (``1795447209.230663502``: epoch seconds) or reads
    it (also an ISO-8601 string with a zone, ``2026-11-23T10:00:00.123Z``), in epoch ms (floor)."""
    seconds = _json_seconds(value, what)
    if seconds is not None:
        return _seconds_to_ms(seconds, what)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            when = None
        if when is not None and when.tzinfo is not None:
            since = when - datetime(1970, 1, 1, tzinfo=UTC)
            return since.days * 86_400_000 + since.seconds * 1000 + since.microseconds // 1000
    raise MalformedRecord(f"{what} is neither epoch seconds nor an ISO-8601 instant with a zone: {value!r}")


def seconds_text(ms: int) -> str:
    """How Jackson writes a Duration / Instant of ``ms`` milliseconds: decimal seconds with 9 fraction
    digits (``60.000000000``), and zero as ``0.0``."""
    if ms == 0:
        return "0.0"
    return f"{ms // 1000}.{ms % 1000:03d}000000"


@functools.lru_cache(maxsize=256)
def _duration_text(ms: int) -> str:
    """:func:`seconds_text` of a txn timeout: clients use a few timeouts over and over, and the text is
    built for every header written (profiled, issue 13); bounded, since a client picks the value."""
    return seconds_text(ms)


def parse_header_times(doc: dict[str, Any]) -> tuple[int, int, int | None]:
    """(created ms, timeout ms, finalized ms or None) of a header object in Pulsar 5's form
    (``createdAt``/``timeout``/``finalizedAt``) or tc-server's earlier one (``createdMs``/
    ``timeoutMs``/``finalizedMs``). ValueError naming the missing or bad field."""
    if "createdAt" in doc or "timeout" in doc:
        for name in ("createdAt", "timeout"):
            if doc.get(name) is None:
                raise MalformedRecord(f"missing field {name!r}")
        finalized = doc.get("finalizedAt")
        times = (
            parse_instant_ms(doc["createdAt"], "field 'createdAt'"),
            parse_duration_ms(doc["timeout"], "field 'timeout'"),
            None if finalized is None else parse_instant_ms(finalized, "field 'finalizedAt'"),
        )
        if times[0] < 0 or times[1] < 0:
            # No coordinator writes either; a negative deadline's index key would sort outside every
            # scan (padded digits), and the txn would never be recovered nor timed out.
            raise MalformedRecord(f"field {'createdAt' if times[0] < 0 else 'timeout'!r} is negative")
        return times
    created, timeout = _int_field(doc, "createdMs"), _int_field(doc, "timeoutMs")
    if created is None or timeout is None:
        raise MalformedRecord("missing field 'createdAt' and 'timeout' (or the earlier 'createdMs' and 'timeoutMs')")
    return created, timeout, _int_field(doc, "finalizedMs")


# Not frozen, for the speed of its __init__ (two per transaction; see the note above NewTxn in
# tc_server/wire/commands.py). A header is a value: a changed one is a new TxnHeader.
@dataclass(slots=True)
class TxnHeader:
    """``/txn/id/<most>_<least>``, partition key ``<most>_<least>``: Pulsar's ``TxnHeader``."""

    state: TxnState
    created_ms: int
    timeout_ms: int
    finalized_ms: int | None = None
    owner: str | None = None
    # ``createdAt`` as stored, when read from a record and finer than created_ms: written back unchanged, as
    # Pulsar's coordinator keeps it when it ends a txn. Its Instant has nanoseconds (1795447209.230663502), which
    # created_ms floors (a review: ending a txn Pulsar created rewrote it as 1795447209.230000000). Not part of
    # the value's equality.
    created_text: str | None = field(default=None, compare=False)

    @property
    def deadline_ms(self) -> int:
        return self.created_ms + self.timeout_ms

    def index_entries(self) -> dict[str, str]:
        """The secondary-index entries this header carries: the deadline index while OPEN, the
        final-state index once terminal (a put replaces the record's entries, so the move is atomic)."""
        if self.state is TxnState.OPEN:
            return {IDX_TXN_BY_DEADLINE: deadline_index_key(self.deadline_ms)}
        # Pulsar indexes a terminal header without a finalization time at 0; ours always have one.
        return {IDX_TXN_BY_FINAL_STATE: final_state_index_key(self.state, self.finalized_ms or 0)}

    def to_json(self) -> bytes:
        """Pulsar 5's bytes: ``{"state":"OPEN","timeout":60.000000000,"createdAt":1795447209.230000000}``
        plus ``finalizedAt`` and ``owner`` when set."""
        # One f-string, not _json_object(): two headers are written per transaction (profiled).
        # state._value_: Enum.value is a Python-level property, ~4x the cost of the attribute.
        text = (f'{{"state":"{self.state._value_}","timeout":{_duration_text(self.timeout_ms)},'
                f'"createdAt":{self.created_text or seconds_text(self.created_ms)}')
        if self.finalized_ms is not None:
            text += f',"finalizedAt":{seconds_text(self.finalized_ms)}'
        if self.owner is not None:
            text += f',"owner":{_json_string(self.owner)}'
        return (text + "}").encode()

    @classmethod
    def from_json(cls, raw: bytes) -> TxnHeader:
        """Either form (see :func:`parse_header_times`). Raises ValueError, naming the problem, on a
        record that is not a valid header."""
        try:
            doc = load_json_object(raw)
            created, timeout, finalized = parse_header_times(doc)
            stored = doc.get("createdAt")
            # Kept only when it says more than created_ms (Pulsar's nanoseconds): tc-server's own are whole ms.
            kept = str(stored) if isinstance(stored, int | Decimal) and not isinstance(stored, bool) else None
            return cls(TxnState(_required_str(doc, "state")), created, timeout, finalized, _str_field(doc, "owner"),
                       kept if kept != seconds_text(created) else None)
        except ValueError as exc:
            raise MalformedRecord(f"malformed txn header: {exc}") from exc

    @staticmethod
    def state_from_json(raw: bytes) -> TxnState:
        """Only the header's ``state`` (all GC decides on): :meth:`from_json`'s exact reading of the three
        times cost 60 % of a GC pass's CPU per header (profiled). Raises ValueError as from_json does."""
        try:
            return TxnState(_required_str(load_json_object(raw), "state"))
        except ValueError as exc:
            raise MalformedRecord(f"malformed txn header: {exc}") from exc


@dataclass(frozen=True, slots=True)
class TxnOp:
    """``/txn/op/<most>_<least>-<seq>``, partition key ``<most>_<least>``: an op record, written by a
    participant broker (Pulsar's ``TxnOp``)."""

    kind: OpKind
    segment: str
    ledger_id: int
    entry_id: int
    subscription: str | None = None
    # ACK ops only: a cumulative ack (Pulsar leaves it out for writes and individual acks).
    cumulative: bool | None = None

    def to_json(self) -> bytes:
        fields = [("kind", f'"{self.kind.value}"'), ("segment", _json_string(self.segment))]
        if self.subscription is not None:
            fields.append(("subscription", _json_string(self.subscription)))
        fields += [("ledgerId", str(self.ledger_id)), ("entryId", str(self.entry_id))]
        if self.cumulative is not None:
            fields.append(("cumulative", "true" if self.cumulative else "false"))
        return _json_object(fields)

    @classmethod
    def from_json(cls, raw: bytes) -> TxnOp:
        try:
            doc = load_json_object(raw)
            return cls(OpKind(_required_str(doc, "kind")), _required_str(doc, "segment"),
                       _required_int(doc, "ledgerId"), _required_int(doc, "entryId"),
                       _str_field(doc, "subscription"), _bool_field(doc, "cumulative"))
        except ValueError as exc:
            raise MalformedRecord(f"malformed txn op: {exc}") from exc

    def index_entries(self, most: int, least: int) -> dict[str, str]:
        """The entries Pulsar's participants write with an op record (``TxnMetadataStore.appendOp``)."""
        entries = {IDX_OPS_BY_TXN: ops_by_txn_index_key(most, least)}
        if self.kind is OpKind.WRITE:
            entries[IDX_WRITES_BY_SEGMENT] = writes_by_segment_index_key(self.segment)
        elif self.subscription is not None:
            entries[IDX_ACKS_BY_SEGMENT_SUBSCRIPTION] = acks_by_subscription_index_key(
                self.segment, self.subscription
            )
        return entries


def event_json(most: int, least: int, decision: TxnState) -> bytes:
    """``TxnEvent``: ``{"txnId":"<most>_<least>","decision":"COMMITTED"}``."""
    return _json_object([("txnId", f'"{txn_key(most, least)}"'), ("decision", f'"{decision.value}"')])


def tc_seq_json(next_id: int) -> bytes:
    """``TcSequence`` at ``/txn/tc-seq/<tcId>`` (no partition key): ``{"next":N}``, the next id to hand
    out. Pulsar's coordinator moves it by one per txn, tc-server by a block: both only ever raise it."""
    return _json_object([("next", str(next_id))])


def parse_tc_seq(raw: bytes) -> int:
    try:
        return _required_int(load_json_object(raw), "next")
    except ValueError as exc:
        raise MalformedRecord(f"malformed tc-seq record: {exc}") from exc


_JAVA_INT = re.compile(rb"[-+]?[0-9]+")


def parallelism_value(partitions: int) -> bytes:
    """``/txn/tc/parallelism``: the number as plain decimal text (Pulsar's ``Integer.toString``)."""
    return str(partitions).encode()


def parse_parallelism(raw: bytes) -> int:
    """Pulsar's plain decimal text (leading and trailing blanks allowed, as Java's ``trim`` then
    ``Integer.parseInt``), or tc-server's earlier ``{"parallelism": N}``. ValueError otherwise."""
    text = raw.strip(bytes(range(33)))
    if _JAVA_INT.fullmatch(text):
        return int(text)
    try:
        return _required_int(load_json_object(raw), "parallelism")
    except ValueError as exc:
        raise MalformedRecord(f"not a number of coordinators: {raw[:100]!r}") from exc


def is_legacy_parallelism(raw: bytes) -> bool:
    """True for tc-server's earlier JSON form, which Pulsar's brokers cannot parse."""
    return _JAVA_INT.fullmatch(raw.strip(bytes(range(33)))) is None


@dataclass(frozen=True, slots=True)
class TcLeader:
    """``/txn/tc/leader/<N>`` (ephemeral, no partition key): Pulsar's ``TcLeader``, the elected
    coordinator of partition N and the URLs clients reach it on (WATCH_TC_ASSIGNMENTS answers from
    them). tc-server writes brokerId (its instance id) and brokerServiceUrl."""

    broker_id: str | None
    broker_service_url: str | None
    broker_service_url_tls: str | None = None
    web_service_url: str | None = None

    def to_json(self) -> bytes:
        values = (("brokerId", self.broker_id), ("brokerServiceUrl", self.broker_service_url),
                  ("brokerServiceUrlTls", self.broker_service_url_tls), ("webServiceUrl", self.web_service_url))
        return _json_object([(name, _json_string(value)) for name, value in values if value is not None])

    @classmethod
    def from_json(cls, raw: bytes) -> TcLeader:
        try:
            doc = load_json_object(raw)
            return cls(*(_str_field(doc, name) for name in
                         ("brokerId", "brokerServiceUrl", "brokerServiceUrlTls", "webServiceUrl")))
        except ValueError as exc:
            raise MalformedRecord(f"malformed leader record: {exc}") from exc


# -- Participant records (today's brokers) ----------------------------------------------------------
#
# A 4.x broker applies a decision only when the coordinator sends it END_TXN_ON_PARTITION /
# END_TXN_ON_SUBSCRIPTION (PIP-31). So ADD_PARTITION_TO_TXN / ADD_SUBSCRIPTION_TO_TXN record each
# participant before they answer, and the records of a decided txn are its outbox: one is deleted once
# its broker acknowledged the decision (docs/participants.md). tc-server's own records, not PIP-473's;
# v5 participants (``scalable``) never get one, they read the header.
#
#   /txn/participant/<most>_<least>/p:<enc(partition topic)>               {"topic":"..."}
#   /txn/participant/<most>_<least>/s:<enc(topic)>:<enc(subscription)>     {"topic":"...","subscription":"..."}
#
# Partition key: the txn key, so one scan of one shard finds a txn's participants. Secondary index
# ``idx:participants-by-coordinator`` = ``<20-digit most>/<20-digit least>``: a new leader of a
# coordinator finds every txn of it that still has participant records with one range scan.

PARTICIPANT_PREFIX = "/txn/participant/"
IDX_PARTICIPANTS_BY_COORDINATOR = "idx:participants-by-coordinator"


def participants_prefix(most: int, least: int) -> str:
    """The parent of a txn's participant records (scan_prefix lists exactly its children)."""
    return f"{PARTICIPANT_PREFIX}{txn_key(most, least)}/"


@dataclass(frozen=True, slots=True)
class Participant:
    """A partition the txn produced to (``subscription`` None) or a subscription it acked on."""

    topic: str
    subscription: str | None = None

    def path(self, most: int, least: int) -> str:
        return participants_prefix(most, least) + self.name()

    def name(self) -> str:
        """The record's name under its txn's prefix: ``p:<enc(topic)>`` or ``s:<enc(topic)>:<enc(sub)>``."""
        if self.subscription is None:
            return f"p:{enc(self.topic)}"
        return f"s:{subscription_partition_key(self.topic, self.subscription)}"

    def to_json(self) -> bytes:
        fields = [("topic", _json_string(self.topic))]
        if self.subscription is not None:
            fields.append(("subscription", _json_string(self.subscription)))
        return _json_object(fields)

    @classmethod
    def from_json(cls, raw: bytes) -> Participant:
        try:
            doc = load_json_object(raw)
            return cls(_required_str(doc, "topic"), _str_field(doc, "subscription"))
        except ValueError as exc:
            raise MalformedRecord(f"malformed participant record: {exc}") from exc


def participants_by_coordinator_key(most: int, least: int) -> str:
    return f"{pad(most)}/{pad(least)}"


def participants_by_coordinator_range(most: int | None = None) -> IndexRange:
    """Every participant record of coordinator ``most`` (of every coordinator when None).

    Both bounds have one ``/``, as every key ``<most>/<least>`` does: Oxia orders keys with more ``/``
    after those with fewer (docs/record-layout.md, "Ranges"), so ``pad(0)`` to ``~`` holds none of them."""
    if most is None:
        return f"{pad(0)}/{pad(0)}", f"{INDEX_END}/{INDEX_END}"
    return f"{pad(most)}/", f"{pad(most)}/{INDEX_END}"


def parse_participant_path(path: str) -> tuple[int, int]:
    """``/txn/participant/<most>_<least>/…`` -> (most, least); ValueError for any other key."""
    if not path.startswith(PARTICIPANT_PREFIX):
        raise MalformedRecord(f"not a participant record key: {path!r}")
    key, sep, _ = path[len(PARTICIPANT_PREFIX):].partition("/")
    if not sep:
        raise MalformedRecord(f"not a participant record key: {path!r}")
    return parse_txn_key(key)
