"""The front door end to end: stock clients whose one service URL is tc-server, in front of a real broker.

tc-server (``front_door_server``, tests/conftest.py) answers the coordinator's topics itself and forwards
every other lookup to the session's real Pulsar 4.2.4 broker (``pulsar_broker``). Each client produces
and consumes through it on a non-partitioned and on a 4-partition topic and must receive every message
exactly once: the Java client (transactions enabled, so its coordinator discovery goes through the same
URL), the Go client, and the C++ client through the Python ``pulsar-client`` wheel. Then the broker is
stopped under a running tc-server (every request fails with a typed error) and started again (new
producers and consumers work; tc-server is not restarted).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pulsar
import pytest

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.bench.process import TcServerProcess
from tc_server.client import connect
from tc_server.wire import LookupType, ServerError, encode_frame
from tests.e2e.txn_support import new_topic
from tests.interop.checks import check_concurrent
from tests.interop.conftest import Harness, HarnessRun
from tests.support.front_door import start_front_door
from tests.support.pulsar_broker import ASSIGN_TOPIC, COORDINATORS, PulsarBroker

# The bound of one test: a broker stop and start (up to 30 s + 120 s) and harness runs of 1000 messages
# on a loaded 2-core machine; each harness run is bounded on its own (HARNESS_TIMEOUT_S).
pytestmark = [pytest.mark.java, pytest.mark.golang, pytest.mark.slow, pytest.mark.timeout(600)]

MESSAGES = 1000
# Java's operationTimeout for the scenarios; each harness run is bounded by its subprocess timeout too.
OP_TIMEOUT_MS = 30_000
HARNESS_TIMEOUT_S = 240
# tc-server's --request-timeout-s (the default): a forwarded request with no answer by then is an error.
REQUEST_TIMEOUT_S = 10.0
PARTITIONS = pytest.mark.parametrize("partitions", [0, 4], ids=["non-partitioned", "4-partitions"])


def exactly_once(summary: dict[str, Any], count: int) -> None:
    """Every message sent was received once: nothing missing, nothing twice, nothing unknown."""
    assert summary["sent"] == count, summary
    assert (summary["missing"], summary["duplicates"], summary["unexpected"]) == (0, 0, 0), summary
    assert summary["distinct"] == count and summary["received"] == count, summary


def result_of(run: HarnessRun, server: TcServerProcess) -> dict[str, Any]:
    """The scenario's result line; on a harness failure the server's log tail is in the message too."""
    failed = run.events("fatal")
    assert not failed, f"{failed[-1]}\n{run.stderr_tail()}\n{server.log_tail()}"
    return run.result


def port_of(address: str | None) -> int | None:
    """Netty's remote address (``/127.0.0.1:6650``) or a proxy target (``127.0.0.1:6650``) -> 6650."""
    return None if address is None else int(address.rsplit(":", 1)[1])


# ---- the Java client -------------------------------------------------------------------------------------


@PARTITIONS
def test_java_produce_consume(java_harness: Harness, front_door_server: TcServerProcess,
                              pulsar_broker: PulsarBroker, partitions: int) -> None:
    topic = new_topic(pulsar_broker, "java-pc", partitions)
    run = java_harness.run("produce-consume", timeout_s=HARNESS_TIMEOUT_S, service_url=front_door_server.url,
                           topic=topic, count=MESSAGES, op_timeout_ms=OP_TIMEOUT_MS)
    result = result_of(run, front_door_server)
    exactly_once(result, MESSAGES)
    assert result["partitions"] == max(1, partitions), result
    assert len(result["producer_connections"]) == max(1, partitions), result


@PARTITIONS
def test_java_pattern_consumer(java_harness: Harness, front_door_server: TcServerProcess,
                               pulsar_broker: PulsarBroker, partitions: int) -> None:
    prefix = f"pattern-{uuid.uuid4().hex[:8]}"
    matching = [new_topic(pulsar_broker, f"{prefix}-{suffix}", partitions) for suffix in ("a", "b")]
    # In the same namespace and not matching: the consumer must leave it alone.
    other = new_topic(pulsar_broker, f"other-{prefix}", partitions)
    count = 200
    run = java_harness.run("pattern", timeout_s=HARNESS_TIMEOUT_S, service_url=front_door_server.url,
                           pattern=f"persistent://public/default/{prefix}-.*", topics=",".join(matching),
                           count=count, op_timeout_ms=OP_TIMEOUT_MS)
    result = result_of(run, front_door_server)
    exactly_once(result, 2 * count)
    base_topics = {name.split("-partition-")[0] for name in result["subscribed"]}
    assert base_topics == set(matching), (result, other)
    received_from = {name.split("-partition-")[0] for name in result["by_topic"]}
    assert received_from == set(matching), result


