"""Damaged records in the store: written while tc-server is stopped (embedded) or by a foreign writer while it
runs (memory store in process, which keeps the same records and notifications), then real ``tc-server run``
processes or the coordinator in process on them. Each was a defect of a review of hostile files and records
(2026-11-30): the txn of an unreadable participant record left the outbox (the low watermark then told that
participant's broker to abort a commit), a garbage id sequence record answered UnknownError with a traceback,
unreadable overdue headers were logged at every scan and counted nowhere, a damaged leader record kept this
instance's URL for its coordinator, and stray member records counted as instances."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import pytest
import structlog

from tc_server.app import start_app
from tc_server.bench.process import TcServerProcess
from tc_server.client import connect
from tc_server.config import Settings
from tc_server.coordinator import layout
from tc_server.coordinator.layout import Participant, TxnHeader, TxnState
from tc_server.store import open_store
from tc_server.store.api import MetadataStore, Put
from tc_server.wire import ServerError
from tests.coordinator.test_partition import FakeClock
from tests.participants.test_outbox import RecordingSender, http_json, partition_on
from tests.support.waiting import wait_for

COORDINATORS = "4"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def header_put(most: int, least: int, raw: bytes, *, deadline_ms: int | None = None,
               final: tuple[TxnState, int] | None = None) -> Put:
    indexes: dict[str, str] = {}
    if deadline_ms is not None:
        indexes[layout.IDX_TXN_BY_DEADLINE] = layout.deadline_index_key(deadline_ms)
    if final is not None:
        indexes[layout.IDX_TXN_BY_FINAL_STATE] = layout.final_state_index_key(*final)
    return Put(layout.header_path(most, least), raw, partition_key=layout.txn_key(most, least),
               secondary_indexes=indexes)


def committed_header_put(most: int, least: int) -> Put:
    now = now_ms()
    header = TxnHeader(TxnState.COMMITTED, now - 2000, 60_000, now - 1000)
    return header_put(most, least, header.to_json(), final=(TxnState.COMMITTED, now - 1000))


def participant_put(most: int, least: int, participant: Participant, raw: bytes | None = None) -> Put:
    """A participant record as ADD_PARTITION_TO_TXN writes it, or with ``raw`` as its (damaged) value."""
    return Put(participant.path(most, least), participant.to_json() if raw is None else raw,
               partition_key=layout.txn_key(most, least),
               secondary_indexes={layout.IDX_PARTICIPANTS_BY_COORDINATOR:
                                  layout.participants_by_coordinator_key(most, least)})


def seed(data_dir: Path, puts: Sequence[Put]) -> None:
    """Write ``puts`` into the embedded store of ``data_dir`` (tc-server stopped), then close it."""
    async def write() -> None:
        store = await open_store("embedded", data_dir=str(data_dir))
        try:
            await store.write_batch(list(puts))
        finally:
            await store.close()
    asyncio.run(write())


@contextmanager
def running(data_dir: Path, *args: str) -> Iterator[TcServerProcess]:
    server = TcServerProcess(data_dir, "--coordinators", COORDINATORS, *args)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def log_lines(server: TcServerProcess) -> list[dict[str, object]]:
    lines = []
    for line in server.log_path.read_text(errors="replace").splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            lines.append({"event": line})
    return lines


GOOD = Participant("persistent://public/default/told")
BAD = Participant("persistent://public/default/never-told")


# -- /txn/tc-seq/<tcId> ------------------------------------------------------------------------------------

def test_a_garbage_id_sequence_record_is_metadata_error_naming_its_key(tmp_path: Path) -> None:
    """A damaged /txn/tc-seq/2 had every NEW_TXN of coordinator 2 answered UnknownError "internal error:
    MalformedRecord" and logged an "unexpected error" traceback naming no key. MetadataError naming the
    record now (as for a sequence past 64 bits), no traceback; it is not repaired (its true value may be
    above the clock's floor)."""
    data = tmp_path / "data"
    seed(data, [Put(layout.tc_seq_path(2), b"garbage")])
    with running(data) as server:
        async def ask() -> tuple[object, object]:
            client = await connect("127.0.0.1", server.port)
            try:
                other = await asyncio.wait_for(client.new_txn(tc_id=1), 15)
                damaged = await asyncio.wait_for(client.new_txn(tc_id=2), 15)
                return other, damaged
            finally:
                client.close()
        other, damaged = asyncio.run(ask())
        lines = log_lines(server)
    assert other.error is None  # type: ignore[attr-defined]
    assert damaged.error is ServerError.MetadataError, damaged  # type: ignore[attr-defined]
    assert "/txn/tc-seq/2" in (damaged.message or ""), damaged  # type: ignore[attr-defined]
    assert not [line for line in lines if "exception" in line or line.get("event") == "unexpected error"]


# -- participant records -----------------------------------------------------------------------------------

@pytest.fixture(params=["memory", "embedded"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MetadataStore]:
    opened = await open_store(request.param, data_dir=str(tmp_path / "data"))
    yield opened
    await opened.close()


async def test_an_unreadable_participant_record_beside_a_readable_one_holds_the_low_watermark(
        store: MetadataStore) -> None:
    """A committed txn (0,5) has two participant records; one is damaged. The coordinator told the readable
    one's broker COMMIT, deleted that record and dropped (0,5) from its outbox: the low watermark then passed 5,
    and the next END_TXN_ON_PARTITION to the damaged participant's broker would abort (0,5) there, a commit lost
    on that partition, with nothing held to see. It stays held now until an operator drops that record."""
    await store.write_batch([committed_header_put(0, 5), participant_put(0, 5, GOOD),
                             participant_put(0, 5, BAD, b'{"topic": 42}')])
    sender = RecordingSender()
    partition = partition_on(store, sender, FakeClock())
    partition.adopt_one(7, 10**15, None)  # a later open txn: without the hold, the watermark is 6
    try:
        await partition.recover_outbox()
        await sender.first_told(200)
        assert [told.participant for told in sender.told] == [GOOD]
        await asyncio.sleep(0.2)  # the record's deletion and the outbox's bookkeeping
        assert partition.low_watermark() == 4  # not 6: (0,5) may be a commit some broker has not heard
        assert 5 in partition.undelivered()
    finally:
        await partition.stop()


async def test_a_txn_whose_only_participant_record_is_unreadable_holds_the_low_watermark(
        store: MetadataStore) -> None:
    """A committed txn (0,5) whose one participant record is damaged was never held after a restart: the
    outbox scan skipped the record, so the low watermark passed 5. Held now (undelivered, watermark 4)."""
    await store.write_batch([committed_header_put(0, 5), participant_put(0, 5, BAD, b"\xff\xfe not json")])
    partition = partition_on(store, RecordingSender(), FakeClock())
    partition.adopt_one(7, 10**15, None)
    try:
        await partition.recover_outbox()
        await asyncio.sleep(0.2)
        assert partition.low_watermark() == 4  # not 6: (0,5) may be a commit some broker has not heard
        assert 5 in partition.undelivered()
    finally:
        await partition.stop()


def test_an_unreadable_participant_record_is_counted_and_listed_under_its_txn(tmp_path: Path) -> None:
    """Real process: committed txn (1,11) whose one participant record is damaged was counted nowhere
    (tc_server_undelivered_decisions 0) and listed with "txnId": null, though its key names the txn. Counted and
    listed as (1,11) now, the record marked unreadable; dropping it by its key (?key=) releases the txn."""
    data = tmp_path / "data"
    seed(data, [committed_header_put(1, 11), participant_put(1, 11, BAD, b'{"topic": 42}')])
    with running(data) as server:
        # The outbox scan after the election, in the background: polled (slow on a loaded machine).
        wait_for(lambda: undelivered_count(server, 1) == 1, "the txn held by its unreadable record", 30, 0.1)
        status, listed = server.get_json("/admin/v3/transactions/undelivered")
        held = undelivered_count(server, 1)
        base = f"{server.admin_url}/admin/v3/transactions/undelivered/1/11/drop"
        other_txn = quote(BAD.path(1, 12), safe="")
        refused = http_json(f"{base}?key={other_txn}", "POST")
        dropped = http_json(f"{base}?key={quote(BAD.path(1, 11), safe='')}", "POST")
        wait_for(lambda: undelivered_count(server, 1) == 0, "the txn released by the drop", 30, 0.1)
        _, after = server.get_json("/admin/v3/transactions/undelivered")
        released = undelivered_count(server, 1)
    assert status == 200
    assert [entry.get("txnId") for entry in listed] == ["(1,11)"], listed
    assert [sorted(p) for p in listed[0]["participants"]] == [["key", "unreadable"]], listed
    assert held == 1.0
    assert refused[0] == 400, refused  # a key of another txn
    assert dropped == (200, {"txnId": "(1,11)", "dropped": {"key": BAD.path(1, 11)}, "participantsLeft": 0}), dropped
    assert after == [] and released == 0.0, after


def undelivered_count(server: TcServerProcess, tc_id: int) -> float:
    _, metrics = server.get("/metrics")
    counted = [line for line in metrics.decode().splitlines()
               if line.startswith("tc_server_undelivered_decisions{") and f'coordinator_id="{tc_id}"' in line]
    assert counted, metrics
    return float(counted[0].rsplit(" ", 1)[1])


# -- unreadable OPEN headers past their deadline -----------------------------------------------------------

def _overdue_unreadable(count: int) -> list:  # type: ignore[type-arg]
    now = now_ms()
    created_s = (now - 600_000) // 1000
    # A header a Pulsar broker would read (owner is no string here): OPEN, ten minutes past its deadline.
    raw = b'{"state":"OPEN","timeout":1.0,"createdAt":%d.000,"owner":123}' % created_s
    return [header_put(0, least, raw, deadline_ms=created_s * 1000 + 1000) for least in range(1, count + 1)]


def test_unreadable_overdue_headers_are_counted_and_leave_the_instance_ready(tmp_path: Path) -> None:
    """OPEN headers past their deadline that cannot be read can never be aborted by the timeout sweep, and were
    counted nowhere. They are counted in tc_server_unreadable_overdue_headers; the instance stays ready (it
    serves every other txn, and an unready pod leaves its Service: an outage for a damaged record)."""
    data = tmp_path / "data"
    seed(data, _overdue_unreadable(5))
    with running(data) as server:
        wait_for(lambda: "tc_server_unreadable_overdue_headers 5.0" in server.get("/metrics")[1].decode(),
                 "the 5 unreadable overdue headers counted (an overdue scan runs every 5 s)", step_s=0.2)
        time.sleep(6)  # one more scan: still ready, still counted
        status, body = server.get("/readyz")
        _, metrics = server.get("/metrics")
    assert status == 200, body
    assert "tc_server_unreadable_overdue_headers 5.0" in metrics.decode()


def test_unreadable_overdue_headers_are_not_logged_again_at_every_scan(tmp_path: Path) -> None:
    """200 unreadable overdue headers gave 200 warning lines every 5 s (the overdue scan), for ever. Each key is
    logged once now."""
    data = tmp_path / "data"
    seed(data, _overdue_unreadable(200))
    def skipped() -> list[dict[str, Any]]:
        return [line for line in log_lines(server) if line.get("event") == "skipping unreadable header"]

    with running(data) as server:
        wait_for(lambda: len(skipped()) >= 200, "the 200 unreadable headers logged by the first overdue scan",
                 step_s=0.2)
        time.sleep(11)  # two more scans (every 5 s), which must log none of them again
        logged = skipped()
    assert len(logged) == 200, len(logged)


def _readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:  # noqa: S310
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())


async def test_a_damaged_leader_record_is_named_and_not_taken_for_this_instance(tmp_path: Path) -> None:
    """/txn/tc/leader/3 overwritten with {"brokerId": 5, ...} (not Pulsar's TcLeader) by a foreign writer: the
    warning "unreadable leader record" came about once a second with no key, /readyz blamed a restart in place
    ("their leader records name this instance's URL"), and WATCH_TC_ASSIGNMENTS kept naming this instance for
    coordinator 3, which refused its NEW_TXN. Now the key is logged (once a minute at most), /readyz names the
    record, and the watch no longer sends clients here for it."""
    settings = Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", store="memory", coordinators=4,
                        log_format="json", data_dir=str(tmp_path / "data"))
    with structlog.testing.capture_logs() as captured:
        app = await start_app(settings)
        own = f"pulsar://127.0.0.1:{app.listener.port if app.listener else 0}"
        try:
            await asyncio.sleep(0.5)
            await app.store.put(layout.leader_path(3), b'{"brokerId": 5, "brokerServiceUrl": ["x"]}', ephemeral=True)
            # Until /readyz names it (the leadership's recheck, once a second, on a loaded machine later), then
            # once more to let the warning's limit show: one line, not one a recheck.
            port = app.admin.port

            async def names_the_record() -> bool:
                status, body = await asyncio.to_thread(_readyz, port)
                return status == 503 and layout.leader_path(3) in " ".join(body.get("problems", []))

            deadline = time.monotonic() + 30
            while not await names_the_record() and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(2)
            status, body = await asyncio.to_thread(_readyz, port)
            client = await connect("127.0.0.1", app.listener.port if app.listener else 0)
            try:
                watched = await client.watch_assignments(1)
                refused = await client.new_txn(tc_id=3)
            finally:
                client.close()
        finally:
            await app.stop()
    logs = cast(list[dict[str, Any]], captured)
    unreadable = [line for line in logs if line.get("event") == "unreadable leader record"]
    assert unreadable
    assert all(layout.leader_path(3) in json.dumps(line) or line.get("coordinator_id") == 3
               or line.get("tc_id") == 3 for line in unreadable), unreadable
    assert len(unreadable) <= 2, f"{len(unreadable)} lines for one record"
    assert status == 503
    text = " ".join(body.get("problems", []))
    assert "name this instance's URL" not in text, text
    assert layout.leader_path(3) in text, text
    assert watched.snapshot is not None
    if refused.error is not None:  # this instance does not serve 3: the watch must not send clients to it for 3
        assert [a.broker_service_url for a in watched.snapshot.assignments if a.tc_id == 3] != [own]


