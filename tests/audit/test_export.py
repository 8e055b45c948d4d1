"""Exporting a store into a snapshot: every record family, malformed records set aside, then audited."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tc_server.audit.export import RejectedRecord, export_snapshot, main, parse_header, parse_op, parse_tc_seq
from tc_server.audit.job import validate_local_snapshot
from tc_server.audit.schema import HEADERS_SCHEMA, MAX_TIME_MS, OPS_SCHEMA, TC_SEQ_SCHEMA
from tc_server.coordinator import layout
from tc_server.coordinator.layout import OpKind, TxnHeader, TxnOp, TxnState
from tc_server.store.api import Record
from tc_server.store.embedded import EmbeddedStore
from tc_server.store.memory import MemoryStore


async def _fill(store: MemoryStore) -> None:
    headers = {
        (0, 0): TxnHeader(TxnState.COMMITTED, created_ms=1_000, timeout_ms=60_000, finalized_ms=1_500, owner="alice"),
        (0, 1): TxnHeader(TxnState.OPEN, created_ms=2_000, timeout_ms=60_000),
        (3, 7): TxnHeader(TxnState.ABORTED, created_ms=3_000, timeout_ms=10_000, finalized_ms=13_000),
    }
    for (most, least), header in headers.items():
        await store.put(layout.header_path(most, least), header.to_json())
    # Kept verbatim though TxnHeader would refuse it: finding it is the audit's job.
    await store.put(layout.header_path(3, 8), b'{"state":"COMMITTING","createdMs":5,"timeoutMs":1}')
    ops = [
        ((0, 0), TxnOp(OpKind.WRITE, "persistent://t/ns/a/seg-0", ledger_id=10, entry_id=1)),
        ((0, 0), TxnOp(OpKind.ACK, "persistent://t/ns/a/seg-0", ledger_id=10, entry_id=2, subscription="s1")),
        ((0, 1), TxnOp(OpKind.WRITE, "persistent://t/ns/b/seg-0", ledger_id=20, entry_id=5)),
    ]
    for (most, least), op in ops:
        await store.put_sequential(
            layout.op_prefix(most, least), op.to_json(), partition_key=layout.txn_key(most, least)
        )
    await store.put(layout.tc_seq_path(0), layout.tc_seq_json(100))
    await store.put(layout.tc_seq_path(3), layout.tc_seq_json(50))
    # Malformed, one of each family; none may stop the export.
    await store.put(layout.header_path(0, 9), b"{not json")
    await store.put(layout.HEADER_PREFIX + "garbage", b'{"state":"OPEN","createdMs":1,"timeoutMs":1}')
    await store.put(layout.OP_PREFIX + "0_0-12", TxnOp(OpKind.WRITE, "x", 1, 1).to_json())
    await store.put(layout.OP_PREFIX + "0_1-00000000000000000009", b'{"kind":"READ","segment":"x"}')
    await store.put(layout.tc_seq_path(5), b'{"next":"many"}')


async def test_export_memory_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = MemoryStore()
    await _fill(store)
    out = tmp_path / "snap"
    counts = await export_snapshot(store, out, source="memory", show_progress=True, batch_rows=2)
    await store.close()
    assert counts == {"headers": 4, "ops": 3, "tc_seq": 2, "rejects": 5}
    assert "\rexport: ops 3  headers 4  tc-seq 2  rejects 5" in capsys.readouterr().err

    doc = validate_local_snapshot(out)
    assert doc["source"] == "memory"
    assert doc["row_counts"] == {"headers": 4, "ops": 3, "tc_seq": 2}
    assert doc["rejects"] == {"headers": 2, "ops": 2, "tc_seq": 1}

    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert sorted((r["table"], r["key"]) for r in rejects) == [
        ("headers", "/txn/id/0_9"),
        ("headers", "/txn/id/garbage"),
        ("ops", "/txn/op/0_0-12"),
        ("ops", "/txn/op/0_1-00000000000000000009"),
        ("tc_seq", "/txn/tc-seq/5"),
    ]
    assert all(r["reason"] for r in rejects)

    headers = {(r["txn_most"], r["txn_least"]): r for r in pq.read_table(out / "headers").to_pylist()}
    assert set(headers) == {(0, 0), (0, 1), (3, 7), (3, 8)}
    assert headers[(0, 0)] | {"version": 0} == {
        "txn_most": 0, "txn_least": 0, "coordinator_id": 0, "state": "COMMITTED", "created_ms": 1_000,
        "timeout_ms": 60_000, "deadline_ms": 61_000, "finalized_ms": 1_500, "owner": "alice", "version": 0,
    }
    assert headers[(3, 8)]["state"] == "COMMITTING"
    assert headers[(0, 1)]["finalized_ms"] is None and headers[(0, 1)]["owner"] is None

    ops = sorted(pq.read_table(out / "ops").to_pylist(), key=lambda r: (r["txn_least"], r["seq"]))
    assert [(r["txn_most"], r["txn_least"], r["seq"], r["kind"], r["subscription"]) for r in ops] == [
        (0, 0, 1, "WRITE", None),
        (0, 0, 2, "ACK", "s1"),
        (0, 1, 1, "WRITE", None),
    ]
    assert all(r["created_ms"] > 0 for r in ops)  # the memory store records create times
    assert pq.ParquetFile(out / "ops" / "part-00000.parquet").metadata.num_row_groups == 2
    assert sorted(pq.read_table(out / "tc_seq").to_pylist(), key=lambda r: r["coordinator_id"]) == [
        {"coordinator_id": 0, "next": 100},
        {"coordinator_id": 3, "next": 50},
    ]


async def test_export_refuses_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "keep").write_text("x")
    with pytest.raises(FileExistsError):
        await export_snapshot(MemoryStore(), tmp_path, source="memory")


async def test_empty_store(tmp_path: Path) -> None:
    counts = await export_snapshot(MemoryStore(), tmp_path / "snap", source="memory", show_progress=False)
    assert counts == {"headers": 0, "ops": 0, "tc_seq": 0, "rejects": 0}
    validate_local_snapshot(tmp_path / "snap")
    assert not (tmp_path / "snap" / "rejects.jsonl").exists()


def test_both_header_forms_give_the_same_row() -> None:
    # Pulsar 5's own coordinator writes nanosecond decimal seconds (docs/record-layout.md); tc-server's
    # earlier form held integer ms. Both are exported, in ms (floored as Java's toEpochMilli).
    pulsar = (b'{"state":"COMMITTED","timeout":60.000000000,"createdAt":1795447209.230663502,'
              b'"finalizedAt":1795447210.114201337,"owner":"app-1"}')
    earlier = (b'{"version":1,"state":"COMMITTED","createdMs":1795447209230,"timeoutMs":60000,'
               b'"finalizedMs":1795447210114,"owner":"app-1"}')
    rows = [parse_header(Record(key="/txn/id/3_17", value=raw, version=4)) for raw in (pulsar, earlier)]
    assert rows[0] == rows[1] == {
        "txn_most": 3, "txn_least": 17, "coordinator_id": 3, "state": "COMMITTED", "created_ms": 1795447209230,
        "timeout_ms": 60000, "deadline_ms": 1795447269230, "finalized_ms": 1795447210114, "owner": "app-1",
        "version": 4,
    }


def test_pulsar_op_record_is_exported() -> None:
    raw = (b'{"kind":"ACK","segment":"segment://public/default/orders/0","subscription":"my sub",'
           b'"ledgerId":12,"entryId":9,"cumulative":true}')
    row = parse_op(Record(key="/txn/op/3_17-00000000000000000002", value=raw, version=1, created_ms=7))
    assert row == {
        "txn_most": 3, "txn_least": 17, "seq": 2, "kind": "ACK", "segment": "segment://public/default/orders/0",
        "subscription": "my sub", "ledger_id": 12, "entry_id": 9, "created_ms": 7,
    }


def test_an_op_whose_store_create_time_is_past_year_9999_is_one_reject() -> None:
    # It was exported as it was, and the job then refused the whole snapshot (exit 2, no finding reported) for a
    # value its format does not allow (a review).
    raw = b'{"kind":"WRITE","segment":"segment://public/default/orders/0","ledgerId":1,"entryId":2}'
    key = "/txn/op/3_17-00000000000000000002"
    with pytest.raises(RejectedRecord, match="create time out of range"):
        parse_op(Record(key=key, value=raw, version=1, created_ms=MAX_TIME_MS + 1))
    assert parse_op(Record(key=key, value=raw, version=1, created_ms=MAX_TIME_MS))["created_ms"] == MAX_TIME_MS


def test_module_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `python -m tc_server.audit.export` is `tc-server export`: here on an (empty) embedded store.
    asyncio.run(_closed_embedded_store(tmp_path / "data"))
    args = ["--store", "embedded", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "snap")]
    assert main(args) == 0
    assert "exported 0 headers" in capsys.readouterr().out
    assert main(args) == 2  # the snapshot is there already


async def _closed_embedded_store(data: Path) -> None:
    await (await EmbeddedStore.open(data)).close()


@pytest.mark.spark
@pytest.mark.timeout(600)
async def test_audit_of_export(spark: Any, tmp_path: Path) -> None:
    from tc_server.audit import cli

    store = MemoryStore()
    await _fill(store)
    await export_snapshot(store, tmp_path / "snap", source="memory", show_progress=False)
    # Audited as of the headers' own times (1970, so nothing is overdue or past retention). The ops'
    # create times come from the store (now): txn 0_0's two ops were written after its 1970 commit.
    code = cli.main(["--input", str(tmp_path / "snap"), "--output", str(tmp_path / "out"), "--now-ms", "20000"])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert code == 1
    assert summary["violations"]["illegal_headers"] == 1  # COMMITTING
    assert summary["export_rejects"] == 5
    assert summary["counts_by_state"] == {"OPEN": 1, "COMMITTED": 1, "ABORTED": 1, "COMMITTING": 1}
    assert summary["violations"]["late_ops"] == 2
    assert sum(summary["violations"].values()) == 3


@pytest.mark.spark
@pytest.mark.timeout(600)
async def test_a_published_decision_its_header_contradicts_is_exported_and_reported(spark: Any, tmp_path: Path) -> None:
    # The header says ABORTED, the event a Pulsar 5 participant read says COMMITTED. Before, the export read
    # no event stream and the audit passed it. Events in both streams' key forms are exported; a malformed
    # one is a reject.
    from tc_server.audit import cli

    store = MemoryStore()
    header = TxnHeader(TxnState.ABORTED, created_ms=5_000, timeout_ms=60_000, finalized_ms=6_000).to_json()
    await store.put(layout.header_path(0, 1), header, partition_key="0_1")
    await store.put(layout.tc_seq_path(0), layout.tc_seq_json(100))
    segment = "segment://public/default/orders/0"
    await store.put_sequential(layout.segment_events_prefix(segment), layout.event_json(0, 1, TxnState.COMMITTED),
                               partition_key=layout.enc(segment))
    await store.put_sequential(layout.subscription_events_prefix(segment, "sub"),
                               layout.event_json(0, 1, TxnState.ABORTED),
                               partition_key=layout.subscription_partition_key(segment, "sub"))
    await store.put_sequential(layout.segment_events_prefix(segment), b'{"txnId":7}', partition_key=layout.enc(segment))
    await export_snapshot(store, tmp_path / "snap", source="memory", show_progress=False)
    await store.close()
    events = pq.read_table(tmp_path / "snap" / "events").to_pylist()
    assert sorted(row["decision"] for row in events) == ["ABORTED", "COMMITTED"]
    assert {row["stream"] for row in events} == {layout.segment_events_prefix(segment),
                                                 layout.subscription_events_prefix(segment, "sub")}
    code = cli.main(["--input", str(tmp_path / "snap"), "--output", str(tmp_path / "out"), "--now-ms", "10000"])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert code == 1 and summary["violations"]["decision_mismatch"] == 1, summary["violations"]
    assert summary["export_rejects"] == 1


# Keys shaped like the real ones, with any value: a parser may only accept or raise RejectedRecord.
_KEYS = st.one_of(
    st.builds(lambda a, b: f"{layout.HEADER_PREFIX}{a}_{b}", st.integers(-5, 2**40), st.integers(-5, 2**70)),
    st.builds(lambda a, b, s: f"{layout.OP_PREFIX}{a}_{b}-{s}", st.integers(-5, 2**40), st.integers(-5, 2**70),
              st.text("0123456789²", min_size=18, max_size=22)),
    st.text(max_size=30).map(lambda t: layout.TC_SEQ_PREFIX + t),
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=8,
)
_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        k: _JSON
        for k in ("state", "createdMs", "timeoutMs", "finalizedMs", "createdAt", "timeout", "finalizedAt",
                  "owner", "kind", "segment", "ledgerId", "entryId", "subscription", "cumulative", "next")
    },
)


@settings(max_examples=300, deadline=None)
@given(key=_KEYS, value=st.one_of(st.binary(max_size=40), _FIELDS.map(lambda d: json.dumps(d).encode())))
def test_parsers_never_crash(key: str, value: bytes) -> None:
    record = Record(key=key, value=value, version=1, created_ms=5)
    parser = (
        parse_header if key.startswith(layout.HEADER_PREFIX)
        else parse_op if key.startswith(layout.OP_PREFIX)
        else parse_tc_seq
    )
    try:
        row = parser(record)
    except RejectedRecord:
        return
    # Whatever is accepted fits the Parquet schema.
    schema = HEADERS_SCHEMA if parser is parse_header else OPS_SCHEMA if parser is parse_op else TC_SEQ_SCHEMA
    pa.Table.from_pylist([row], schema=schema)


async def test_records_that_crashed_the_export_are_exported_or_rejected(tmp_path: Path) -> None:
    # Each of these stopped the whole export with an exception. Lone surrogates are valid in the JSON
    # (an owner role may hold one): kept, as U+FFFD. The others are rejects with a reason. Header times
    # beyond year 9999 are rejects too: the job's arithmetic on them overflowed under Spark's ANSI mode.
    store = MemoryStore()
    deadline = {layout.IDX_TXN_BY_DEADLINE: layout.deadline_index_key(1795447269230)}
    await store.put("/txn/id/0_1", b'{"state":"OPEN","timeout":60.000000000,"createdAt":1795447209.230000000,'
                    b'"owner":"\\uD800"}', partition_key="0_1", secondary_indexes=deadline)
    await store.put("/txn/op/0_1-00000000000000000001", b'{"kind":"WRITE","segment":"seg\\udc00","ledgerId":1,'
                    b'"entryId":2}', partition_key="0_1")
    await store.put("/txn/id/0_2", b'{"state":"OPEN","timeout":9223372036854775.807,"createdAt":1.000000000}',
                    partition_key="0_2", secondary_indexes=deadline)
    await store.put("/txn/tc-seq/0", b'{"next":' + b"1" * 5000 + b"}")
    await store.put("/txn/tc-seq/1", b"[" * 200_000)
    await store.put("/txn/tc-seq/" + "1" * 5000, b'{"next":1}')
    counts = await export_snapshot(store, tmp_path / "snap", source="memory", show_progress=False)
    assert counts == {"headers": 1, "ops": 1, "tc_seq": 0, "rejects": 4}
    assert pq.read_table(tmp_path / "snap" / "headers").to_pylist()[0]["owner"] == "\ufffd"
    assert pq.read_table(tmp_path / "snap" / "ops").to_pylist()[0]["segment"] == "seg\ufffd"
    reasons = {json.loads(line)["key"][:20]: json.loads(line)["reason"]
               for line in (tmp_path / "snap" / "rejects.jsonl").read_text().splitlines()}
    assert "out of range (0 to year 9999)" in reasons["/txn/id/0_2"]
    assert "RecursionError" in reasons["/txn/tc-seq/1"]
    await store.close()


async def test_records_a_review_found_stopping_or_fooling_the_export(tmp_path: Path) -> None:
    # A lone surrogate in the state (only the other text fields went through _text: the batch write
    # failed), a number whose exponent Decimal refuses (an ArithmeticError past `except ValueError`), in
    # a header and in an op record: each stopped the whole export. /txn/tc-seq/03 was exported as
    # coordinator 3's sequence, which the coordinator never reads: a coordinator without its record (its
    # ids start again) looked safe to id_reuse_risk.
    store = MemoryStore()
    await store.put("/txn/id/0_2", b'{"state":"OPEN\\ud800","timeout":60.0,"createdAt":1.0}', partition_key="0_2")
    await store.put("/txn/id/0_3", b'{"state":"OPEN","timeout":60.0,"createdAt":1e999999999999999999999}',
                    partition_key="0_3")
    await store.put("/txn/op/0_2-00000000000000000001",
                    b'{"kind":"WRITE","segment":"s","ledgerId":1,"entryId":2,"x":1e999999999999999999999}',
                    partition_key="0_2")
    await store.put("/txn/tc-seq/03", layout.tc_seq_json(100))
    # Its created time and timeout each within year 9999, their sum (the deadline) not: exported, it made
    # the job refuse the whole snapshot.
    await store.put(layout.header_path(0, 4), TxnHeader(TxnState.OPEN, created_ms=MAX_TIME_MS - 1_000,
                                                        timeout_ms=60_000).to_json(), partition_key="0_4")
    counts = await export_snapshot(store, tmp_path / "snap", source="memory", show_progress=False)
    await store.close()
    assert counts == {"headers": 1, "ops": 0, "tc_seq": 0, "rejects": 4}
    assert pq.read_table(tmp_path / "snap" / "headers").to_pylist()[0]["state"] == "OPEN\ufffd"
    reasons = [json.loads(line)["reason"] for line in (tmp_path / "snap" / "rejects.jsonl").read_text().splitlines()]
    assert sum("out of range" in reason for reason in reasons) == 3
    assert any(reason.startswith("deadline time out of range") for reason in reasons)
    assert any("non-canonical coordinator id '03'" in reason for reason in reasons)
