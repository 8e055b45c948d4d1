"""Decisions and a crash of tc-server in the window where its brokers are not told yet, against the real broker
(the session's) and the Java client; a review's, each failed before its fix.

- END_TXN retried right after a restart, before the restarted process scanned its outbox: answered success at
  once, while its (frozen) broker had not acknowledged the commit, so a client's commit() returned with its
  consumers not seeing the messages (docs/participants.md, *When END_TXN answers*). Also with --workers 2,
  the worker restarted by the supervisor.
- A producer's resend in a txn whose abort was delivered while it reconnected (tc-server killed with the
  txn's sends in flight through its relay, the txn timed out meanwhile): the broker took the resent messages
  as the txn opened again, which nobody ever ended, and the partition's readers stayed pinned for good. The
  txn's own END_TXN_ON_PARTITION now carries a low watermark that covers it, and the broker refuses the resend
  (docs/participants.md, *The low watermark*)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from tc_server.bench.process import TcServerProcess
from tc_server.client import connect
from tc_server.wire import EndTxn, ServerError, TxnAction
from tests.interop.conftest import Harness, RunningHarness, java_harness
from tests.participants.test_real_broker import fresh_topic, start_server
from tests.support.pulsar_broker import PulsarBroker
from tests.support.server_process import undelivered
from tests.support.waiting import wait_for
from tests.workers.helpers import worker_pids

__all__ = ["java_harness"]

pytestmark = [pytest.mark.java, pytest.mark.slow, pytest.mark.timeout(600)]

PARTITIONS = 4  # fresh_topic's
LONG_WAIT_S = "600"  # --participant-wait-s: far beyond the tests, so an answer within them did not wait for it
# How long a retried END_TXN is given to answer: an answer within it can only be one that did not wait for the
# brokers (frozen, and --participant-wait-s is LONG_WAIT_S).
RETRY_BOUND_S = 20.0
BOUND_S = 180.0


@pytest.fixture
def cleanup() -> Iterator[list[Any]]:
    """Processes to end after the test, last first (a harness is terminated, a server killed)."""
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        if isinstance(thing, RunningHarness):
            thing.terminate()
        else:
            thing.kill()


def owed(server: TcServerProcess) -> list[str]:
    return [entry["txnId"] for entry in undelivered(server)]


async def decided_while_the_broker_is_frozen(harness: Harness, broker: PulsarBroker, server: TcServerProcess,
                                             tmp_path: Path, workers: int, cleanup: list[Any]) -> tuple[int, int]:
    """A txn with messages on the broker, its COMMIT sent to the process that leads its coordinator and decided
    while the broker is stopped (SIGSTOP; resumed by the caller), its delivery under way: (most, least)."""
    release = tmp_path / f"go-{uuid.uuid4().hex[:6]}"
    run = harness.spawn("txn-produce", service_url=server.url, topic=fresh_topic(broker), count=4, action="commit",
                        visible_wait_ms=500, receive_timeout_ms=60_000, pause_before_end=release)
    cleanup.append(run)
    produced = run.wait_for("produced", 1, timeout_s=BOUND_S)[0]  # every ADD_PARTITION answered
    run.terminate()
    most, least = produced["most"], produced["least"]
    assert broker.proc is not None
    os.kill(broker.proc.pid, signal.SIGSTOP)
    client = await connect("127.0.0.1", port_of(server, most, workers))
    client.send(EndTxn(client.next_request_id(), most, least, TxnAction.COMMIT))  # waits for the broker
    await asyncio.to_thread(wait_for, lambda: owed(server) == [f"({most},{least})"],
                            "the commit decided and waiting for its broker", 30, 0.2)
    client.close()
    return most, least


def port_of(server: TcServerProcess, most: int, workers: int) -> int:
    """The client port of the process that leads coordinator ``most``: worker k of --workers N serves the
    coordinators i % N == k on the service port + 1 + k (the service port itself goes to any worker)."""
    return server.port if workers == 1 else server.port + 1 + most % workers


async def end_txn_as_soon_as_served(port: int, most: int, least: int) -> object:
    """What a reconnecting client does: connect as soon as the port takes connections and send END_TXN again
    (again after TransactionCoordinatorNotFound, which clients retry). The first other answer, or None when
    none came within RETRY_BOUND_S (the END_TXN waits, as it should)."""
    deadline = time.monotonic() + RETRY_BOUND_S
    while time.monotonic() < deadline:
        try:
            client = await connect("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        try:
            answer = await asyncio.wait_for(client.end_txn(most, least, commit=True),
                                            max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            return None
        finally:
            client.close()
        if answer.error is not ServerError.TransactionCoordinatorNotFound:
            return answer
        await asyncio.sleep(0.01)
    return None


@pytest.mark.parametrize("workers", [1, 2])
async def test_end_txn_retried_right_after_a_restart_waits_for_the_brokers(
        pulsar_broker: PulsarBroker, java_harness: Harness, tmp_path: Path, cleanup: list[Any], workers: int) -> None:
    server = start_server(pulsar_broker, tmp_path, "--participant-wait-s", LONG_WAIT_S, "--workers", str(workers))
    cleanup.append(server)
    try:
        most, least = await decided_while_the_broker_is_frozen(
            java_harness, pulsar_broker, server, tmp_path, workers, cleanup)
        port = port_of(server, most, workers)
        if workers == 1:
            server.kill()
            server.start(wait=False)
        else:
            os.kill(worker_pids(server)[most % workers], signal.SIGKILL)  # the supervisor restarts it
        answer = await end_txn_as_soon_as_served(port, most, least)
        await asyncio.to_thread(wait_for, lambda: server.status("/readyz") == 200, "ready again", 60, 0.2)
        assert answer is None, (
            f"the retried END_TXN of ({most},{least}) was answered {answer} while its broker (stopped) had not "
            f"acknowledged the commit; undelivered now: {owed(server)}\n{server.log_tail(30)}")
    finally:
        assert pulsar_broker.proc is not None
        os.kill(pulsar_broker.proc.pid, signal.SIGCONT)
    await asyncio.to_thread(wait_for, lambda: owed(server) == [], "delivered once the broker resumed", BOUND_S, 0.2)


def visible(broker: PulsarBroker, topic: str, bound_s: float = 60.0) -> tuple[list[str], list[str]]:
    """What a new subscription (earliest) sees on ``topic`` up to a plain marker sent now to each partition: (the
    txn-* values before the markers, the markers seen). A partition pinned by a txn nobody ends never delivers
    its marker."""
    client = pulsar.Client(broker.url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(topic, f"crash-{uuid.uuid4().hex[:6]}", consumer_type=pulsar.ConsumerType.Shared,
                                    initial_position=pulsar.InitialPosition.Earliest)
        markers = []
        for i in range(PARTITIONS):
            producer = client.create_producer(f"{topic}-partition-{i}")
            markers.append(f"marker-{i}-{uuid.uuid4().hex[:4]}")
            producer.send(markers[-1].encode())
            producer.close()
        values: list[str] = []
        seen: list[str] = []
        deadline = time.monotonic() + bound_s
        while len(seen) < len(markers) and time.monotonic() < deadline:
            try:
                msg = consumer.receive(timeout_millis=1000)
            except pulsar.Timeout:
                continue
            consumer.acknowledge(msg)
            value = msg.data().decode()
            if value in markers:
                seen.append(value)
            elif value.startswith("txn-"):
                values.append(value)
        return values, seen
    finally:
        client.close()


def participant_writes(server: TcServerProcess) -> float:
    try:
        _, body = server.get("/metrics", timeout_s=2)
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("pulsar_txn_metadata_store_op_writes_total{") and 'kind="participant"' in line)


async def test_a_resend_after_the_txns_abort_was_delivered_is_refused_and_pins_nothing(
        pulsar_broker: PulsarBroker, java_harness: Harness, tmp_path: Path, cleanup: list[Any]) -> None:
    topic = fresh_topic(pulsar_broker)
    server = start_server(pulsar_broker, tmp_path)
    cleanup.append(server)
    # 3000 sends in one txn of 3 s, left to time out ("none"); its producers' connections go through tc-server.
    run = java_harness.spawn("txn-produce", service_url=server.url, topic=topic, count=3000, action="none",
                             visible_wait_ms=500, receive_timeout_ms=5_000, txn_timeout_ms=3_000)
    cleanup.append(run)
    await asyncio.to_thread(wait_for, lambda: participant_writes(server) >= 2, "partitions added to the txn",
                            120, 0.02)
    server.kill()  # the txn's sends in flight through its relay
    await asyncio.sleep(4)  # past the txn's deadline
    server.start()
    # The restarted process aborts the txn and tells its partitions; the producer, reconnected, sends again
    # what it had in flight: refused now ("has been ended"), where it opened the txn again on the broker.
    await asyncio.to_thread(wait_for, lambda: owed(server) == [] and (run.proc.poll() is not None or any(
        line.get("event") == "produced" for line in run.lines)), "the abort delivered and the producer done", 120,
                            0.2)
    run.terminate()
    values, seen = await asyncio.to_thread(visible, pulsar_broker, topic)
    name = topic.rsplit("/", 1)[1]
    held = {i: pulsar_broker.get_json(f"/admin/v3/transactions/transactionBufferStats/public/default/"
                                      f"{name}-partition-{i}")[1] for i in range(PARTITIONS)}
    assert values == [] and len(seen) == PARTITIONS, (
        f"a partition stays pinned after the txn's abort was delivered: markers seen {seen}, txn values {values}; "
        f"the broker's buffers: {held}; harness: {run.lines[-3:]}\n{run.stderr_tail(8)}\n{server.log_tail(20)}")
