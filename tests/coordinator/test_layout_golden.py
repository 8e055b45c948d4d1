"""Golden records: every record kind in both directions, byte for byte (docs/record-layout.md).

"Pulsar's bytes" are the records Pulsar 5's own v5 coordinator and participants write, as read back
from a store a 5.0.0-M1 broker wrote to (nanosecond instants, Jackson's field order); "tc-server
writes" checks that tc-server produces exactly the bytes Pulsar's record classes produce for the same
values, so that a broker sharing the store parses them. The last tests seed a store with records as
Pulsar's coordinator writes them (values, partition keys and index keys) and run tc-server's
coordinator on it.
"""

from __future__ import annotations

import json

import pytest

from tc_server.coordinator import layout
from tc_server.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
from tc_server.coordinator.errors import TransactionNotFound
from tc_server.coordinator.events import publish_decision
from tc_server.coordinator.ids import id_floor
from tc_server.coordinator.layout import OpKind, TcLeader, TxnHeader, TxnOp, TxnState
from tc_server.coordinator.partition import PartitionConfig
from tc_server.metrics import Metrics
from tc_server.store.api import MetadataStore
from tc_server.store.memory import MemoryBackend, MemoryStore

SEGMENT = "segment://public/default/orders/0"
ENC_SEGMENT = "segment%3A%2F%2Fpublic%2Fdefault%2Forders%2F0"

# -- headers ----------------------------------------------------------------------------------------

PULSAR_OPEN = b'{"state":"OPEN","timeout":60.000000000,"createdAt":1795447209.230663502}'
PULSAR_COMMITTED = (b'{"state":"COMMITTED","timeout":60.000000000,"createdAt":1795447209.230663502,'
                    b'"finalizedAt":1795447210.114201337}')
PULSAR_ABORTED = (b'{"state":"ABORTED","timeout":60.000000000,"createdAt":1795447209.230663502,'
                  b'"finalizedAt":1795447270.000000000,"owner":"app-1"}')


def test_header_pulsar_open_is_read() -> None:
    # Nanosecond instants floor to the millisecond, as Java's toEpochMilli.
    assert TxnHeader.from_json(PULSAR_OPEN) == TxnHeader(TxnState.OPEN, 1795447209230, 60000)


def test_header_pulsar_committed_is_read() -> None:
    assert TxnHeader.from_json(PULSAR_COMMITTED) == TxnHeader(
        TxnState.COMMITTED, 1795447209230, 60000, finalized_ms=1795447210114)


def test_header_pulsar_aborted_with_owner_is_read() -> None:
    assert TxnHeader.from_json(PULSAR_ABORTED) == TxnHeader(
        TxnState.ABORTED, 1795447209230, 60000, finalized_ms=1795447270000, owner="app-1")


def test_header_tc_server_writes_pulsar_bytes() -> None:
    assert TxnHeader(TxnState.OPEN, 1795447209230, 60000).to_json() == (
        b'{"state":"OPEN","timeout":60.000000000,"createdAt":1795447209.230000000}')
    assert TxnHeader(TxnState.COMMITTED, 1795447209230, 60000, 1795447210114).to_json() == (
        b'{"state":"COMMITTED","timeout":60.000000000,"createdAt":1795447209.230000000,'
        b'"finalizedAt":1795447210.114000000}')
    assert TxnHeader(TxnState.ABORTED, 1795447209230, 60000, 1795447270000, "app-1").to_json() == (
        b'{"state":"ABORTED","timeout":60.000000000,"createdAt":1795447209.230000000,'
        b'"finalizedAt":1795447270.000000000,"owner":"app-1"}')


def test_header_durations_and_instants_as_jackson_writes_them() -> None:
    # Jackson writes a zero Duration as 0.0, sub-second ones with 9 fraction digits.
    assert TxnHeader(TxnState.OPEN, 1000, 0).to_json() == b'{"state":"OPEN","timeout":0.0,"createdAt":1.000000000}'
    assert TxnHeader(TxnState.OPEN, 5, 250).to_json() == (
        b'{"state":"OPEN","timeout":0.250000000,"createdAt":0.005000000}')


