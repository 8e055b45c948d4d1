"""Pulsar 4.2.4's own coordinator as the oracle: the same transaction requests sent to it (a real standalone
broker, 16 coordinators) and to tc-server (in front of that broker), answers compared.

Labels in the test names:
- ``test_match_*``: both answer the same way (error code, and what a stock client then does).
- ``test_divergence_*``: the answers differ, judged harmless (documented in docs/semantics.md, or tc-server is
  better for stock clients); the test pins both answers as observed on 2026-11-30.
Two matches were defects when this suite was written (2026-11-30): a 3 h timeout (Flink's Pulsar connector's
default) was refused, and a commit of a timed-out txn was answered InvalidTxnStatus, which Flink's sink takes
for "already committed".

The broker is loaded with its 16 coordinators first (a LOOKUP of each assign-topic partition, then
TC_CLIENT_CONNECT), as a Java client does before its first NEW_TXN.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from tc_server.bench.process import TcServerProcess
from tc_server.wire import PartitionedMetadata
from tests.differential.peer import Peer, lookup, outcome, raw_end_txn, wait_closed
from tests.interop.conftest import JAVA_JAR, JVM_OPTS, Harness
from tests.support.front_door import start_front_door
from tests.support.pulsar_broker import QUICK_START_JVM, PulsarBroker, running_broker
from tests.support.waiting import async_wait_for

pytestmark = pytest.mark.timeout(900)

TOPIC = "persistent://public/default/differential"
COORDINATORS = 16
HUGE = (1 << 64) - 1


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarBroker]:
    yield from running_broker(PulsarBroker(tmp_path_factory.mktemp("oracle-broker"), jvm_options=QUICK_START_JVM))


@pytest.fixture(scope="module")
def tc(broker: PulsarBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TcServerProcess]:
    server = start_front_door(broker.url, tmp_path_factory.mktemp("differential-tc"))
    yield server
    server.kill()


@pytest.fixture(scope="module")
def ports(broker: PulsarBroker, tc: TcServerProcess) -> dict[str, int]:
    return {"pulsar": broker.port, "tc": tc.port}


@pytest.fixture(scope="module")
def java(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    java_bin = shutil.which("java")
    if java_bin is None or not JAVA_JAR.exists():
        pytest.fail("the Java interop harness is missing: run `make interop-java`")
    tmp = tmp_path_factory.mktemp("differential-java-tmp")
    return Harness("java", [java_bin, *JVM_OPTS, f"-Djava.io.tmpdir={tmp}", "-jar", str(JAVA_JAR)], "--")


async def coordinator_peer(port: int) -> Peer:
    """A connection on which every coordinator is loaded and attached (LOOKUP + TC_CLIENT_CONNECT)."""
    peer = await Peer.open(port)
    assert type(await peer.handshake()).__name__ == "Connected"
    for tc_id in range(COORDINATORS):
        await lookup(peer, tc_id)
    for tc_id in range(COORDINATORS):
        answer = await peer.tc_connect(tc_id)
        assert outcome(answer)[1] == "OK", (port, tc_id, answer)
    return peer


Scenario = Callable[[Peer], Awaitable[Any]]


async def both(ports: dict[str, int], scenario: Scenario) -> tuple[Any, Any]:
    """``scenario`` run on a fresh coordinator connection to Pulsar's coordinator, then to tc-server."""
    results = []
    for name in ("pulsar", "tc"):
        peer = await coordinator_peer(ports[name])
        try:
            results.append(await scenario(peer))
        finally:
            peer.close()
    return results[0], results[1]


async def new_txn(peer: Peer, tc_id: int = 1, ttl_ms: int = 60_000) -> tuple[int, int]:
    answer = await peer.new_txn(tc_id, ttl_ms)
    assert answer is not None and answer.error is None, answer
    return answer.most, answer.least


def code(answer: Any) -> str:
    """The error name, "OK", or "NO ANSWER"."""
    seen = outcome(answer)
    return str(seen[1] if len(seen) > 1 else seen[0])


# ---------------------------------------------------------------------------------------------------
# Matches


