"""``tc-server run --workers 2 --upstream-url <broker>`` as the one service URL of the stock Java client, in
front of a real Pulsar 4.2.4 broker (the session's ``pulsar_broker``): forwarded lookups are answered on
every worker, and a consume-transform-produce worker's transactions, spread over the coordinators of
both workers, each reach the broker as the decision of the worker that leads its coordinator
(END_TXN_ON_PARTITION / _SUBSCRIPTION, docs/participants.md): every input is in the output exactly once
and the broker holds no open transaction afterwards.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tc_server.client import connect
from tc_server.wire import LookupType
from tests.e2e.txn_support import (
    HARNESS_TIMEOUT_S,
    OP_TIMEOUT_MS,
    exactly_once,
    new_topic,
    result_of,
    wait_no_open_txns,
)
from tests.interop.conftest import Harness
from tests.support.front_door import start_front_door
from tests.support.pulsar_broker import PulsarBroker

pytestmark = [pytest.mark.java, pytest.mark.slow, pytest.mark.timeout(600)]

WORKERS = 2
PARTITIONS = 4
INPUTS = 100
SUBSCRIPTION = "tc-e2e"  # the ctp scenario's subscription (TxnScenarios.SUBSCRIPTION)


async def test_ctp_through_two_workers_in_front_of_a_broker(java_harness: Harness, pulsar_broker: PulsarBroker,
                                                            tmp_path: Path) -> None:
    server = start_front_door(pulsar_broker.url, tmp_path, "--workers", str(WORKERS))
    try:
        source = new_topic(pulsar_broker, "workers-in", PARTITIONS)
        sink = new_topic(pulsar_broker, "workers-out", PARTITIONS)
        # A plain topic's LOOKUP is forwarded to the broker by every worker: at each worker's own port
        # and at the shared one.
        for port in (server.port, *(server.port + 1 + k for k in range(WORKERS))):
            client = await connect("127.0.0.1", port)
            answer = await client.lookup(source + "-partition-0", authoritative=True)
            client.close()
            assert answer.error is None and answer.response is LookupType.CONNECT, (port, answer)

        stop = tmp_path / "stop-ctp"
        stop.touch()  # the worker still processes every input first ("stops when ... the input is drained")
        run = java_harness.run("ctp", timeout_s=HARNESS_TIMEOUT_S, service_url=server.url, input=source,
                               output=sink, until_file=stop, fill=INPUTS, batch=10, op_timeout_ms=OP_TIMEOUT_MS)
        assert run.returncode == 0, run.stderr_tail()
        committed = run.events("committed")
        assert {line["most"] % WORKERS for line in committed} == {0, 1}, committed
        drained = result_of(java_harness.run("drain", timeout_s=HARNESS_TIMEOUT_S, service_url=server.url,
                                             topic=sink, op_timeout_ms=OP_TIMEOUT_MS,
                                             receive_timeout_ms=60_000), server)
        assert sorted(drained["markers_seen"]) == sorted(drained["markers_sent"]), drained["markers_seen"]
        assert exactly_once(drained["values"], [f"out:in-{n}" for n in range(INPUTS)]) == {}
        assert wait_no_open_txns(pulsar_broker, [(source, PARTITIONS, SUBSCRIPTION), (sink, PARTITIONS, None)]) == {}
    finally:
        assert server.stop() == 0