def test_header_owner_escapes_as_jackson() -> None:
    # UTF-8 as is, control characters as upper-case \u00XX, quote and backslash escaped.
    written = TxnHeader(TxnState.OPEN, 1000, 1000, owner='r\u00f4le "x"\\\x1f').to_json()
    assert written == ('{"state":"OPEN","timeout":1.000000000,"createdAt":1.000000000,'
                       '"owner":"r\u00f4le \\"x\\"\\\\\\u001F"}').encode()
    assert TxnHeader.from_json(written).owner == 'r\u00f4le "x"\\\x1f'


def test_header_owner_surrogates_escape_as_jacksons_utf8_generator() -> None:
    # A character beyond U+FFFF as its two surrogates, a lone surrogate (a JWT "sub" may hold one) as
    # itself, upper-case hex: what jackson-core 2.x's UTF8JsonGenerator writes. Unescaped, a lone
    # surrogate could not be encoded at all, and its owner's txns could never be written or ended.
    written = TxnHeader(TxnState.OPEN, 1000, 1000, owner="app-\U0001F600 \ud800").to_json()
    assert written == (b'{"state":"OPEN","timeout":1.000000000,"createdAt":1.000000000,'
                       b'"owner":"app-\\uD83D\\uDE00 \\uD800"}')
    assert TxnHeader.from_json(written).owner == "app-\U0001F600 \ud800"


def test_header_iso_forms_jackson_also_reads_are_read() -> None:
    raw = b'{"state":"OPEN","timeout":"PT1M","createdAt":"2026-11-23T10:00:00.123Z"}'
    assert TxnHeader.from_json(raw) == TxnHeader(TxnState.OPEN, 1795428000123, 60000)


def test_header_unknown_fields_are_ignored() -> None:
    raw = b'{"state":"OPEN","timeout":60.000000000,"createdAt":1795447209.230663502,"futureField":[1]}'
    assert TxnHeader.from_json(raw) == TxnHeader(TxnState.OPEN, 1795447209230, 60000)


def test_header_earlier_tc_server_form_is_read() -> None:
    assert TxnHeader.from_json(b'{"version":1,"state":"OPEN","createdMs":1795447209230,"timeoutMs":60000}') == (
        TxnHeader(TxnState.OPEN, 1795447209230, 60000))
    assert TxnHeader.from_json(
        b'{"version":1,"state":"COMMITTED","createdMs":1795447209230,"timeoutMs":60000,'
        b'"finalizedMs":1795447210114,"owner":"app-1"}'
    ) == TxnHeader(TxnState.COMMITTED, 1795447209230, 60000, 1795447210114, "app-1")