async def test_match_first_commit_and_first_abort_succeed(ports: dict[str, int]) -> None:
    """MATCH: NEW_TXN, ADD_PARTITION, ADD_SUBSCRIPTION, END_TXN(COMMIT); and another ended by ABORT."""
    async def scenario(peer: Peer) -> list[str]:
        most, least = await new_txn(peer)
        steps = [code(await peer.add_partition(most, least, TOPIC)),
                 code(await peer.add_subscription(most, least, TOPIC, "sub")),
                 code(await peer.end(most, least, 0))]
        most, least = await new_txn(peer)
        steps.append(code(await peer.end(most, least, 1)))
        return steps

    pulsar, tc = await both(ports, scenario)
    assert pulsar == tc == ["OK", "OK", "OK", "OK"]


async def test_match_unknown_txn_is_transaction_not_found(ports: dict[str, int]) -> None:
    """MATCH: END_TXN (both actions), ADD_PARTITION, ADD_SUBSCRIPTION on an id never handed out:
    TransactionNotFound (24) from both; the response carries the request's most bits."""
    async def scenario(peer: Peer) -> list[tuple[str, int]]:
        unknown = 10**15
        answers = [await peer.end(1, unknown, 0), await peer.end(1, unknown, 1),
                   await peer.add_partition(1, unknown, TOPIC),
                   await peer.add_subscription(1, unknown, TOPIC, "sub")]
        return [(code(a), a.most) for a in answers]

    pulsar, tc = await both(ports, scenario)
    assert pulsar == tc == [("TransactionNotFound", 1)] * 4


async def test_match_duplicate_add_of_the_same_participant_succeeds(ports: dict[str, int]) -> None:
    """MATCH: the same partition / subscription added twice, then commit: all OK on both."""
    async def scenario(peer: Peer) -> list[str]:
        most, least = await new_txn(peer, 2)
        return [code(await peer.add_partition(most, least, TOPIC)),
                code(await peer.add_partition(most, least, TOPIC)),
                code(await peer.add_partition(most, least, TOPIC, TOPIC)),
                code(await peer.add_subscription(most, least, TOPIC, "s")),
                code(await peer.add_subscription(most, least, TOPIC, "s")),
                code(await peer.end(most, least, 0))]

    pulsar, tc = await both(ports, scenario)
    assert pulsar == tc == ["OK"] * 6


async def test_match_commit_abort_race_exactly_one_wins(ports: dict[str, int]) -> None:
    """MATCH: COMMIT and ABORT of one txn pipelined on one connection: the first wins (OK), the second is
    refused on both: an ABORT after the COMMIT InvalidTxnStatus (21); a COMMIT after the ABORT InvalidTxnStatus
    from Pulsar (still ABORTING), TransactionNotFound (24) from tc-server (aborted; docs/semantics.md §2)."""
    async def scenario(peer: Peer) -> list[tuple[str, str]]:
        results = []
        for first, second in ((0, 1), (1, 0), (0, 1)):
            most, least = await new_txn(peer, 2)
            r1, r2 = peer.rid(), peer.rid()
            peer.send(raw_end_txn(r1, most, least, first))
            peer.send(raw_end_txn(r2, most, least, second))
            results.append((code(await peer.answer(r1)), code(await peer.answer(r2))))
        return results

    pulsar, tc = await both(ports, scenario)
    assert pulsar == [("OK", "InvalidTxnStatus")] * 3
    assert tc == [("OK", "InvalidTxnStatus"), ("OK", "TransactionNotFound"), ("OK", "InvalidTxnStatus")]


async def test_match_coordinator_id_beyond_any_is_coordinator_not_found(ports: dict[str, int]) -> None:
    """MATCH: NEW_TXN with tc_id 2**64-1 and END_TXN / ADD_PARTITION whose most bits are 2**64-1:
    TransactionCoordinatorNotFound (20) from both (Pulsar reads the id as -1)."""
    async def scenario(peer: Peer) -> list[str]:
        return [code(await peer.new_txn(HUGE)), code(await peer.end(HUGE, 0, 0)),
                code(await peer.add_partition(HUGE, 0, TOPIC))]

    pulsar, tc = await both(ports, scenario)
    assert pulsar == tc == ["TransactionCoordinatorNotFound"] * 3


