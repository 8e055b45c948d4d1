"""Input that used to escape a frame handler (issue 15, "Unhandled input"): each gets a typed answer,
the connection stays up, nothing reaches the event loop's exception handler, nothing is logged as an
error."""

from __future__ import annotations

from typing import Any

import pytest

from tc_server.app import App
from tc_server.client import TcClient
from tc_server.server.discovery import ASSIGN_TOPIC
from tc_server.wire import ServerError

from .conftest import tracebacks

# Partition suffixes that are no partition number: a superscript two passes str.isdigit() but not
# int(); 4,301 digits pass isdigit() but int() refuses them (Python's int_max_str_digits); 4,300
# digits convert, to a number no coordinator has; other Unicode digits int() would accept.
ODD_SUFFIXES = ["\u00b2", "9" * 4301, "9" * 4300, "\u0661", "\uff11", "1\u00b2", "", "-1", "+1", " 1"]


async def still_serves(client: TcClient) -> None:
    answer = await client.new_txn(tc_id=3)
    assert answer.error is None
    assert (await client.end_txn(3, answer.least, commit=False)).error is None


@pytest.mark.parametrize("suffix", ODD_SUFFIXES, ids=lambda s: repr(s)[:12])
async def test_lookup_of_an_odd_partition_number_is_topic_not_found(
        app: App, client: TcClient, suffix: str, server_log: list[dict[str, Any]],
        loop_errors: list[dict[str, Any]]) -> None:
    answer = await client.lookup(f"{ASSIGN_TOPIC}-partition-{suffix}", authoritative=True)
    assert answer.error is ServerError.TopicNotFound
    await still_serves(client)
    assert loop_errors == []
    assert tracebacks(server_log) == []


@pytest.mark.parametrize("suffix", ODD_SUFFIXES, ids=lambda s: repr(s)[:12])
async def test_partitioned_metadata_of_an_odd_partition_number_is_answered(
        app: App, client: TcClient, suffix: str, server_log: list[dict[str, Any]],
        loop_errors: list[dict[str, Any]]) -> None:
    answer = await client.partitioned_metadata(f"{ASSIGN_TOPIC}-partition-{suffix}")
    assert answer.error is ServerError.TopicNotFound
    await still_serves(client)
    assert loop_errors == []
    assert tracebacks(server_log) == []
