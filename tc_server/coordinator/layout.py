"""Where every transaction record lives: keys, partition keys, index names and JSON shapes.

This is the record layout of Pulsar's ``TxnPaths`` (PIP-473, apache/pulsar PR #25792 moved every path
under ``/txn/``), kept in one module so that a broker reading the same store sees the same records.

Header JSON. The P5.1+ ``TxnHeader`` stores ``timeout``/``createdAt`` as Jackson Duration/Instant whose
written form is not verified (see docs/pulsar-protocol.md §5), so we write the verified P2 field names
(``state``, ``timeoutMs``, ``createdMs``, ``finalizedMs``) with integer milliseconds plus ``owner``.
Readers ignore unknown fields, as Pulsar's ObjectMapper does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import quote

TXN_ROOT = "/txn"
HEADER_PREFIX = "/txn/id/"
OP_PREFIX = "/txn/op/"
SEGMENT_EVENTS_PREFIX = "/txn/segment-events/"
SUBSCRIPTION_EVENTS_PREFIX = "/txn/subscription-events/"
TC_SEQ_PREFIX = "/txn/tc-seq/"
LEADER_PREFIX = "/txn/tc/leader/"
# Ephemeral record per live tc-server instance, so instances can split the coordinators evenly
# (ours; Pulsar brokers find their peers through their own registry).
MEMBER_PREFIX = "/txn/tc/members/"
# Pulsar stores the parallelism once (TxnPaths.TXN_TC_PARALLELISM_PATH) but its exact path was not
# found (docs/pulsar-protocol.md §5); this is ours.
PARALLELISM_PATH = "/txn/tc/parallelism"

IDX_TXN_BY_DEADLINE = "idx:txn-by-deadline"
IDX_TXN_BY_FINAL_STATE = "idx:txn-by-final-state"
IDX_OPS_BY_TXN = "idx:ops-by-txn"
IDX_WRITES_BY_SEGMENT = "idx:writes-by-segment"
IDX_ACKS_BY_SEGMENT_SUBSCRIPTION = "idx:acks-by-segment-subscription"

# Index keys are zero-padded to 20 digits so that string order is numeric order.
PAD = 20


class TxnState(Enum):
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
    """Pulsar's ``Codec.encode``: URL-encoding, so a topic name holds no ``/``."""
    return quote(name, safe="")


def txn_key(most: int, least: int) -> str:
    """``TxnIds.toKey``: decimal ``<mostSigBits>_<leastSigBits>``."""
    return f"{most}_{least}"


def parse_txn_key(key: str) -> tuple[int, int]:
    most, sep, least = key.partition("_")
    if not sep:
        raise ValueError(f"not a txn key: {key!r}")
    return int(most), int(least)


def header_path(most: int, least: int) -> str:
    return HEADER_PREFIX + txn_key(most, least)


def parse_header_path(path: str) -> tuple[int, int]:
    """``/txn/id/<most>_<least>`` -> (most, least); ValueError for any other key."""
    if not path.startswith(HEADER_PREFIX):
        raise ValueError(f"not a txn header key: {path!r}")
    return parse_txn_key(path[len(HEADER_PREFIX):])


def op_prefix(most: int, least: int) -> str:
    """Prefix of a txn's op records; the store appends ``-<seq>``. Partition key: the txn key."""
    return OP_PREFIX + txn_key(most, least)


def segment_events_prefix(segment: str) -> str:
    return SEGMENT_EVENTS_PREFIX + enc(segment)


def subscription_partition_key(segment: str, subscription: str) -> str:
    return f"{enc(segment)}:{enc(subscription)}"


def subscription_events_prefix(segment: str, subscription: str) -> str:
    return SUBSCRIPTION_EVENTS_PREFIX + subscription_partition_key(segment, subscription)


def tc_seq_path(tc_id: int) -> str:
    return f"{TC_SEQ_PREFIX}{tc_id}"


def leader_path(tc_id: int) -> str:
    return f"{LEADER_PREFIX}{tc_id}"


def member_path(instance_id: str) -> str:
    return f"{MEMBER_PREFIX}{instance_id}"


