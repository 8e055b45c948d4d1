"""What the coordinator's own LOOKUP answers (server/dispatch.py Dispatcher.lookup)."""

from __future__ import annotations

from types import SimpleNamespace

from tc_server.metrics import Metrics
from tc_server.server.dispatch import Dispatcher
from tc_server.wire import Lookup, LookupType, ServerError

ASSIGN = "persistent://pulsar/system/transaction_coordinator_assign-partition-3"


def test_a_coordinator_without_a_leader_is_answered_metadata_error() -> None:
    # ServiceNotReady makes the Java client (4.2.4 ClientCnx.checkServerError) close the whole connection, and
    # with it every coordinator handler Ready on it; each failure doubled a handler's reconnect backoff (100 ms
    # to 60 s, ConnectionHandler.reconnectLater). In the moments of a hand-over during a rolling restart that
    # stalled coordinators for tens of seconds (a review).
    coordinator = SimpleNamespace(num_partitions=16, leader_url=lambda tc_id: None, tls_url=lambda url: None)
    dispatcher = Dispatcher(coordinator, Metrics("discovery"), request_timeout_s=10.0)  # type: ignore[arg-type]
    answer = dispatcher.lookup(Lookup(topic=ASSIGN, request_id=7))
    assert (answer.response, answer.error) == (LookupType.FAILED, ServerError.MetadataError), answer
    assert answer.message == "transaction coordinator 3 has no leader yet; retry"