@pytest.mark.parametrize("raw, problem", [
    (b'{"state":"OPEN","timeout":60.0}', "createdAt"),
    (b'{"state":"OPEN","createdAt":1.0}', "timeout"),
    (b'{"state":"DONE","timeout":1.0,"createdAt":1.0}', "DONE"),
    (b'{"state":"OPEN","timeout":"soon","createdAt":1.0}', "timeout"),
    (b'{"state":"OPEN","timeout":1.0,"createdAt":1e400}', "createdAt"),
    (b'{"version":1,"state":"OPEN"}', "createdAt"),
    (b'[1]', "not a JSON object"),
    # A negative deadline's index key sorts outside every scan: such a txn would never be recovered.
    (b'{"state":"OPEN","timeout":-1.0,"createdAt":1.0}', "'timeout' is negative"),
    (b'{"state":"OPEN","timeout":"-PT1M","createdAt":1.0}', "'timeout' is negative"),
    (b'{"state":"OPEN","timeout":1.0,"createdAt":-5.0}', "'createdAt' is negative"),
    # Decimal refuses such an exponent with InvalidOperation, an ArithmeticError that every reader's
    # `except ValueError` missed (it ended the audit's export, and would have reached the coordinator's).
    (b'{"state":"OPEN","timeout":1.0,"createdAt":1e999999999999999999999}', "out of range"),
    (b'{"state":"OPEN","timeout":1.0,"createdAt":1.0,"x":1e999999999999999999999}', "out of range"),
])
def test_header_malformed_is_named(raw: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        TxnHeader.from_json(raw)


def test_header_keys_and_index_keys() -> None:
    assert layout.header_path(3, 17) == "/txn/id/3_17"
    assert layout.txn_key(3, 17) == "3_17"
    assert layout.parse_header_path("/txn/id/3_17") == (3, 17)
    assert TxnHeader.from_json(PULSAR_OPEN).index_entries() == {
        "idx:txn-by-deadline": "/txn/id/00000001795447269230"}
    assert TxnHeader.from_json(PULSAR_COMMITTED).index_entries() == {
        "idx:txn-by-final-state": "/txn/id/COMMITTED:00000001795447210114"}
    assert TxnHeader.from_json(PULSAR_ABORTED).index_entries() == {
        "idx:txn-by-final-state": "/txn/id/ABORTED:00000001795447270000"}


@pytest.mark.parametrize("path", ["/txn/3_17", "/txn/id/3_17_1", "/txn/id/ 3_17", "/txn/id/3_17x", "/txn/id/",
                                  # not as Java writes a long: a second key for txn (1,2), or beyond 64 bits
                                  "/txn/id/01_2", "/txn/id/1_02", "/txn/id/-0_2", "/txn/id/1_9223372036854775808",
                                  "/txn/id/1_" + "9" * 5000])
def test_header_path_other_keys_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match="not a txn"):
        layout.parse_header_path(path)


def test_both_key_forms_of_the_header_indexes_are_scanned() -> None:
    assert layout.deadline_ranges(1795447269231) == (
        ("/txn/id/00000000000000000000", "/txn/id/00000001795447269231"),
        ("00000000000000000000", "00000001795447269231"),
    )
    assert layout.final_state_ranges(TxnState.COMMITTED, 1795447210115) == (
        ("/txn/id/COMMITTED:", "/txn/id/COMMITTED:00000001795447210115"),
        ("COMMITTED:", "COMMITTED:00000001795447210115"),
    )


# -- op records (participants write them, tc-server reads them) --------------------------------------

PULSAR_WRITE = b'{"kind":"WRITE","segment":"segment://public/default/orders/0","ledgerId":12,"entryId":3}'
PULSAR_ACK = (b'{"kind":"ACK","segment":"segment://public/default/orders/0","subscription":"my sub",'
              b'"ledgerId":12,"entryId":3}')
PULSAR_CUMULATIVE_ACK = (b'{"kind":"ACK","segment":"segment://public/default/orders/0","subscription":"my sub",'
                         b'"ledgerId":12,"entryId":9,"cumulative":true}')


@pytest.mark.parametrize("raw, op", [
    (PULSAR_WRITE, TxnOp(OpKind.WRITE, SEGMENT, 12, 3)),
    (PULSAR_ACK, TxnOp(OpKind.ACK, SEGMENT, 12, 3, subscription="my sub")),
    (PULSAR_CUMULATIVE_ACK, TxnOp(OpKind.ACK, SEGMENT, 12, 9, subscription="my sub", cumulative=True)),
])
def test_op_record_both_directions(raw: bytes, op: TxnOp) -> None:
    assert TxnOp.from_json(raw) == op
    assert op.to_json() == raw