async def test_match_add_on_an_expired_txn_is_refused(ports: dict[str, int]) -> None:
    """MATCH (in effect): ADD_PARTITION on a txn whose 1 ms timeout passed is refused with
    InvalidTxnStatus by both (Pulsar: "in ABORTING status"; tc-server: "timed out and was aborted")."""
    async def scenario(peer: Peer) -> str:
        most, least = await new_txn(peer, 5, 1)
        await asyncio.sleep(0.05)
        return code(await peer.add_partition(most, least, TOPIC))

    pulsar, tc = await both(ports, scenario)
    # Pulsar: InvalidTxnStatus while the timeout abort runs, TransactionNotFound once it is done.
    assert pulsar in ("InvalidTxnStatus", "TransactionNotFound")
    assert tc == "InvalidTxnStatus"


async def test_match_requests_before_connect_end_the_connection(ports: dict[str, int]) -> None:
    """MATCH (in effect): NEW_TXN / TC_CLIENT_CONNECT / END_TXN before CONNECT: both close the
    connection (Pulsar silently; tc-server after ERROR NotAllowedError "send CONNECT first")."""
    for send in ("new", "tcconnect", "end"):
        closed = {}
        for name, port in ports.items():
            peer = await Peer.open(port)
            if send == "new":
                await peer.new_txn(1)
            elif send == "tcconnect":
                await peer.tc_connect(0)
            else:
                await peer.end(0, 1, 0, 5)
            closed[name] = await wait_closed(peer, 3)
            peer.close()
        assert closed == {"pulsar": True, "tc": True}, send


async def test_match_a_protocol_18_client_works_without_tc_client_connect(ports: dict[str, int]) -> None:
    """MATCH: a client at protocol 18 skips TC_CLIENT_CONNECT; NEW_TXN and END_TXN work on both."""
    results = {}
    for name, port in ports.items():
        # A broker loads a coordinator at a client's TC_CLIENT_CONNECT: such a client relies on one having
        # come before it. Without it, Pulsar answered its NEW_TXN TransactionCoordinatorNotFound for 10 s, also
        # after a LOOKUP of the partition: run alone, and once in a whole suite's run (2026-12-02), after the
        # module's other tests had connected that coordinator.
        (await coordinator_peer(port)).close()
        peer = await Peer.open(port)
        await peer.handshake(protocol_version=18)
        r = peer.rid()
        peer.send(PartitionedMetadata("persistent://pulsar/system/transaction_coordinator_assign", r))
        metadata = await peer.answer(r)
        assert metadata is not None
        partitions = metadata.partitions
        answer = await peer.new_txn(0)
        results[name] = (partitions, code(answer), code(await peer.end(answer.most, answer.least, 0)))
        peer.close()
    assert results["pulsar"] == results["tc"] == (16, "OK", "OK")


# ---------------------------------------------------------------------------------------------------
# Divergences judged harmless (both answers pinned)


async def test_divergence_retried_end_txn_is_idempotent_on_tc_server(ports: dict[str, int]) -> None:
    """DIVERGENCE (tc-server better, documented: semantics §2): a repeated COMMIT (or ABORT) of an
    ended txn, which is what a client resends after a reconnect, gets TransactionNotFound from Pulsar
    (it forgot the txn, so the client is told its committed txn failed) and success from tc-server.
    A pipelined duplicate COMMIT: Pulsar answers the second InvalidTxnStatus, tc-server OK."""
    async def scenario(peer: Peer) -> list[str]:
        most, least = await new_txn(peer, 3)
        steps = [code(await peer.end(most, least, 0)), code(await peer.end(most, least, 0))]
        most, least = await new_txn(peer, 3)
        steps += [code(await peer.end(most, least, 1)), code(await peer.end(most, least, 1))]
        most, least = await new_txn(peer, 3)
        r1, r2 = peer.rid(), peer.rid()
        peer.send(raw_end_txn(r1, most, least, 0))
        peer.send(raw_end_txn(r2, most, least, 0))
        steps += [code(await peer.answer(r1)), code(await peer.answer(r2))]
        return steps

    pulsar, tc = await both(ports, scenario)
    assert pulsar == ["OK", "TransactionNotFound", "OK", "TransactionNotFound", "OK", "InvalidTxnStatus"]
    assert tc == ["OK"] * 6


