"""Open transactions per coordinator are capped (issue 15: 500,000 open took ~300 MB): Pulsar's
maxActiveTransactionsPerCoordinator. Past it NEW_TXN is answered NotAllowedError naming the limit (the
Java client does not retry it), other coordinators are unaffected, and ending one makes room again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tc_server.app import App
from tc_server.client import TcClient
from tc_server.config import Settings
from tc_server.wire import ServerError

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