@PARTITIONS
def test_java_schema_consumers(java_harness: Harness, front_door_server: TcServerProcess,
                               pulsar_broker: PulsarBroker, partitions: int) -> None:
    topic = new_topic(pulsar_broker, "java-schema", partitions)
    count = 100
    run = java_harness.run("schema", timeout_s=HARNESS_TIMEOUT_S, service_url=front_door_server.url,
                           topic=topic, count=count, op_timeout_ms=OP_TIMEOUT_MS)
    result = result_of(run, front_door_server)
    # The JSON consumer decodes Order objects; AUTO_CONSUME fetched the schema (GET_SCHEMA, forwarded) and
    # decodes generic records of it.
    for consumer in ("typed", "generic"):
        exactly_once({"sent": count, **result[consumer]}, count)
        assert result[f"{consumer}_wrong_amount"] == 0, result
    assert result["generic_schema_type"] == "JSON", result
    # The broker holds the schema the producer registered (through tc-server's relay or directly).
    code, schema = pulsar_broker.get_json(f"/admin/v2/schemas/public/default/{topic.rsplit('/', 1)[1]}/schema")
    assert code == 200 and schema["type"] == "JSON", (code, schema)


# ---- the Go and C++ clients ------------------------------------------------------------------------------


@PARTITIONS
def test_go_produce_consume(go_harness: Harness, front_door_server: TcServerProcess,
                            pulsar_broker: PulsarBroker, partitions: int) -> None:
    topic = new_topic(pulsar_broker, "go-pc", partitions)
    run = go_harness.run("produce-consume", timeout_s=HARNESS_TIMEOUT_S, service_url=front_door_server.url,
                         topic=topic, count=MESSAGES, op_timeout_ms=OP_TIMEOUT_MS)
    result = result_of(run, front_door_server)
    assert result["failed_sends"] == 0, result
    exactly_once(result, MESSAGES)
    assert result["partitions"] == max(1, partitions), result


