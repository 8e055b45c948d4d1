"""Open transactions per coordinator are capped (issue 15: 500,000 open took ~300 MB): Pulsar's
maxActiveTransactionsPerCoordinator. Past it NEW_TXN is answered NotAllowedError naming the limit (the
Java client does not retry it), other coordinators are unaffected, and ending one makes room again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tc_server.app import App, start_app
from tc_server.client import TcClient, connect
from tc_server.config import Settings
from tc_server.wire import Lookup, LookupResponse, LookupType, ServerError
from tests.support.stand_in_broker import StandInBroker

from .conftest import BASE

LIMIT = 5


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return replace(BASE, data_dir=str(tmp_path / "data"), max_active_transactions_per_coordinator=LIMIT)


async def test_past_the_limit_new_txn_is_not_allowed_until_one_ends(app: App, client: TcClient) -> None:
    opened = [await client.new_txn(tc_id=7) for _ in range(LIMIT)]
    assert [t.error for t in opened] == [None] * LIMIT
    refused = await client.new_txn(tc_id=7)
    assert refused.error is ServerError.NotAllowedError and refused.most == 7
    assert "max-active-transactions-per-coordinator" in (refused.message or "")
    assert (await client.new_txn(tc_id=8)).error is None  # another coordinator has its own budget
    assert (await client.end_txn(7, opened[0].least, commit=True)).error is None
    assert (await client.new_txn(tc_id=7)).error is None


def test_the_default_is_a_limit() -> None:
    assert Settings().max_active_transactions_per_coordinator > 0


async def test_decisions_its_brokers_have_not_acknowledged_count_toward_the_limit(tmp_path: Path) -> None:
    # A decided txn stays until its participants' brokers acknowledge (~6 KB each), and only open ones were
    # counted: a client naming a topic no broker knows in every txn grew them without bound (a review: 30,000
    # such commits, +164 MiB). Pulsar's coordinator counts a txn until its brokers acknowledged, too.
    def refuse(lookup: Lookup) -> LookupResponse:
        return LookupResponse(lookup.request_id, LookupType.FAILED, error=ServerError.TopicNotFound,
                              message="no such topic")

    broker = await StandInBroker(refuse).start()
    app = await start_app(replace(BASE, data_dir=str(tmp_path / "data"), max_active_transactions_per_coordinator=LIMIT,
                                  upstream_url=broker.url, participant_wait_s=0))
    client = await connect("127.0.0.1", app.listeners[0].port)
    try:
        for _ in range(LIMIT):
            opened = await client.new_txn(tc_id=7)
            ghost = f"persistent://ghost/ns/t-{opened.least}"
            assert (await client.add_partition(7, opened.least, ghost)).error is None
            assert (await client.end_txn(7, opened.least, commit=True)).error is None
        assert len(app.coordinator.partition(7).undelivered()) == LIMIT
        refused = await client.new_txn(tc_id=7)
        assert refused.error is ServerError.NotAllowedError
        assert f"0 open transactions and {LIMIT} decided ones" in (refused.message or "")
        assert (await client.new_txn(tc_id=8)).error is None
    finally:
        client.close()
        await app.stop()
        broker.stop()