async def test_divergence_requests_on_an_ended_txn(ports: dict[str, int]) -> None:
    """DIVERGENCE (harmless, documented: semantics §2): on an ended txn, every ADD and an ABORT of a committed
    txn get TransactionNotFound from Pulsar, InvalidTxnStatus from tc-server. The Java client's TransactionImpl
    treats both alike (state ERROR) and refuses those calls locally first anyway. A COMMIT of an aborted txn is
    TransactionNotFound on both."""
    async def scenario(peer: Peer) -> list[str]:
        most, least = await new_txn(peer, 4)
        await peer.end(most, least, 0)
        steps = [code(await peer.end(most, least, 1)), code(await peer.add_partition(most, least, TOPIC)),
                 code(await peer.add_subscription(most, least, TOPIC, "s"))]
        most, least = await new_txn(peer, 4)
        await peer.end(most, least, 1)
        steps += [code(await peer.end(most, least, 0)), code(await peer.add_partition(most, least, TOPIC))]
        return steps

    pulsar, tc = await both(ports, scenario)
    assert pulsar == ["TransactionNotFound"] * 5
    assert tc == ["InvalidTxnStatus"] * 3 + ["TransactionNotFound", "InvalidTxnStatus"]


async def test_divergence_abort_of_a_timed_out_txn(ports: dict[str, int], broker: PulsarBroker,
                                                   tc: TcServerProcess) -> None:
    """DIVERGENCE (tc-server better): ABORT of a txn whose timeout passed: Pulsar TransactionNotFound,
    tc-server success (it is ABORTED). Each coordinator aborts the txn on a timer of its own, which a loaded
    machine runs late: the test waits until Pulsar's admin API no longer knows the txn, and until tc-server's
    says ABORTED, not for a fixed time."""
    async def scenario(peer: Peer) -> str:
        most, least = await new_txn(peer, 6, 500)
        path = f"/admin/v3/transactions/transactionMetadata/{most}/{least}"
        if peer.writer.get_extra_info("peername")[1] == ports["pulsar"]:
            await async_wait_for(lambda: broker.get_json(path)[0] == 404,
                                 "Pulsar's coordinator forgets a txn past its timeout", step_s=0.2)
        else:
            await async_wait_for(lambda: tc.get_json(path)[1].get("status") == "ABORTED",
                                 "tc-server aborts a txn past its timeout", step_s=0.2)
        return code(await peer.end(most, least, 1))

    assert await both(ports, scenario) == ("TransactionNotFound", "OK")


async def test_divergence_ttl_zero_and_negative(ports: dict[str, int]) -> None:
    """DIVERGENCE (harmless, documented: semantics §3): NEW_TXN with ttl 0 → Pulsar opens a txn that
    is aborted at once (a COMMIT gets InvalidTxnStatus "ABORTING" or TransactionNotFound); tc-server
    gives it the default 60 s (COMMIT OK). ttl 2**64-1 (a Java -1) → Pulsar opens and aborts at once;
    tc-server NotAllowedError."""
    async def scenario(peer: Peer) -> list[str]:
        most, least = await new_txn(peer, 7, 0)
        steps = [code(await peer.end(most, least, 0))]
        answer = await peer.new_txn(7, HUGE)
        steps.append(code(answer))
        if answer.error is None:
            steps.append(code(await peer.end(answer.most, answer.least, 0)))
        return steps

    pulsar, tc = await both(ports, scenario)
    # Pulsar's COMMIT: InvalidTxnStatus while its immediate timeout abort runs, TransactionNotFound after.
    assert pulsar[1] == "OK"
    assert pulsar[0] in ("InvalidTxnStatus", "TransactionNotFound")
    assert pulsar[2] in ("InvalidTxnStatus", "TransactionNotFound")
    assert tc == ["OK", "NotAllowedError"]


