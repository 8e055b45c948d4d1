"""What the transaction end-to-end tests share: fresh topics, harness results, and the broker's own view
of open transactions (tests/e2e/test_transactions.py, test_transactions_faults.py).

Every scenario runs against two service URLs: ``tc-server`` (tc-server in front of the real broker, the
coordinator under test) and ``broker`` (the broker itself, with Pulsar's own coordinator). The broker
variant checks the scenario and its assertions against the reference behaviour.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from typing import Any

from tc_server.bench.process import TcServerProcess
from tests.interop.conftest import HarnessRun
from tests.support.pulsar_broker import PulsarBroker, split_topic

# The Java client's operationTimeout in the scenarios: above tc-server's default --participant-wait-s
# (25 s), so an END_TXN that waits for the brokers is not cut short by the client.
OP_TIMEOUT_MS = 30_000
# How long a harness may wait for the next message before it reports what it has.
RECEIVE_TIMEOUT_MS = 30_000
# Bound of one harness run (JVM start, client build, topic lookups on a loaded 2-core machine).
HARNESS_TIMEOUT_S = 240
# Bound for the broker to report no open transaction once every decision was delivered.
SETTLE_TIMEOUT_S = 90.0


def new_topic(broker: PulsarBroker, name: str, partitions: int, namespace: str = "public/default") -> str:
    """A fresh topic in ``namespace`` created through the broker's admin REST, its transaction buffers
    recovered (until then the broker holds back every message of a partition)."""
    topic = f"persistent://{namespace}/{name}-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions)
    broker.wait_partitions_ready(topic, partitions)
    return topic


def result_of(run: HarnessRun, server: TcServerProcess | None) -> dict[str, Any]:
    """The scenario's result line; on a harness failure the message holds its stderr and the server's log."""
    failed = run.events("fatal")
    server_log = "" if server is None else server.log_tail()
    assert not failed, f"{failed[-1]}\n{run.stderr_tail()}\n{server_log}"
    return run.result


def partition_names(topic: str, partitions: int) -> list[str]:
    """The admin names (``name-partition-N``, no ``persistent://``) of a topic's partitions."""
    local = split_topic(topic)[2]
    return [local] if partitions == 0 else [f"{local}-partition-{i}" for i in range(partitions)]


def open_txns(broker: PulsarBroker, topic: str, partitions: int, subscription: str | None = None) -> dict[str, Any]:
    """The broker's count of transactions still open on each partition of ``topic``: the transaction
    buffer's ``ongoingTxnSize`` and, with ``subscription``, the pending-ack store's. Only non-zero
    counts (and failed admin calls) are in the answer, so ``{}`` means none is open."""
    tenant, namespace, _ = split_topic(topic)
    found: dict[str, Any] = {}
    for name in partition_names(topic, partitions):
        paths = {f"buffer {name}": f"/admin/v3/transactions/transactionBufferStats/{tenant}/{namespace}/{name}"}
        if subscription is not None:
            paths[f"pending-ack {name}/{subscription}"] = (
                f"/admin/v3/transactions/pendingAckStats/{tenant}/{namespace}/{name}/{subscription}")
        for what, path in paths.items():
            code, body = broker.get_json(path)
            if code != 200 or not isinstance(body, dict):
                found[what] = (code, body)
            elif body.get("ongoingTxnSize", 0) != 0:
                found[what] = body["ongoingTxnSize"]
    return found


def wait_no_open_txns(broker: PulsarBroker, topics: list[tuple[str, int, str | None]],
                      timeout_s: float = SETTLE_TIMEOUT_S) -> dict[str, Any]:
    """Poll ``open_txns`` of every (topic, partitions, subscription) until none is open or the bound
    passes; returns what is still open (``{}`` when none)."""
    deadline = time.monotonic() + timeout_s
    while True:
        still: dict[str, Any] = {}
        for topic, partitions, subscription in topics:
            still.update(open_txns(broker, topic, partitions, subscription))
        if not still or time.monotonic() > deadline:
            return still
        time.sleep(0.5)


def exactly_once(values: list[str], expected: list[str]) -> dict[str, Any]:
    """What differs between the values received and the ones expected once each: ``{}`` when they agree."""
    counts = Counter(values)
    wanted = set(expected)
    problems: dict[str, Any] = {}
    missing = [v for v in expected if counts[v] == 0]
    duplicated = {v: n for v, n in counts.items() if n > 1}
    unexpected = sorted(set(counts) - wanted)
    if missing:
        problems["missing"] = (len(missing), missing[:20])
    if duplicated:
        problems["duplicated"] = (len(duplicated), dict(list(duplicated.items())[:20]))
    if unexpected:
        problems["unexpected"] = (len(unexpected), unexpected[:20])
    return problems