async def test_unreadable_member_records_are_named_not_silently_counted_as_instances(tmp_path: Path) -> None:
    """Three garbage records under /txn/tc/members/ (a stray writer's, not ephemeral) counted as three live
    peers: the lone instance kept ceil(4/4) = 1 coordinator for good, coordinators 1-3 answered
    TransactionCoordinatorNotFound, and nothing was logged. They are named in the log and not counted now."""
    settings = Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", store="memory", coordinators=4,
                        log_format="json", data_dir=str(tmp_path / "data"))
    with structlog.testing.capture_logs() as captured:
        app = await start_app(settings)
        try:
            await asyncio.sleep(0.5)
            for i in range(3):
                await app.store.put(layout.member_path(f"junk-{i}"), b"\x00garbage")
            await asyncio.sleep(15)  # the members' share is re-read periodically
            status, body = await asyncio.to_thread(_readyz, app.admin.port)
            client = await connect("127.0.0.1", app.listener.port if app.listener else 0)
            try:
                answers = [await client.new_txn(tc_id=tc) for tc in range(4)]
            finally:
                client.close()
        finally:
            await app.stop()
    said = json.dumps(cast(list[dict[str, Any]], captured), default=str) + json.dumps(body)
    if any(answer.error is not None for answer in answers):
        assert layout.member_path("junk-0") in said, (status, body)