async def test_divergence_invalid_or_missing_txn_action(ports: dict[str, int]) -> None:
    """DIVERGENCE (harmless: no stock client sends it): END_TXN with txn_action 2, or none. Pulsar
    COMMITS the txn (proto2 default) and keeps the connection; tc-server answers ERROR UnknownError
    "malformed command" and closes the connection (every handler on it would reconnect)."""
    results: dict[str, list[Any]] = {}
    for name, port in ports.items():
        results[name] = []
        for action in (2, None):
            peer = await coordinator_peer(port)
            most, least = await new_txn(peer, 8)
            answer = await peer.end(most, least, action, 5)
            results[name].append((type(answer).__name__, code(answer), await wait_closed(peer, 2)))
            peer.close()
    assert results["pulsar"] == [("EndTxnResponse", "OK", False)] * 2
    assert results["tc"] == [("Error", "UnknownError", True)] * 2


async def test_divergence_tc_client_connect_for_a_coordinator_that_does_not_exist(ports: dict[str, int]) -> None:
    """DIVERGENCE (harmless: a client connects handlers 0..N-1 only): TC_CLIENT_CONNECT for tc 16 and 99
    (of 16). Pulsar, once the assign-topic partition was looked up, creates a coordinator for it and
    answers OK (a quirk); tc-server answers TransactionCoordinatorNotFound."""
    results = {}
    for name, port in ports.items():
        peer = await Peer.open(port)
        await peer.handshake()
        answers = []
        for tc_id in (16, 99):
            await lookup(peer, tc_id)
            answers.append(code(await peer.tc_connect(tc_id)))
        results[name] = answers
        peer.close()
    assert results == {"pulsar": ["OK", "OK"], "tc": ["TransactionCoordinatorNotFound"] * 2}


async def test_divergence_participants_tc_server_refuses(ports: dict[str, int]) -> None:
    """DIVERGENCE (harmless, documented: semantics §3 / security): ADD_PARTITION of a non-persistent
    topic, of 300 topics in one request, ADD_SUBSCRIPTION with an empty subscription name: Pulsar OK,
    tc-server NotAllowedError (the Java and Go clients send one topic per ADD; a non-persistent topic
    refuses transactional sends at the broker anyway; the Java client refuses a blank subscription)."""
    async def scenario(peer: Peer) -> list[str]:
        most, least = await new_txn(peer, 9)
        steps = [code(await peer.add_partition(most, least, "non-persistent://public/default/np")),
                 code(await peer.add_partition(most, least, *[f"{TOPIC}-{i}" for i in range(300)])),
                 code(await peer.add_subscription(most, least, TOPIC, ""))]
        steps.append(code(await peer.end(most, least, 1)))
        return steps

    pulsar, tc = await both(ports, scenario)
    assert pulsar == ["OK", "OK", "OK", "OK"]
    assert tc == ["NotAllowedError", "NotAllowedError", "NotAllowedError", "OK"]


async def test_divergence_commit_naming_a_topic_of_a_missing_namespace(ports: dict[str, int]) -> None:
    """DIVERGENCE (tc-server better): a txn that added a partition of a namespace that does not exist,
    then COMMIT: Pulsar's coordinator retries the participant without end and never answers (the Java
    client's commit times out); tc-server answers OK after --participant-wait-s (25 s) and keeps the
    decision in its outbox (GET /admin/v3/transactions/undelivered)."""
    async def scenario(name: str) -> str:
        peer = await coordinator_peer(ports[name])
        try:
            most, least = await new_txn(peer, 10)
            await peer.add_partition(most, least, "persistent://public/differential-no-such-ns/t")
            return code(await peer.end(most, least, 0, 40))
        finally:
            peer.close()

    # Side by side, not one after the other as both() runs them: each only waits (40 s for Pulsar's answer that
    # never comes, 25 s for tc-server's), on coordinators of their own, and CI time is short.
    pulsar, tc = await asyncio.gather(scenario("pulsar"), scenario("tc"))
    assert (pulsar, tc) == ("NO ANSWER", "OK")


