"""Every transition of the txn state machine (coordinator/state.py)."""

import pytest

from tc_server.coordinator.layout import TxnState
from tc_server.coordinator.state import TRANSITIONS, Decision, Request, decide, target_state

EXPECTED = {
    # (state, request, past deadline): decision
    (TxnState.OPEN, Request.COMMIT, False): Decision.COMMIT,
    (TxnState.OPEN, Request.COMMIT, True): Decision.EXPIRE,
    (TxnState.OPEN, Request.ABORT, False): Decision.ABORT,
    (TxnState.OPEN, Request.ABORT, True): Decision.ABORT,
    (TxnState.OPEN, Request.ADD, False): Decision.ACCEPT,
    (TxnState.OPEN, Request.ADD, True): Decision.EXPIRE,
    (TxnState.OPEN, Request.TIMEOUT, False): Decision.IGNORE,
    (TxnState.OPEN, Request.TIMEOUT, True): Decision.EXPIRE,
}
for ended, other in ((TxnState.COMMITTED, Request.ABORT), (TxnState.ABORTED, Request.COMMIT)):
    same = Request.COMMIT if ended is TxnState.COMMITTED else Request.ABORT
    for late in (False, True):
        EXPECTED[(ended, same, late)] = Decision.ALREADY
        EXPECTED[(ended, other, late)] = Decision.CONFLICT
        EXPECTED[(ended, Request.ADD, late)] = Decision.CONFLICT
        EXPECTED[(ended, Request.TIMEOUT, late)] = Decision.IGNORE


def test_table_is_total():
    assert set(TRANSITIONS) == {(s, r, late) for s in TxnState for r in Request for late in (False, True)}


@pytest.mark.parametrize(("key", "decision"), sorted(EXPECTED.items(), key=str))
def test_transition(key, decision):
    assert decide(*key) is decision


def test_target_states():
    assert target_state(Decision.COMMIT) is TxnState.COMMITTED
    assert target_state(Decision.ABORT) is TxnState.ABORTED
    assert target_state(Decision.EXPIRE) is TxnState.ABORTED
    for decision in (Decision.ACCEPT, Decision.ALREADY, Decision.CONFLICT, Decision.IGNORE):
        with pytest.raises(ValueError):
            target_state(decision)
