"""End to end: a real Pulsar 5.0.0-M1 broker's v5 coordinator, leading while tc-server is stopped,
garbage-collects the COMMITTED header of a txn tc-server still owes to a ``persistent://`` participant. The
restarted tc-server delivered that commit as ABORTED (found by a review); it now holds the txn, its decision
unknown, telling its brokers nothing until an operator drops its participants.

Upstream facts relied on (apache/pulsar, pulsar-broker 5.0.0-M1):
* ``TransactionCoordinatorV5.start`` campaigns for every ``/txn/tc/leader/<N>`` and ``sweepGc`` runs on the
  leader of partition 0 every ``transactionCoordinatorScalableTopicsGcIntervalSeconds``; ``gcOneTxn`` deletes a
  terminal header older than ``transactionCoordinatorScalableTopicsGcRetentionSeconds`` (default 900 s) when
  ``listOpsByTxn`` finds no op record, whichever coordinator the txn belongs to. It never looks at
  tc-server's ``/txn/participant/...`` records.
* The hand-over itself is what tests/v5/test_pulsar5_records.py shows (tc-server stops, the broker leads all 16).
Here GC's retention is set to 1 s to stand for the default 900 s passing while the broker leads. The
``persistent://`` topic's broker is a stand-in that owns every topic and records END_TXN_ON_PARTITION (a 4.x
broker's role; tests/participants/test_real_broker.py drives a real one).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest

from tc_server.bench.pulsar_broker import BrokerStartError
from tc_server.client import connect
from tc_server.coordinator import layout
from tc_server.store.oxia import connect as connect_oxia
from tests.support.pulsar_broker import discard
from tests.support.server_process import ServerProcess, started
from tests.support.stand_in_broker import StandInBroker, acknowledge
from tests.v5.broker5 import MAKE_COMMAND, Pulsar5Broker

pytestmark = pytest.mark.timeout(600)

TOPIC = "persistent://public/default/gc-partition-0"


async def _assignments(port: int) -> dict[int, str | None]:
    client = await connect("127.0.0.1", port)
    try:
        update = await asyncio.wait_for(client.watch_assignments(1), 30)
    finally:
        client.close()
    assert update.snapshot is not None
    return {a.tc_id: a.broker_service_url for a in update.snapshot.assignments}


async def test_a_header_the_brokers_gc_deleted_holds_its_txn_and_tells_no_abort(oxia_address: str,
                                                                                tmp_path: Path) -> None:
    server = started(ServerProcess(tmp_path / "tc" / "data", "--oxia-address", oxia_address, "--coordinators", "16",
                                   store="oxia"))
    broker = Pulsar5Broker(tmp_path / "pulsar5", oxia_address, {
        "transactionCoordinatorScalableTopicsGcIntervalSeconds": "1",
        "transactionCoordinatorScalableTopicsGcRetentionSeconds": "1",
    })
    store = await connect_oxia(oxia_address, request_timeout_s=10.0)
    legacy: StandInBroker | None = None
    try:
        client = await connect("127.0.0.1", server.port)
        created = await client.new_txn(0, 120_000)
        assert created.error is None, created
        least = created.least
        added = await client.add_partition(0, least, TOPIC)
        assert added.error is None, added
        ended = await client.end_txn(0, least, True)  # no --upstream-url: decided, answered, owed
        assert ended.error is None, ended
        client.close()
        path, pk = layout.header_path(0, least), layout.txn_key(0, least)
        record = await store.get(path, partition_key=pk)
        assert record is not None and b'"COMMITTED"' in record.value

        try:
            await asyncio.to_thread(broker.start)
        except BrokerStartError as exc:
            pytest.fail(f"the Pulsar 5 broker did not start: {exc}\n(to install it: `{MAKE_COMMAND}`)")
        await asyncio.to_thread(server.stop)  # a rolling restart: the broker's v5 coordinator takes over
        for _ in range(600):
            if await store.get(path, partition_key=pk) is None:
                break
            await asyncio.sleep(0.2)
        gone = await store.get(path, partition_key=pk) is None
        assert gone, "the broker's GC did not delete the header (scenario not reached)"

        await asyncio.to_thread(discard, broker)  # the broker goes; tc-server leads again
        legacy = StandInBroker(owns_every_topic=True, end_txn_answer=acknowledge)
        await legacy.start()  # the persistent:// topic's (4.x-style) broker, reachable now
        server.extra_args += ["--upstream-url", legacy.url]
        await asyncio.to_thread(server.start)
        for _ in range(600):
            if (await _assignments(server.port)).get(0) == server.url:
                break
            await asyncio.sleep(0.2)
        assert (await _assignments(server.port)).get(0) == server.url, "tc-server did not lead coordinator 0 again"
        undelivered: list[dict[str, object]] = []
        for _ in range(300):  # the outbox is scanned right after the election
            with urllib.request.urlopen(f"{server.admin_url}/admin/v3/transactions/undelivered?coordinatorId=0",
                                        timeout=10) as answer:
                undelivered = json.load(answer)
            if undelivered:
                break
            await asyncio.sleep(0.2)
        assert [doc["txnId"] for doc in undelivered] == [f"(0,{least})"], undelivered
        assert undelivered[0]["status"] is None  # its decision is unknown here
        await asyncio.sleep(2)  # and nothing is told meanwhile
        told = [(t.topic, t.action.name) for t in legacy.end_txns if (t.most, t.least) == (0, least)]
        assert told == [], f"the commit of (0,{least}), answered success to the client, was told {told}"
        held = [json.loads(line) for line in server.log_path.read_text(errors="replace").splitlines()
                if "participant records without a header" in line]
        assert held and held[0]["level"] == "error" and held[0]["txn"] == f"(0,{least})", held
    finally:
        if legacy is not None:
            legacy.stop()
        discard(broker)
        server.kill()
        await store.close()