def test_match_java_client_tc_errors(ports: dict[str, int], java: Harness) -> None:
    """MATCH / DIVERGENCE through the stock Java client's TransactionCoordinatorClient (the harness's
    tc-errors scenario): unknown txn → TransactionNotFoundException on both; an unknown tcId never
    leaves the client; no connection is dropped. commit_again: Pulsar TransactionNotFoundException,
    tc-server ok; abort_after_commit: TransactionNotFoundException vs InvalidTxnStatusException."""
    steps = {}
    for name, port in ports.items():
        run = java.run("tc-errors", service_url=f"pulsar://127.0.0.1:{port}", timeout_s=120)
        result = run.result
        steps[name] = {k: v["outcome"].rsplit("$", 1)[-1] for k, v in result["steps"].items()}
        assert result["connections_before"] == result["connections_after"], name
    for same in ("commit", "commit_unknown", "abort_unknown", "commit_unknown_tc", "new_txn_commit"):
        assert steps["pulsar"][same] == steps["tc"][same], (same, steps)
    assert (steps["pulsar"]["commit_again"], steps["tc"]["commit_again"]) == ("TransactionNotFoundException", "ok")
    assert (steps["pulsar"]["abort_after_commit"], steps["tc"]["abort_after_commit"]) == (
        "TransactionNotFoundException", "InvalidTxnStatusException")


# ---------------------------------------------------------------------------------------------------
# Matches that were defects


def test_match_a_three_hour_txn_timeout(ports: dict[str, int], java: Harness) -> None:
    """MATCH. A stock Java client asking for a transaction timeout of 3 hours
    (``newTransaction().withTransactionTimeout(3, HOURS)``) gets a transaction and commits it with Pulsar
    4.2.4's coordinator (which has no maximum timeout). Against tc-server ``build()`` failed: NEW_TXN was
    answered NotAllowedError "above the maximum of 3600000 ms", the default of ``--max-txn-timeout-ms`` then
    (a day now). 3 hours is the default of Apache Flink's Pulsar sink and source
    (``transactionTimeoutMillis`` = Duration.ofHours(3) in apache/flink-connector-pulsar): every such Flink
    job, left at its defaults, failed to open its first transaction and restarted in a loop.
    """
    results = {}
    for name, port in ports.items():
        run = java.run("timeout", service_url=f"pulsar://127.0.0.1:{port}", txn_timeout_ms=3 * 3600 * 1000,
                       sleep_ms=0, timeout_s=120)
        last = run.lines[-1] if run.lines else {}
        results[name] = (last.get("event"), last.get("commit", {}).get("outcome"), last.get("error"))
    assert results["pulsar"][:2] == ("result", "ok")
    assert results["tc"] == results["pulsar"], results


def test_match_commit_of_a_timed_out_txn_is_transaction_not_found(ports: dict[str, int], java: Harness) -> None:
    """MATCH. ``TransactionCoordinatorClient.commit(txnId)`` of a transaction whose timeout passed (the
    coordinator aborted it) throws ``TransactionNotFoundException`` with Pulsar 4.2.4's coordinator; tc-server
    answered InvalidTxnStatus ("it is already ABORTED"). Apache Flink's Pulsar sink commits exactly this way
    after each checkpoint (PulsarCommitter in apache/flink-connector-pulsar): on a first attempt it fails the
    job on TransactionNotFoundException ("the checkpoint interval exceed the transaction timeout"), but takes
    InvalidTxnStatusException for ``signalAlreadyCommitted``: with tc-server a checkpoint whose transaction
    timed out was marked committed and its output silently lost.
    """
    outcomes = {}
    for name, port in ports.items():
        run = java.run("timeout", service_url=f"pulsar://127.0.0.1:{port}", txn_timeout_ms=1000, sleep_ms=3000,
                       timeout_s=120)
        outcomes[name] = run.result["tc_commit"]["outcome"].rsplit("$", 1)[-1]
    assert outcomes["pulsar"] == "TransactionNotFoundException"
    assert outcomes["tc"] == outcomes["pulsar"], outcomes
