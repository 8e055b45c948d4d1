"""Damaged stored records (issue 15): a txn request that meets one is answered MetadataError, naming
the record but never quoting its stored bytes, and the connection keeps serving."""

from __future__ import annotations

import asyncio
from typing import Any

from tc_server.app import App
from tc_server.client import TcClient
from tc_server.coordinator import layout
from tc_server.wire import ServerError

from .conftest import tracebacks

# Bounds a request that would otherwise never be answered (the failure this file guards against).
ANSWER_BOUND_S = 10.0


async def test_a_reserved_id_beyond_64_bits_is_metadata_error_not_silence(
        app: App, client: TcClient, server_log: list[dict[str, Any]], loop_errors: list[dict[str, Any]]) -> None:
    # /txn/tc-seq/5 says the next id is 2^64: no txn id of the wire (uint64) or of Pulsar (a Java
    # long) can be that. It used to create a header under that id, then fail to encode the answer.
    await app.store.put(layout.tc_seq_path(5), layout.tc_seq_json(2**64))
    answer = await client.request(_new_txn(client, 5), timeout_s=ANSWER_BOUND_S)
    assert answer.error is ServerError.MetadataError, answer
    assert answer.most == 5
    assert "18446744073709551616" not in (answer.message or "")
    good = await client.new_txn(tc_id=6)
    assert good.error is None
    assert loop_errors == []
    assert tracebacks(server_log) == []


async def test_a_damaged_header_is_metadata_error_without_its_bytes(
        app: App, client: TcClient, server_log: list[dict[str, Any]], loop_errors: list[dict[str, Any]]) -> None:
    opened = await client.new_txn(tc_id=2)
    assert opened.error is None
    path = layout.header_path(2, opened.least)
    stored = await app.store.get(path)
    assert stored is not None
    # A header another writer damaged (a state no Pulsar writes): the partition's cached copy is
    # stale, so its CAS fails and the header is read again from the store.
    damaged = stored.value.replace(b'"OPEN"', b'"not-a-state <script>"')
    assert damaged != stored.value
    await app.store.put(path, damaged, partition_key=layout.txn_key(2, opened.least))
    answer = await asyncio.wait_for(client.end_txn(2, opened.least, commit=True), ANSWER_BOUND_S)
    assert answer.error is ServerError.MetadataError, answer
    assert "not-a-state" not in (answer.message or "") and "script" not in (answer.message or "")
    assert f"(2,{opened.least})" in (answer.message or "")
    assert (await client.new_txn(tc_id=2)).error is None
    assert loop_errors == []
    assert tracebacks(server_log) == []


def _new_txn(client: TcClient, tc_id: int) -> Any:
    from tc_server.wire import NewTxn

    return NewTxn(client.next_request_id(), 0, tc_id)


async def test_a_foreign_leader_key_does_not_break_the_leader_watch(
        app: App, client: TcClient, server_log: list[dict[str, Any]], loop_errors: list[dict[str, Any]]) -> None:
    # "²" passes str.isdigit(); int() refuses it. The watch used to fail on it (a traceback) and
    # stop watching until its next periodic retry.
    await app.store.put(layout.LEADER_PREFIX + "\u00b2", b"{}")
    await app.store.put(layout.LEADER_PREFIX + "99999999999999999999", b"{}")
    for _ in range(20):  # let the watch see both notifications
        await asyncio.sleep(0.01)
    assert (await client.new_txn(tc_id=1)).error is None
    assert loop_errors == []
    assert tracebacks(server_log) == []