def test_op_record_keys_and_index_keys() -> None:
    assert layout.op_prefix(3, 17) == "/txn/op/3_17"
    assert layout.op_records_prefix(3, 17) == "/txn/op/3_17-"
    assert TxnOp.from_json(PULSAR_WRITE).index_entries(3, 17) == {
        "idx:ops-by-txn": "/txn/op/3_17",
        "idx:writes-by-segment": f"/txn/op/{ENC_SEGMENT}",
    }
    assert TxnOp.from_json(PULSAR_ACK).index_entries(3, 17) == {
        "idx:ops-by-txn": "/txn/op/3_17",
        "idx:acks-by-segment-subscription": f"/txn/op/{ENC_SEGMENT}:my+sub",
    }
    assert layout.ops_by_txn_range(3, 17) == ("/txn/op/3_17", "/txn/op/3_17\x02")


@pytest.mark.parametrize("raw, problem", [
    (b'{"kind":"WRITE","segment":"s","ledgerId":"12","entryId":3}', "ledgerId"),
    (b'{"kind":"PUT","segment":"s","ledgerId":12,"entryId":3}', "PUT"),
    (b'{"kind":"ACK","segment":"s","ledgerId":12,"entryId":3,"cumulative":"yes"}', "cumulative"),
    (b'{"kind":"WRITE","ledgerId":12,"entryId":3}', "segment"),
])
def test_op_record_malformed_is_named(raw: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        TxnOp.from_json(raw)


# -- events (tc-server writes them, participants read them) ------------------------------------------


def test_event_bytes_and_keys() -> None:
    assert layout.event_json(3, 17, TxnState.COMMITTED) == b'{"txnId":"3_17","decision":"COMMITTED"}'
    assert layout.event_json(3, 17, TxnState.ABORTED) == b'{"txnId":"3_17","decision":"ABORTED"}'
    # The store appends "-<20 digits>"; the partition key is the encoded segment (resp. segment:sub).
    assert layout.segment_events_prefix(SEGMENT) == f"/txn/segment-events/{ENC_SEGMENT}"
    assert layout.subscription_events_prefix(SEGMENT, "my sub") == (
        f"/txn/subscription-events/{ENC_SEGMENT}:my+sub")
    assert layout.subscription_partition_key(SEGMENT, "my sub") == f"{ENC_SEGMENT}:my+sub"


async def test_events_are_appended_where_participants_read_them() -> None:
    store = MemoryStore()
    for raw in (PULSAR_WRITE, PULSAR_ACK):
        await store.put_sequential("/txn/op/3_17", raw, partition_key="3_17",
                                   secondary_indexes=TxnOp.from_json(raw).index_entries(3, 17))
    assert await publish_decision(store, Metrics("golden"), 3, 17, TxnState.COMMITTED) == 2
    segment_events = [r async for r in store.scan_prefix("/txn/segment-events/", partition_key=ENC_SEGMENT)]
    assert [(r.key, r.value) for r in segment_events] == [
        (f"/txn/segment-events/{ENC_SEGMENT}-00000000000000000001", b'{"txnId":"3_17","decision":"COMMITTED"}')]
    sub_events = [r async for r in store.scan_prefix("/txn/subscription-events/",
                                                     partition_key=f"{ENC_SEGMENT}:my+sub")]
    assert [(r.key, r.value) for r in sub_events] == [
        (f"/txn/subscription-events/{ENC_SEGMENT}:my+sub-00000000000000000001",
         b'{"txnId":"3_17","decision":"COMMITTED"}')]
    await store.close()


# -- tc-seq, parallelism, leader -----------------------------------------------------------------------


def test_tc_seq_both_directions() -> None:
    assert layout.tc_seq_path(3) == "/txn/tc-seq/3"
    assert layout.tc_seq_json(1001) == b'{"next":1001}'
    assert layout.parse_tc_seq(b'{"next":1001}') == 1001
    with pytest.raises(ValueError, match="next"):
        layout.parse_tc_seq(b'{"next":"1001"}')


def test_parallelism_both_directions() -> None:
    assert layout.PARALLELISM_PATH == "/txn/tc/parallelism"
    assert layout.parallelism_value(16) == b"16"
    assert layout.parse_parallelism(b"16") == 16
    assert layout.parse_parallelism(b" 16\n") == 16  # Java's trim() then parseInt
    assert not layout.is_legacy_parallelism(b"16")
    # tc-server's earlier form is read (and rewritten by the coordinator, see below).
    assert layout.parse_parallelism(b'{"parallelism": 16}') == 16
    assert layout.is_legacy_parallelism(b'{"parallelism": 16}')
    with pytest.raises(ValueError, match="number of coordinators"):
        layout.parse_parallelism(b"sixteen")


def test_leader_both_directions() -> None:
    assert layout.leader_path(3) == "/txn/tc/leader/3"
    assert TcLeader("tc-1", "pulsar://10.0.0.5:6650").to_json() == (
        b'{"brokerId":"tc-1","brokerServiceUrl":"pulsar://10.0.0.5:6650"}')
    pulsar = (b'{"brokerId":"broker-2:8080","brokerServiceUrl":"pulsar://10.0.0.6:6650",'
              b'"brokerServiceUrlTls":"pulsar+ssl://10.0.0.6:6651","webServiceUrl":"http://10.0.0.6:8080"}')
    leader = TcLeader.from_json(pulsar)
    assert leader == TcLeader("broker-2:8080", "pulsar://10.0.0.6:6650", "pulsar+ssl://10.0.0.6:6651",
                              "http://10.0.0.6:8080")
    assert leader.to_json() == pulsar


# -- names in keys -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, encoded", [
    (SEGMENT, ENC_SEGMENT),
    ("my sub", "my+sub"),  # URLEncoder: space is "+", not "%20"
    ("a*b", "a*b"),  # "*" kept
    ("a~b", "a%7Eb"),  # "~" encoded (Python's quote keeps it)
    ("a+b", "a%2Bb"),
    ("a.b-c_d", "a.b-c_d"),
    ("sub:1", "sub%3A1"),
    ("\u00e9", "%C3%A9"),  # non-ASCII: UTF-8 bytes, upper-case hex
    ("\U0001f600", "%F0%9F%98%80"),
    ("\ud800x", "%3Fx"),  # unpaired surrogate: Java's encoder writes "?"
    ("", ""),
])
def test_enc_is_javas_url_encoder(name: str, encoded: str) -> None:
    assert layout.enc(name) == encoded


