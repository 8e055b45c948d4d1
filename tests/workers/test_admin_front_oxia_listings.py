"""The supervisor's merged listings (tc_server/admin/workers_front.py) on the Oxia store.

With --store oxia every worker reads the one shared store, and a worker's slowTransactions / undelivered
without ?coordinatorId= list every coordinator's txns (Coordinator.open_headers and
AdminRoutes._participant_records scan all coordinators). The supervisor asked every worker and concatenated:
each txn came once per worker (the STAND-IN Oxia; the real one cannot be installed here). On a shared store
worker 0 now lists them all (a review's test)."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tc_server.admin.routes import PREFIX
from tests.support.oxia_standin import standin_oxia_process
from tests.support.routed_txns import txns_on_coordinators
from tests.support.server_process import started
from tests.workers.helpers import COORDINATORS, workers_server


@pytest.fixture
def oxia_address(tmp_path: Path) -> Iterator[str]:
    with standin_oxia_process(tmp_path / "oxia" / "standin.log") as address:
        yield address


def _pages(server, path: str, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
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
    from tc_server.client import connect_coordinators

    server = started(workers_server(tmp_path, "--oxia-address", oxia_address, "--participant-wait-s", "0.1",
                                    store="oxia"))
    try:
        routed = await connect_coordinators("127.0.0.1", server.port, COORDINATORS)
        decided = []
        try:
            for tc_id in (0, 1):
                client = routed[tc_id]
                assert (await client.tc_client_connect(tc_id)).error is None
                opened = await client.new_txn(tc_id=tc_id, ttl_ms=600_000)
                assert opened.error is None
                assert (await client.add_partition(opened.most, opened.least, f"persistent://public/default/t{tc_id}")
                        ).error is None
                assert (await client.end_txn(opened.most, opened.least, commit=True)).error is None
                decided.append(f"({opened.most},{opened.least})")
        finally:
            for client in {id(c): c for c in routed}.values():
                client.close()
        code, own = server.get_json(f"{PREFIX}/undelivered", worker=0)
        assert code == 200 and sorted(doc["txnId"] for doc in own) == sorted(decided), own
        code, merged = server.get_json(f"{PREFIX}/undelivered")
        # It was: each txn listed twice (once per worker).
        assert code == 200 and [doc["txnId"] for doc in merged] == sorted(decided), merged
    finally:
        assert server.stop() == 0
