"""What the Java harness's ``txn-ack`` scenario (tests/interop/java, TxnScenarios.txnAck) must show once its txn
ended: the acks made in the txn applied by the broker on a commit, the messages put back on an abort."""

from __future__ import annotations

from typing import Any


def assert_acks_applied(result: dict[str, Any], action: str, count: int) -> None:
    """``result`` of ``txn-ack`` with ``count`` messages ``m-0``... acked in a txn ended by ``action``."""
    if action == "commit":
        # END_TXN_ON_SUBSCRIPTION(COMMIT) applied the acks: a new consumer gets nothing before the marker.
        assert result["redelivered"] == [], result
        assert result["marker_seen"] is True and result["before_marker"] == [], result
        return
    # END_TXN_ON_SUBSCRIPTION(ABORT) put the messages back: the same consumer got all of them again.
    assert sorted(result["redelivered"]) == sorted(f"m-{i}" for i in range(count)), result
    # The harness then acks them again outside any transaction. The broker may still hand some of those to
    # the next consumer (at-least-once redelivery right after an abort: CI saw m-1 and m-5 once on 2026-11-24,
    # seven of ten under load on 2026-12-01), but nothing else may come before the marker.
    assert result["marker_seen"] is True, result
    assert set(result["before_marker"]) <= set(result["redelivered"]), result