# -- a store as Pulsar's own v5 coordinator leaves it ----------------------------------------------------


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def coordinator(store: MetadataStore, clock: Clock, partitions: int = 16) -> TransactionCoordinator:
    config = CoordinatorConfig(partitions=partitions, partition=PartitionConfig(id_block_size=10),
                               timeout_sweep=False, gc_retention_s=900)
    return TransactionCoordinator(store, config, Metrics("golden"), clock)


async def seed_pulsar_records(store: MetadataStore) -> None:
    """What Pulsar's coordinator 0 leaves: parallelism, tc-seq, an OPEN header past its deadline, an
    OPEN one in time and an old COMMITTED one, with Pulsar's values, partition keys and index keys."""
    await store.put("/txn/tc/parallelism", b"16")
    await store.put("/txn/tc-seq/0", b'{"next":5}')
    headers = {
        "0_1": (PULSAR_OPEN, {"idx:txn-by-deadline": "/txn/id/00000001795447269230"}),
        "0_2": (b'{"state":"OPEN","timeout":3600.000000000,"createdAt":1795447209.230663502}',
                {"idx:txn-by-deadline": "/txn/id/00000001795450809230"}),
        "0_3": (PULSAR_COMMITTED, {"idx:txn-by-final-state": "/txn/id/COMMITTED:00000001795447210114"}),
    }
    for key, (value, indexes) in headers.items():
        await store.put(f"/txn/id/{key}", value, partition_key=key, secondary_indexes=indexes)