def cpp_produce_consume(service_url: str, topic: str, count: int) -> dict[str, Any]:
    """The C++ client (the ``pulsar-client`` wheel): subscribe, send ``count`` messages, receive them."""
    client = pulsar.Client(service_url, operation_timeout_seconds=OP_TIMEOUT_MS // 1000)
    try:
        consumer = client.subscribe(topic, "front-door-cpp", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        send_results: list[Any] = []
        sent = [f"cpp-{i}" for i in range(count)]
        for value in sent:
            producer.send_async(value.encode(), lambda res, _msg_id: send_results.append(res))
        producer.flush()
        times: dict[str, int] = {}
        topics: set[str] = set()
        wait_ms = 30_000
        while True:
            try:
                msg = consumer.receive(timeout_millis=wait_ms)
            except pulsar.Timeout:
                break
            value = msg.data().decode()
            times[value] = times.get(value, 0) + 1
            topics.add(msg.topic_name())
            consumer.acknowledge(msg)
            # Once everything is in, a short wait catches a late duplicate.
            wait_ms = 500 if sum(times.values()) >= count else 30_000
        return {"sent": count, "failed_sends": sum(1 for r in send_results if r != pulsar.Result.Ok),
                "received": sum(times.values()), "distinct": len(times),
                "duplicates": sum(1 for n in times.values() if n > 1),
                "missing": sum(1 for v in sent if v not in times), "unexpected": len(set(times) - set(sent)),
                "partitions": len(topics)}
    finally:
        client.close()


@PARTITIONS
def test_cpp_produce_consume(front_door_server: TcServerProcess, pulsar_broker: PulsarBroker,
                             partitions: int) -> None:
    topic = new_topic(pulsar_broker, "cpp-pc", partitions)
    result = cpp_produce_consume(front_door_server.url, topic, MESSAGES)
    assert result["failed_sends"] == 0, result
    exactly_once(result, MESSAGES)
    assert result["partitions"] == max(1, partitions), result


# ---- the coordinator scenarios of tests/interop, with an upstream ------------------------------------------


@pytest.mark.parametrize("client", ["java", "go"])
def test_transactions_behind_the_front_door(client: str, request: pytest.FixtureRequest,
                                            front_door_server: TcServerProcess) -> None:
    """tests/interop's concurrent scenario against a tc-server that also forwards: the coordinator part
    behaves the same with an upstream (16 coordinators, unique ids, every header as the client was told)."""
    harness: Harness = request.getfixturevalue(f"{client}_harness")
    count = 200
    run = harness.run("concurrent", timeout_s=HARNESS_TIMEOUT_S, service_url=front_door_server.url, count=count)
    check_concurrent(run, front_door_server, count)


# ---- --lookup-connections: where producers and consumers connect -------------------------------------------


async def broker_says_proxy(broker: PulsarBroker, topic: str) -> bool:
    """The broker's own LOOKUP answer (asked directly): does it want clients to come through the service URL?"""
    client = await connect("127.0.0.1", broker.port)
    try:
        answer = await client.lookup(topic)
    finally:
        client.close()
    assert answer.response is LookupType.CONNECT, answer
    return bool(answer.proxy_through_service_url)


@pytest.mark.parametrize("mode", ["upstream", "direct", "proxy"])
def test_lookup_connection_modes(java_harness: Harness, pulsar_broker: PulsarBroker, mode: str,
                                 tmp_path: Path) -> None:
    topic = new_topic(pulsar_broker, f"mode-{mode}", 4)
    through_tc = {"direct": False, "proxy": True}.get(mode)
    if through_tc is None:
        through_tc = asyncio.run(broker_says_proxy(pulsar_broker, f"{topic}-partition-0"))
    server = start_front_door(pulsar_broker.url, tmp_path, "--lookup-connections", mode)
    try:
        run = java_harness.run("produce-consume", timeout_s=HARNESS_TIMEOUT_S, service_url=server.url,
                               topic=topic, count=MESSAGES, op_timeout_ms=OP_TIMEOUT_MS)
        result = result_of(run, server)
    finally:
        server.stop()
    exactly_once(result, MESSAGES)
    connections = result["producer_connections"] + result["consumer_connections"]
    assert len(connections) == 8 and None not in connections, result
    for connection in connections:
        if through_tc:
            # Connected to tc-server, naming the broker in CONNECT's proxy_to_broker_url: relayed (relay.py).
            assert port_of(connection["remote"]) == server.port, (mode, connection)
            assert port_of(connection["proxy_to"]) == pulsar_broker.port, (mode, connection)
        else:
            assert port_of(connection["remote"]) == pulsar_broker.port, (mode, connection)
            assert connection["proxy_to"] is None, (mode, connection)
    print(f"--lookup-connections {mode}: producers and consumers connected "
          f"{'through tc-server' if through_tc else 'to the broker directly'}")


# ---- the broker stopped under a running tc-server, then started again ------------------------------------


async def requests_while_broker_down(server: TcServerProcess, topic: str) -> dict[str, Any]:
    """What our own wire client gets from tc-server while its upstream broker is down."""
    client = await connect("127.0.0.1", server.port)
    try:
        started = time.monotonic()
        # Bounded: a forwarded request must fail by itself within tc-server's request timeout.
        async with asyncio.timeout(REQUEST_TIMEOUT_S + 5):
            lookup = await client.lookup(topic)
            metadata = await client.partitioned_metadata(topic)
        elapsed = time.monotonic() - started
        # The coordinators are tc-server's own: discovering them does not need the broker.
        assign = await client.partitioned_metadata(ASSIGN_TOPIC)
        assign_lookup = await client.lookup(f"{ASSIGN_TOPIC}-partition-3")
    finally:
        client.close()
    return {"lookup": lookup, "metadata": metadata, "assign": assign, "assign_lookup": assign_lookup,
            "elapsed_s": elapsed}


def test_broker_stopped_then_started(java_harness: Harness, front_door_server: TcServerProcess,
                                     pulsar_broker: PulsarBroker) -> None:
    topic_before = new_topic(pulsar_broker, "outage-before", 0)
    try:
        pulsar_broker.stop()
        assert not pulsar_broker.running()

        seen = asyncio.run(requests_while_broker_down(front_door_server, topic_before))
        lookup, metadata = seen["lookup"], seen["metadata"]
        assert lookup.response is LookupType.FAILED and lookup.error is ServerError.MetadataError, lookup
        assert "unavailable" in (lookup.message or ""), lookup
        assert metadata.error is ServerError.MetadataError, metadata
        assert seen["assign"].error is None and seen["assign"].partitions == COORDINATORS, seen["assign"]
        assert seen["assign_lookup"].response is LookupType.CONNECT, seen["assign_lookup"]
        print(f"while the broker is down: LOOKUP and PARTITIONED_METADATA failed with MetadataError in "
              f"{seen['elapsed_s']:.2f} s")

        # The stock client's view: it builds (its coordinators are tc-server's), then creating the producer
        # fails with a typed exception within its operation timeout; no hang.
        run = java_harness.run("produce-consume", timeout_s=HARNESS_TIMEOUT_S, service_url=front_door_server.url,
                               topic=topic_before, count=10, op_timeout_ms=5_000, receive_timeout_ms=2_000)
        fatal = run.events("fatal")
        assert fatal, f"the client reported success with the broker down: {run.lines[-1:]}"
        error_class = fatal[-1]["error"]["class"]
        assert error_class.startswith("org.apache.pulsar.client.api.PulsarClientException"), fatal[-1]
        print("Java client with the broker down:", fatal[-1]["error"])
    finally:
        if not pulsar_broker.running():
            pulsar_broker.start()

    # The same tc-server (never restarted) forwards to the broker again: new producers and consumers work.
    topic_after = new_topic(pulsar_broker, "outage-after", 4)
    run = java_harness.run("produce-consume", timeout_s=HARNESS_TIMEOUT_S, service_url=front_door_server.url,
                           topic=topic_after, count=100, op_timeout_ms=OP_TIMEOUT_MS)
    exactly_once(result_of(run, front_door_server), 100)
    assert front_door_server.running()


async def lookup_through(server: TcServerProcess, topic: str, bound_s: float) -> tuple[Any, float]:
    """One LOOKUP through tc-server on a fresh client connection, bounded by ``bound_s``; (answer, seconds)."""
    client = await connect("127.0.0.1", server.port)
    try:
        started = time.monotonic()
        async with asyncio.timeout(bound_s):
            answer = await client.lookup(topic)
        return answer, time.monotonic() - started
    finally:
        client.close()


def test_hung_broker_answers_within_the_request_timeout(pulsar_broker: PulsarBroker, tmp_path: Path) -> None:
    """A broker that accepts TCP but never answers (its JVM stopped with SIGSTOP): the forwarded LOOKUP is
    answered MetadataError by tc-server itself, naming --request-timeout-s; once the broker runs again
    the same tc-server forwards again."""
    topic = new_topic(pulsar_broker, "hung", 0)
    request_timeout_s = 3
    server = start_front_door(pulsar_broker.url, tmp_path, "--request-timeout-s", str(request_timeout_s))
    assert pulsar_broker.proc is not None
    try:
        os.kill(pulsar_broker.proc.pid, signal.SIGSTOP)
        try:
            answer, elapsed = asyncio.run(lookup_through(server, topic, request_timeout_s + 10))
        finally:
            os.kill(pulsar_broker.proc.pid, signal.SIGCONT)
        assert answer.response is LookupType.FAILED and answer.error is ServerError.MetadataError, answer
        print(f"LOOKUP with the broker hung: {answer.error.name} after {elapsed:.2f} s: {answer.message}")
        answer, _ = asyncio.run(lookup_through(server, topic, REQUEST_TIMEOUT_S + 30))
        assert answer.response is LookupType.CONNECT, answer
    finally:
        server.stop()


async def lookup_with_listener(host: str, port: int, topic: str, listener: str) -> Any:
    """LOOKUP naming an advertised listener, the frame built from the generated protobuf class: what a
    client sends, not what our codec makes of it."""
    client = await connect(host, port)
    try:
        request_id = client.next_request_id()
        command = pb.BaseCommand(type=pb.BaseCommand.LOOKUP)
        command.lookupTopic.topic = topic
        command.lookupTopic.request_id = request_id
        command.lookupTopic.advertised_listener_name = listener
        answer, _ = await client.request_frame(encode_frame(command.SerializeToString()), request_id, 30)
        return answer
    finally:
        client.close()


def test_lookup_keeps_the_advertised_listener_name(front_door_server: TcServerProcess,
                                                   pulsar_broker: PulsarBroker) -> None:
    """A client's advertised_listener_name reaches the broker: the broker has no listener of that name and
    says so, through tc-server as directly (a re-encoded LOOKUP would drop the field and get the default
    listener's URL instead). The broker says it with ServiceNotReady, which tc-server passes on as
    MetadataError with the broker's message (upstream.py: ServiceNotReady makes the Java client drop the
    connection that carries its coordinator handlers)."""
    topic = new_topic(pulsar_broker, "listener", 0)
    direct = asyncio.run(lookup_with_listener("127.0.0.1", pulsar_broker.port, topic, "no-such-listener"))
    through = asyncio.run(lookup_with_listener("127.0.0.1", front_door_server.port, topic, "no-such-listener"))
    print("direct:", direct, "through tc-server:", through)
    assert (direct.response, direct.error) == (LookupType.FAILED, ServerError.ServiceNotReady), direct
    assert (through.response, through.error) == (LookupType.FAILED, ServerError.MetadataError), through
    assert direct.message and direct.message in (through.message or ""), (through, direct)
