"""The transaction state machine: one table holds every rule (docs/semantics.md §2).

A request meets a header in some state and gets exactly one :class:`Decision`. The table is total:
every (state, request) pair is listed, and a test walks all of them.
"""

from __future__ import annotations

from enum import Enum

from tc_server.coordinator.layout import TxnState


class Request(Enum):
    # The identity hash, as Enum's equality is identity: Enum.__hash__ is a Python-level function (the
    # name's hash), and decide() hashes a Request and a TxnState per END_TXN (issue 13).
    __hash__ = object.__hash__

    COMMIT = "commit"
    ABORT = "abort"
    ADD = "add"  # ADD_PARTITION_TO_TXN / ADD_SUBSCRIPTION_TO_TXN
    TIMEOUT = "timeout"  # the sweep found the txn past its deadline


class Decision(Enum):
    ACCEPT = "accept"  # OPEN and in time: ADD succeeds
    COMMIT = "commit"  # CAS OPEN -> COMMITTED, then publish events
    ABORT = "abort"  # CAS OPEN -> ABORTED, then publish events
    EXPIRE = "expire"  # CAS OPEN -> ABORTED because the deadline passed; the request then fails "timed out"
    ALREADY = "already"  # already in the requested terminal state: succeed again (re-publish events)
    CONFLICT = "conflict"  # in the other terminal state (or ended, for ADD): InvalidTxnStatus
    IGNORE = "ignore"  # nothing to do (a timeout that found the txn already ended)


# (state, request, past_deadline) -> decision
TRANSITIONS: dict[tuple[TxnState, Request, bool], Decision] = {
    (TxnState.OPEN, Request.COMMIT, False): Decision.COMMIT,
    (TxnState.OPEN, Request.COMMIT, True): Decision.EXPIRE,
    # An abort is what the timeout would do anyway: honour it as a plain abort.
    (TxnState.OPEN, Request.ABORT, False): Decision.ABORT,
    (TxnState.OPEN, Request.ABORT, True): Decision.ABORT,
    (TxnState.OPEN, Request.ADD, False): Decision.ACCEPT,
    (TxnState.OPEN, Request.ADD, True): Decision.EXPIRE,
    (TxnState.OPEN, Request.TIMEOUT, False): Decision.IGNORE,
    (TxnState.OPEN, Request.TIMEOUT, True): Decision.EXPIRE,
    (TxnState.COMMITTED, Request.COMMIT, False): Decision.ALREADY,
    (TxnState.COMMITTED, Request.COMMIT, True): Decision.ALREADY,
    (TxnState.COMMITTED, Request.ABORT, False): Decision.CONFLICT,
    (TxnState.COMMITTED, Request.ABORT, True): Decision.CONFLICT,
    (TxnState.COMMITTED, Request.ADD, False): Decision.CONFLICT,
    (TxnState.COMMITTED, Request.ADD, True): Decision.CONFLICT,
    (TxnState.COMMITTED, Request.TIMEOUT, False): Decision.IGNORE,
    (TxnState.COMMITTED, Request.TIMEOUT, True): Decision.IGNORE,
    (TxnState.ABORTED, Request.COMMIT, False): Decision.CONFLICT,
    (TxnState.ABORTED, Request.COMMIT, True): Decision.CONFLICT,
    (TxnState.ABORTED, Request.ABORT, False): Decision.ALREADY,
    (TxnState.ABORTED, Request.ABORT, True): Decision.ALREADY,
    (TxnState.ABORTED, Request.ADD, False): Decision.CONFLICT,
    (TxnState.ABORTED, Request.ADD, True): Decision.CONFLICT,
    (TxnState.ABORTED, Request.TIMEOUT, False): Decision.IGNORE,
    (TxnState.ABORTED, Request.TIMEOUT, True): Decision.IGNORE,
}


def decide(state: TxnState, request: Request, past_deadline: bool) -> Decision:
    return TRANSITIONS[(state, request, past_deadline)]


def target_state(decision: Decision) -> TxnState:
    """The state a CAS decision writes."""
    if decision is Decision.COMMIT:
        return TxnState.COMMITTED
    if decision in (Decision.ABORT, Decision.EXPIRE):
        return TxnState.ABORTED
    raise ValueError(f"{decision} writes no state")