async def test_records_written_by_pulsars_coordinator_are_served() -> None:
    store = MemoryStore()
    await seed_pulsar_records(store)
    clock = Clock(1795447209230 + 61_000)  # 0_1 is past its deadline, 0_2 is not
    tc = coordinator(store, clock)
    await tc.start()
    await tc.wait_recovered()
    assert set(tc.partition(0).open_txns()) == {1, 2}
    # Ids go on past Pulsar's sequence record, from the clock's floor (coordinator/ids.py).
    assert await tc.partition(0).new_txn(1000, None) == id_floor(clock())
    # The overdue one is aborted; the one in time is committed; both headers are Pulsar's form now, with the
    # createdAt Pulsar stored (nanoseconds), as its own coordinator keeps it when it ends a txn.
    assert await tc.abort_expired_now() == 1
    with pytest.raises(TransactionNotFound, match="aborted"):
        await tc.partition(0).end_txn(1, commit=True, principal=None)
    await tc.partition(0).end_txn(2, commit=True, principal=None)
    record = await store.get("/txn/id/0_2", partition_key="0_2")
    assert record is not None
    assert record.value == (b'{"state":"COMMITTED","timeout":3600.000000000,"createdAt":1795447209.230663502,'
                            b'"finalizedAt":1795447270.230000000}')
    committed = [r.key async for r in store.scan_index(
        "idx:txn-by-final-state", "/txn/id/COMMITTED:", "/txn/id/COMMITTED:~")]
    assert sorted(committed) == ["/txn/id/0_2", "/txn/id/0_3"]
    # GC collects Pulsar's old COMMITTED header (it has no op records) once past the retention.
    clock.now = 1795447210114 + 901_000
    await tc.collect_garbage_now()
    assert await store.get("/txn/id/0_3", partition_key="0_3") is None
    parallelism = await store.get("/txn/tc/parallelism")
    assert parallelism is not None and parallelism.value == b"16"
    await tc.stop()
    await store.close()


async def test_records_in_the_earlier_tc_server_form_are_served_and_upgraded() -> None:
    backend = MemoryBackend()
    store = MemoryStore(backend)
    await store.put("/txn/tc/parallelism", b'{"parallelism": 16}')
    await store.put("/txn/id/0_1", b'{"version":1,"state":"OPEN","createdMs":1795447209230,"timeoutMs":60000}',
                    partition_key="0_1", secondary_indexes={"idx:txn-by-deadline": "00000001795447269230"})
    await store.put("/txn/id/0_2", b'{"version":1,"state":"ABORTED","createdMs":1795447209230,"timeoutMs":60000,'
                    b'"finalizedMs":1795447210114}',
                    partition_key="0_2", secondary_indexes={"idx:txn-by-final-state": "ABORTED:00000001795447210114"})
    clock = Clock(1795447209230 + 61_000)
    tc = coordinator(store, clock)
    await tc.start()
    await tc.wait_recovered()
    parallelism = await store.get("/txn/tc/parallelism")
    assert parallelism is not None and parallelism.value == b"16"  # rewritten in Pulsar's form
    assert set(tc.partition(0).open_txns()) == {1}  # found through the earlier deadline key
    assert await tc.abort_expired_now() == 1
    aborted = await store.get("/txn/id/0_1", partition_key="0_1")
    assert aborted is not None
    doc = json.loads(aborted.value)
    assert list(doc) == ["state", "timeout", "createdAt", "finalizedAt"] and doc["state"] == "ABORTED"
    clock.now = 1795447270230 + 901_000
    await tc.collect_garbage_now()  # the earlier final-state key is scanned too
    assert await store.get("/txn/id/0_2", partition_key="0_2") is None
    assert await store.get("/txn/id/0_1", partition_key="0_1") is None
    await tc.stop()
    await store.close()


@pytest.mark.parametrize("key", ["/txn/op/1_0", "/txn/op/1_0-", "/txn/op/1_0-12a", "/txn/id/1_0-00000000000000000001",
                                 "/txn/op/1_0_0-00000000000000000001", "/txn/op/x-00000000000000000001"])
def test_an_op_record_key_of_another_shape_is_named(key: str) -> None:
    with pytest.raises(ValueError, match="not an op record key|not a txn key"):
        layout.parse_op_key(key)
