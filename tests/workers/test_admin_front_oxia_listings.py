"""The supervisor's merged listings (tc_server/admin/workers_front.py) on the Oxia store.

With --store oxia every worker reads the one shared store, and a worker's slowTransactions / undelivered
without ?coordinatorId= list every coordinator's txns (Coordinator.open_headers and
AdminRoutes._participant_records scan all coordinators). The supervisor asked every worker and concatenated:
each txn came once per worker (the STAND-IN Oxia; the real one cannot be installed here). On a shared store
worker 0 now lists the slow txns (a review's test), and each worker's undelivered lists its own coordinators' txns,
whose participants' acknowledgements it knows."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tc_server.admin.routes import PREFIX
from tests.support.oxia_standin import standin_oxia_process
from tests.support.routed_txns import coordinator_clients, txns_on_coordinators
from tests.support.server_process import started
from tests.support.stand_in_broker import StandInBroker, acknowledge
from tests.workers.helpers import COORDINATORS, workers_server


@pytest.fixture
def oxia_address(tmp_path: Path) -> Iterator[str]:
    with standin_oxia_process(tmp_path / "oxia" / "standin.log") as address:
        yield address


# The topics of txns left undelivered: one whose broker acknowledges the commit, one whose broker hangs.
TOPIC = "persistent://public/default/t-partition-0"
OTHER = "persistent://public/default/t-partition-1"


def _pages(server, path: str, limit: int) -> list[list[Any]]:
    pages: list[list[Any]] = []
    after: str | None = None
    while True:
        query = f"?limit={limit}" + (f"&after={urllib.parse.quote(after)}" if after else "")
        with urllib.request.urlopen(f"{server.admin_url}{PREFIX}/{path}{query}", timeout=20) as answer:  # noqa: S310
            pages.append(list(json.load(answer)))
            after = answer.headers.get("X-Next-After")
        if after is None or len(pages) > 50:
            return pages


async def test_slow_transactions_pages_are_full_on_the_oxia_store(tmp_path: Path, oxia_address: str) -> None:
    server = started(workers_server(tmp_path, "--oxia-address", oxia_address, store="oxia"))
    try:
        opened = await txns_on_coordinators(server.port, COORDINATORS, [i % COORDINATORS for i in range(10)],
                                            commit=None)
        # One worker's own answer already lists all ten (the shared store): the merge must not count them twice.
        code, own = server.get_json(f"{PREFIX}/slowTransactions/0", worker=0)
        assert code == 200 and len(own) == 10, own
        pages = _pages(server, "slowTransactions/0", limit=3)
        assert [txn for page in pages for txn in page] == [f"({most},{least})" for most, least in sorted(opened)]
        # It was [2, 2, 2, 2, 2, 0]: each txn counted once per worker against ?limit=, and a last empty page.
        assert [len(page) for page in pages] == [3, 3, 3, 1]
    finally:
        assert server.stop() == 0


async def test_undelivered_lists_each_txn_once_on_the_oxia_store(tmp_path: Path, oxia_address: str) -> None:
    """Decided txns whose participants were never told (no --upstream-url: the outbox keeps them)."""
    server = started(workers_server(tmp_path, "--oxia-address", oxia_address, "--participant-wait-s", "0.1",
                                    store="oxia"))
    try:
        decided = []
        async with coordinator_clients(server.port, COORDINATORS) as client_for:
            for tc_id in (0, 1):
                client = await client_for(tc_id)
                opened = await client.new_txn(tc_id=tc_id, ttl_ms=600_000)
                assert opened.error is None
                assert (await client.add_partition(opened.most, opened.least, f"persistent://public/default/t{tc_id}")
                        ).error is None
                assert (await client.end_txn(opened.most, opened.least, commit=True)).error is None
                decided.append(f"({opened.most},{opened.least})")
        # A worker's own port lists its own coordinators' (coordinator 0 is worker 0's), though it reads every
        # coordinator's records from the shared store: it knows the acknowledgements of those alone.
        code, own = server.get_json(f"{PREFIX}/undelivered", worker=0)
        assert code == 200 and [doc["txnId"] for doc in own] == decided[:1], own
        code, merged = server.get_json(f"{PREFIX}/undelivered")
        # It was: each txn listed twice (once per worker).
        assert code == 200 and [doc["txnId"] for doc in merged] == sorted(decided), merged
    finally:
        assert server.stop() == 0


async def test_undelivered_marks_acknowledged_participants_of_every_workers_coordinators(
        tmp_path: Path, oxia_address: str) -> None:
    """Only the worker that leads a coordinator knows which participants' brokers acknowledged its decisions: the
    supervisor listed worker 0's page, so the txns of worker 1's coordinators had no "acknowledged" marks."""
    # The broker acknowledges the commit for TOPIC and never answers for OTHER (a broker hung): each decision stays
    # undelivered with one participant acknowledged.
    broker = await StandInBroker(owns_every_topic=True, end_txn_answer=lambda command: (
        acknowledge(command) if command.topic == TOPIC else None)).start()
    server = started(workers_server(tmp_path, "--oxia-address", oxia_address, "--upstream-url", broker.url,
                                    "--participant-wait-s", "0", store="oxia"))
    try:
        ended = []
        async with coordinator_clients(server.port, COORDINATORS) as client_for:
            for tc_id in range(COORDINATORS):
                client = await client_for(tc_id)
                opened = await client.new_txn(tc_id=tc_id)
                for topic in (TOPIC, OTHER):
                    assert (await client.add_partition(tc_id, opened.least, topic)).error is None
                assert (await client.end_txn(tc_id, opened.least, commit=True)).error is None
                ended.append((tc_id, opened.least))
        expected = [{"topic": TOPIC, "acknowledged": True}, {"topic": OTHER}]
        for _ in range(400):  # until each worker has heard TOPIC's acknowledgements (bounded)
            listed = [doc for page in await asyncio.to_thread(_pages, server, "undelivered", 1) for doc in page]
            if all(sorted(doc["participants"], key=lambda entry: entry["topic"]) == expected for doc in listed):
                break
            await asyncio.sleep(0.05)
        assert [doc["txnId"] for doc in listed] == [f"({most},{least})" for most, least in sorted(ended)]
        for doc in listed:
            assert sorted(doc["participants"], key=lambda entry: entry["topic"]) == expected, doc
        # Two a page: the seams fall between txns of one worker's coordinators and between the workers'.
        pages = await asyncio.to_thread(_pages, server, "undelivered", 2)
        assert [len(page) for page in pages] == [2, 2]
        assert [doc["txnId"] for page in pages for doc in page] == [doc["txnId"] for doc in listed]
    finally:
        assert server.stop() == 0
        broker.stop()