def exact_index_range(secondary_key: str) -> tuple[str, str]:
    """The ``[start, end)`` range that matches exactly one secondary key.

    Not ``key + "\\x00"``: Oxia stores an index entry as ``<secondaryKey>\\x01<primaryKey>`` and
    compares the range with that (oxia.md §2), so the end must sort after ``\\x01``. Our secondary
    keys never contain control characters, so nothing else falls in the range.
    """
    return secondary_key, secondary_key + "\x02"


# End of a scan over every deadline / finalization time: sorts after any 20-digit number.
INDEX_END = "~"


def deadline_index_key(deadline_ms: int) -> str:
    return pad(deadline_ms)


def final_state_index_key(state: TxnState, finalized_ms: int) -> str:
    return f"{state.value}:{pad(finalized_ms)}"


@dataclass(frozen=True, slots=True)
class TxnHeader:
    state: TxnState
    created_ms: int
    timeout_ms: int
    finalized_ms: int | None = None
    owner: str | None = None

    @property
    def deadline_ms(self) -> int:
        return self.created_ms + self.timeout_ms

    def index_entries(self) -> dict[str, str]:
        """The secondary-index entries this header carries: the deadline index while OPEN, the
        final-state index once terminal (a put replaces the record's entries, so the move is atomic)."""
        if self.state is TxnState.OPEN:
            return {IDX_TXN_BY_DEADLINE: deadline_index_key(self.deadline_ms)}
        assert self.finalized_ms is not None
        return {IDX_TXN_BY_FINAL_STATE: final_state_index_key(self.state, self.finalized_ms)}

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "version": 1,
            "state": self.state.value,
            "createdMs": self.created_ms,
            "timeoutMs": self.timeout_ms,
        }
        if self.finalized_ms is not None:
            doc["finalizedMs"] = self.finalized_ms
        if self.owner is not None:
            doc["owner"] = self.owner
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> TxnHeader:
        """Raises ValueError (naming the problem) on a record that is not a valid header."""
        try:
            doc = json.loads(raw)
            finalized = doc.get("finalizedMs")
            owner = doc.get("owner")
            return cls(
                state=TxnState(doc["state"]),
                created_ms=int(doc["createdMs"]),
                timeout_ms=int(doc["timeoutMs"]),
                finalized_ms=None if finalized is None else int(finalized),
                owner=None if owner is None else str(owner),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed txn header: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class TxnOp:
    """An op record, written by a participant broker (``TxnOp``)."""

    kind: OpKind
    segment: str
    ledger_id: int
    entry_id: int
    subscription: str | None = None

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "kind": self.kind.value,
            "segment": self.segment,
            "ledgerId": self.ledger_id,
            "entryId": self.entry_id,
        }
        if self.subscription is not None:
            doc["subscription"] = self.subscription
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> TxnOp:
        try:
            doc = json.loads(raw)
            return cls(
                kind=OpKind(doc["kind"]),
                segment=str(doc["segment"]),
                ledger_id=int(doc["ledgerId"]),
                entry_id=int(doc["entryId"]),
                subscription=None if doc.get("subscription") is None else str(doc["subscription"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"malformed txn op: {exc!r}") from exc

    def index_entries(self, most: int, least: int) -> dict[str, str]:
        entries = {IDX_OPS_BY_TXN: txn_key(most, least)}
        if self.kind is OpKind.WRITE:
            entries[IDX_WRITES_BY_SEGMENT] = enc(self.segment)
        elif self.subscription is not None:
            entries[IDX_ACKS_BY_SEGMENT_SUBSCRIPTION] = subscription_partition_key(
                self.segment, self.subscription
            )
        return entries


def event_json(most: int, least: int, decision: TxnState) -> bytes:
    """``TxnEvent``: ``{txnId: key, decision: COMMITTED|ABORTED}``."""
    return json.dumps({"txnId": txn_key(most, least), "decision": decision.value}, separators=(",", ":")).encode()


def tc_seq_json(next_id: int) -> bytes:
    return json.dumps({"next": next_id}, separators=(",", ":")).encode()


def parse_tc_seq(raw: bytes) -> int:
    try:
        return int(json.loads(raw)["next"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed tc-seq record: {exc!r}") from exc
