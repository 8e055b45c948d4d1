"""The front door (tc_server/server/upstream.py) against broker stand-ins: what tc-server does with
answers and failures a real broker cannot produce on cue (a REDIRECT to a chosen broker, a URL that
does not parse, a broker that stops answering or reading).

The stand-ins are in-process servers on real sockets speaking the Pulsar framing, so tc-server's own
connections, timeouts and socket buffers are the ones under test. The real broker's side of the front
door is tests/e2e/test_front_door.py.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest
from structlog.testing import capture_logs

from tc_server._proto import pulsar_tc_pb2 as pb
from tc_server.app import App, start_app
from tc_server.client import (
    ClientAuth,
    ConnectionClosed,
    HandshakeRefused,
    PulsarConnection,
    TcClient,
    connect,
    connect_command,
    open_connection,
)
from tc_server.config import ConfigError, Settings
from tc_server.metrics import Metrics
from tc_server.server import connection as connection_module
from tc_server.server import relay as relay_module
from tc_server.server import upstream as upstream_module
from tc_server.server.connection import NO_REQUEST_ID
from tc_server.server.upstream import MAX_UNSENT_BYTES, ForwardingSession, Upstream
from tc_server.wire import (
    AuthChallenge,
    Connect,
    Connected,
    Error,
    FeatureFlags,
    FrameDecoder,
    Lookup,
    LookupResponse,
    LookupType,
    PartitionedMetadataResponse,
    Ping,
    ServerError,
    decode_command,
    encode_command,
    encode_frame,
)
from tests.security.support import raw_connect
from tests.support.stand_in_broker import StandInBroker, connect_to, redirect_to
from tests.support.waiting import async_wait_for

TOPIC = "persistent://public/default/orders"

@asynccontextmanager
async def front_door(settings: Settings, upstream: list[StandInBroker], others: tuple[StandInBroker, ...] = (),
                     request_timeout_s: float = 2.0) -> AsyncIterator[tuple[App, TcClient]]:
    """A tc-server whose --upstream-url names the ``upstream`` brokers (in this order), ``others`` started
    too (brokers that only answers name), and a client of it; all stopped after."""
    brokers = [*upstream, *others]
    for broker in brokers:
        await broker.start()
    app = await start_app(replace(settings, upstream_url=",".join(b.url for b in upstream),
                                  request_timeout_s=request_timeout_s))
    client = await connect("127.0.0.1", app.listeners[0].port)
    try:
        yield app, client
    finally:
        client.close()
        await app.stop()
        for broker in brokers:
            broker.stop()


async def test_a_followed_redirect_keeps_the_clients_listener_name_and_properties(settings):
    # The broker a REDIRECT names must see the client's advertised_listener_name and properties as much
    # as the first: without them it answers with the default listener's URL, which a client that asked
    # for another listener may not reach. Before, redirects were re-encoded without both fields.
    target = StandInBroker(connect_to("pulsar://internal:6650"))
    first = StandInBroker(lambda lookup: redirect_to(target.url)(lookup))
    async with front_door(settings, [first], (target,)) as (_, client):
        request_id = client.next_request_id()
        base = pb.BaseCommand(type=pb.BaseCommand.LOOKUP)
        base.lookupTopic.topic = TOPIC
        base.lookupTopic.request_id = request_id
        base.lookupTopic.advertised_listener_name = "external"
        base.lookupTopic.properties.add(key="region", value="eu")
        answer, _ = await client.request_frame(encode_frame(base.SerializeToString()), request_id, 5)
        assert isinstance(answer, LookupResponse) and answer.response is LookupType.CONNECT, answer
        seen = [pb.BaseCommand.FromString(frame).lookupTopic for frame in first.lookup_frames + target.lookup_frames]
        assert [(m.advertised_listener_name, [(p.key, p.value) for p in m.properties]) for m in seen] == [
            ("external", [("region", "eu")])] * 2
        assert [m.request_id for m in seen] == [request_id] * 2


@pytest.mark.parametrize("answer", [
    LookupResponse(0, LookupType.CONNECT, broker_service_url="pulsar://broker-1"),  # no port
    LookupResponse(0, LookupType.REDIRECT, broker_service_url="http://broker-1:8080"),
    LookupResponse(0, LookupType.CONNECT, broker_service_url="pulsar://broker-1:6650",
                   broker_service_url_tls="pulsar+ssl://broker-1:port"),
], ids=["connect-without-port", "redirect-to-http", "connect-with-a-bad-tls-url"])
async def test_a_broker_url_that_does_not_parse_fails_the_lookup_with_a_typed_answer(settings, answer):
    # Before, Endpoint.parse's ValueError escaped the forward: the client got no answer at all and
    # waited out its own operation timeout.
    bad_url = answer.broker_service_url_tls or answer.broker_service_url
    broker = StandInBroker(lambda lookup: replace(answer, request_id=lookup.request_id))
    async with front_door(settings, [broker], request_timeout_s=10.0) as (_, client):
        async with asyncio.timeout(5.0):  # well inside tc-server's request timeout
            failed = await client.lookup(TOPIC)
        assert failed.response is LookupType.FAILED and failed.error is ServerError.MetadataError, failed
        assert bad_url in (failed.message or ""), failed
        # The client's connection and its forwarding go on.
        assert (await client.lookup(TOPIC)).response is LookupType.FAILED


@pytest.mark.parametrize("host", ["a..b", "x" * 64 + ".example", "a\x00b"], ids=["empty-label", "label-over-63", "nul"])
async def test_a_redirect_to_a_host_name_that_cannot_be_encoded_fails_the_lookup_with_a_typed_answer(settings, host):
    # Found by a review: the resolver's UnicodeError (a ValueError) escaped the forward, and the client got no
    # answer at all (its operation timeout), with a traceback logged per lookup.
    broker = StandInBroker(lambda lookup: LookupResponse(lookup.request_id, LookupType.REDIRECT,
                                                         broker_service_url=f"pulsar://{host}:6650"))
    with capture_logs() as logged:
        async with front_door(settings, [broker], request_timeout_s=10.0) as (_, client):
            async with asyncio.timeout(5.0):  # well inside tc-server's request timeout
                failed = await client.lookup(TOPIC)
            assert failed.response is LookupType.FAILED and failed.error is ServerError.MetadataError, failed
            # Named as the resolver got it: escaped when tc-server says it is invalid (asyncio's loop), or in the URL
            # as it is when the resolver refused it (uvloop's: "Name or service not known").
            message = failed.message or ""
            assert repr(host)[1:-1] in message or f"pulsar://{host}:6650" in message, failed
            assert (await client.lookup(TOPIC)).response is LookupType.FAILED  # the connection goes on
    assert not [line for line in logged if line.get("exc_info")], logged


async def ask_to_be_relayed(app: App, owner: StandInBroker, **connect_fields: Any) -> asyncio.StreamWriter:
    """A raw client connection to ``app`` whose CONNECT asks to be carried to ``owner`` (proxy_to_broker_url)."""
    _, writer = await asyncio.open_connection("127.0.0.1", app.listeners[0].port)
    writer.write(encode_command(replace(connect_command(), proxy_to_broker_url=f"127.0.0.1:{owner.port}",
                                        **connect_fields)))
    return writer


async def test_concurrent_redirects_to_one_broker_share_one_connection(settings):
    # Before, each lookup redirected while the connection to the target was still opening opened one
    # more; only the last stored was closed when the client left, the others stayed open for good.
    target = StandInBroker(connect_to("pulsar://broker-1:6650"), connect_delay_s=0.3)
    first = StandInBroker(lambda lookup: redirect_to(target.url)(lookup))
    async with front_door(settings, [first], (target,)) as (_, client):
        answers = await asyncio.gather(*(client.lookup(f"{TOPIC}-{i}") for i in range(5)))
        assert all(a.response is LookupType.CONNECT for a in answers), answers
        assert target.connections_total == 1
        client.close()
        assert await async_wait_for(lambda: not target.open and not first.open)


async def test_a_connection_still_opening_when_the_client_leaves_is_closed(settings):
    # Before, the redirect target's connection finished opening after the client had left and was
    # stored anyway, open for good.
    target = StandInBroker(connect_to("pulsar://broker-1:6650"), connect_delay_s=1.0)
    first = StandInBroker(lambda lookup: redirect_to(target.url)(lookup))
    async with front_door(settings, [first], (target,)) as (_, client):
        client.send(Lookup(TOPIC, client.next_request_id()))
        assert await async_wait_for(lambda: target.connections_total == 1)
        client.close()  # while tc-server waits for the target's CONNECTED
        assert await async_wait_for(lambda: not target.open and not first.open)


async def test_a_connection_opening_past_a_forwards_deadline_is_kept_for_the_next_and_closed_with_the_client(
        settings):
    # The first lookup's deadline (4 s) passes while the redirect target's handshake is under way (from 1.5 s to
    # 4.5 s); the second lookup is answered at ~5.5 s, well inside its own (8 s; with 2 s and a 1 s handshake, only
    # half a second was left to a slow machine). Before, the deadline cancelled that opening and left the
    # half-open connection to itself: neither closed nor remembered, it stayed open after the client left.
    target = StandInBroker(connect_to("pulsar://broker-1:6650"), connect_delay_s=3.0)
    first = StandInBroker(lambda lookup: redirect_to(target.url)(lookup), lookup_delay_s=1.5)
    async with front_door(settings, [first], (target,), request_timeout_s=4.0) as (_, client):
        timed_out = await client.lookup(TOPIC)
        assert timed_out.response is LookupType.FAILED and "did not answer" in (timed_out.message or ""), timed_out
        assert (await client.lookup(TOPIC)).response is LookupType.CONNECT
        assert target.connections_total == 1  # the opening went on and served the second lookup
        client.close()
        assert await async_wait_for(lambda: not target.open and not first.open)


def sessions(app: App) -> list[ForwardingSession]:
    return [c._forwarding for c in app.context.connections if c._forwarding is not None]


async def test_an_answer_larger_than_the_clients_frames_may_be_is_refused_typed(settings):
    # A broker whose maxMessageSize is above tc-server's answers a pattern consumer's topic list (or a schema)
    # in a frame larger than tc-server's CONNECTED let the client expect: relayed, the Java client's decoder
    # failed its whole connection to tc-server, coordinators included, on every retry (a review).
    big = "x" * (2 << 20)
    broker = StandInBroker(metadata_answer=lambda request: PartitionedMetadataResponse(request.request_id, 1,
                                                                                        message=big))
    async with front_door(replace(settings, max_message_size=1 << 20), [broker]) as (_, client):
        refused = await client.partitioned_metadata(TOPIC)
        assert refused.error is ServerError.UnknownError, refused
        assert "--max-message-size" in (refused.message or "") and "PARTITIONED_METADATA" in (refused.message or "")
        # The client's connection goes on.
        assert (await client.partitioned_metadata(TOPIC)).error is ServerError.UnknownError


async def test_a_closed_upstream_connection_is_forgotten(settings):
    # Each broker a redirect named kept its connection's entry, closed or not, as long as the client stayed.
    target = StandInBroker(connect_to("pulsar://broker-1:6650"))
    first = StandInBroker(lambda lookup: redirect_to(target.url)(lookup))
    async with front_door(settings, [first], (target,)) as (app, client):
        assert (await client.lookup(TOPIC)).response is LookupType.CONNECT
        (session,) = sessions(app)
        assert len(session._connections) == 2
        target.stop()
        assert await async_wait_for(lambda: list(session._connections) == [upstream_module.PRIMARY])


async def two_lookups_time_out_then_the_next_url_answers(app: App, client: TcClient) -> None:
    """Two lookups time out on the first upstream URL's hung broker; once it has owed an answer for two request
    timeouts it is given up, and the next two lookups are answered by the second URL. The wait is on the owed
    time itself, not on a third lookup coming late enough: the silence counts from the first request's send,
    after the connection's opening, so on a slow machine two timed-out lookups ended a little before two
    timeouts of silence had passed (a CI run's third lookup was forwarded to the hung broker once more)."""
    timed_out = [await client.lookup(TOPIC) for _ in range(2)]
    assert all(a.response is LookupType.FAILED and "did not answer" in (a.message or "") for a in timed_out), timed_out
    (session,) = sessions(app)
    hung = session._connections[upstream_module.PRIMARY]
    limit_s = 2 * app.settings.request_timeout_s
    assert await async_wait_for(lambda: hung.owed_answer_for() >= limit_s)
    answers = [await client.lookup(TOPIC) for _ in range(2)]
    assert [a.response for a in answers] == [LookupType.CONNECT] * 2, answers


async def test_a_hung_upstream_broker_is_given_up_for_the_next_url(settings):
    # The first upstream URL answers CONNECT, then nothing (a hung broker); the second is healthy.
    # Before, the connection whose requests timed out stayed "usable" for good: every forwarded request
    # of the client timed out, and the second URL was never tried.
    hung = StandInBroker(answers=False)
    healthy = StandInBroker(connect_to("pulsar://broker-1:6650"))
    async with front_door(settings, [hung, healthy], request_timeout_s=1.0) as (app, client):
        await two_lookups_time_out_then_the_next_url_answers(app, client)
        assert healthy.connections_total == 1
        assert await async_wait_for(lambda: not hung.open)
        assert app.metrics.upstream_up.labels(hung.url)._value.get() == 0


async def test_a_broker_that_answers_keepalives_but_no_lookups_is_given_up_for_the_next_url(settings):
    # Its I/O thread answers PINGs while its lookups hang (its metadata store stuck): each PONG counted as an
    # answer, so it never owed one long enough to be given up, and every forward timed out on it (a review).
    hung = StandInBroker(lambda lookup: None)
    healthy = StandInBroker(connect_to("pulsar://broker-1:6650"))
    async with front_door(replace(settings, keepalive_s=0.5), [hung, healthy], request_timeout_s=1.0) as (app, client):
        await two_lookups_time_out_then_the_next_url_answers(app, client)
        assert hung.lookup_frames and healthy.connections_total == 1


async def test_a_broker_idle_since_its_one_unanswered_lookup_is_asked_again_before_it_is_given_up(settings):
    # Keep-alive traffic is no answer, so the owed time of one lookup it never answered kept growing while the
    # connection sat idle: the next lookup, however much later, gave up a healthy broker (a review).
    asked = []

    def all_but_the_first(lookup: Lookup) -> LookupResponse | None:
        asked.append(lookup)
        return connect_to("pulsar://broker-1:6650")(lookup) if len(asked) > 1 else None

    first = StandInBroker(all_but_the_first)
    second = StandInBroker(connect_to("pulsar://broker-2:6650"))
    async with front_door(replace(settings, keepalive_s=0.5), [first, second], request_timeout_s=1.0) as (_, client):
        assert (await client.lookup(TOPIC)).response is LookupType.FAILED
        await asyncio.sleep(2.5)  # idle past twice the request timeout, keep-alives going both ways
        answer = await client.lookup(TOPIC)
        assert (answer.response, answer.broker_service_url) == (LookupType.CONNECT, "pulsar://broker-1:6650"), answer
        assert second.connections_total == 0


async def test_a_broker_that_stops_reading_does_not_make_forwarded_bytes_pile_up(settings):
    # After CONNECTED the broker reads nothing more. Before, every forwarded frame stayed in the upstream
    # connection's write buffer after its forward had timed out: 100 MB more per 500 lookups of 200 KB,
    # for as long as the client kept sending. Now the connection is given up past MAX_UNSENT_BYTES, its
    # waiting forwards answered at once, and a fresh one takes the next.
    broker = StandInBroker(reads=False)
    async with front_door(settings, [broker], request_timeout_s=1.0) as (app, client):
        topic = "persistent://public/default/" + "x" * (200 * 1024)
        seen: set[PulsarConnection] = set()
        for _ in range(3):
            request_ids = [client.next_request_id() for _ in range(150)]  # 30 MB
            answers = await asyncio.gather(*(client.request(Lookup(topic, request_id), 10.0)
                                             for request_id in request_ids))
            assert {a.response for a in answers} == {LookupType.FAILED}
            assert {a.error for a in answers} == {ServerError.MetadataError}
            assert any("given up: the broker is not reading" in (a.message or "") for a in answers), answers
            current = {conn for session in sessions(app) for conn in session._connections.values()}
            unsent = sum(conn.unsent_bytes for conn in current)
            assert unsent <= MAX_UNSENT_BYTES + 2 * len(topic), unsent
            seen |= current
        # The connections given up are gone, their unsent bytes with them.
        assert len(seen) >= 3 and all(conn.closed.done() for conn in seen - current)


async def test_forwards_that_waited_for_a_fresh_connection_check_it_before_writing(settings):
    # The first forward of a burst finds the connection hung (it has owed an answer for two timeouts)
    # and opens a fresh one; the other 149 wait for it (the broker is slow to answer CONNECT). Before,
    # they all wrote to it unchecked once it was open: 27 MB left with a broker that reads nothing,
    # whatever MAX_UNSENT_BYTES said (the test above failed in CI when this path was taken).
    broker = StandInBroker(reads=False)
    async with front_door(settings, [broker], request_timeout_s=0.5) as (app, client):
        topic = "persistent://public/default/" + "x" * (200 * 1024)
        first = await client.request(Lookup(topic, client.next_request_id()), 10.0)
        assert first.response is LookupType.FAILED
        hung = {conn for session in sessions(app) for conn in session._connections.values()}
        broker.connect_delay_s = 0.2  # the whole burst arrives while the fresh connection opens
        # Until it has owed an answer for two timeouts (its silence counts from the send, not from this
        # test's lookup): a burst sent sooner found it usable, and the test no longer took the path it is for.
        assert await async_wait_for(lambda: all(conn.owed_answer_for() >= 2 * 0.5 for conn in hung))
        request_ids = [client.next_request_id() for _ in range(150)]  # 30 MB
        await asyncio.gather(*(client.request(Lookup(topic, request_id), 10.0) for request_id in request_ids))
        assert len(hung) == 1 and all(conn.closed.done() for conn in hung)
        current = {conn for session in sessions(app) for conn in session._connections.values()}
        assert sum(conn.unsent_bytes for conn in current) <= MAX_UNSENT_BYTES + 2 * len(topic)


async def test_an_idle_upstream_connection_to_a_broker_that_stopped_answering_is_closed_by_keepalive(settings):
    # Before, upstream connections had no keep-alive: an idle one to a hung broker stayed for good.
    broker = StandInBroker(connect_to("pulsar://broker-1:6650"))
    async with front_door(replace(settings, keepalive_s=0.5), [broker]) as (_, client):
        assert (await client.lookup(TOPIC)).response is LookupType.CONNECT
        broker.answers = False
        assert await async_wait_for(lambda: not broker.open)
        broker.answers = True
        assert (await client.lookup(TOPIC)).response is LookupType.CONNECT  # on a fresh connection
        assert broker.connections_total == 2


async def test_failed_forwards_are_logged_once_per_interval(settings):
    # Before, each failed forward wrote an info line: a client can make as many fail as it likes.
    broker = StandInBroker(answers=False)
    with capture_logs() as server_log:
        async with front_door(settings, [broker], request_timeout_s=0.5) as (_, client):
            answers = await asyncio.gather(*(client.lookup(TOPIC) for _ in range(200)))
            assert {a.response for a in answers} == {LookupType.FAILED}
    lines = [e for e in server_log if e["event"] == "forwarded request failed"]
    # One a second: the 200 deadlines pass together, over more than a second only on a slow machine (CI).
    assert 1 <= len(lines) <= 2, lines


@pytest.mark.parametrize("then", [Ping(), AuthChallenge("stand-in", "token", b"refresh", 21)],
                         ids=["ping", "auth-challenge"])
async def test_a_refused_handshake_with_more_in_the_same_read_fails_cleanly(then):
    # A broker answers CONNECT with ERROR and, in the same segment, a PING (or AUTH_CHALLENGE). The ERROR
    # closes tc-server's side; before, answering the next frame raised ConnectionClosed out of
    # data_received (asyncio then force-closes the transport; being an OSError, it is logged at debug
    # level only, so the test records what data_received raised).
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(encode_command(Error(NO_REQUEST_ID, ServerError.AuthenticationError, "no"))
                     + encode_command(then))
        await reader.read(65536)
        writer.close()

    raised: list[BaseException] = []

    class Recording(PulsarConnection):
        def data_received(self, data: bytes) -> None:
            try:
                super().data_received(data)
            except BaseException as exc:
                raised.append(exc)
                raise

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    url = f"pulsar://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        with pytest.raises(HandshakeRefused):
            await open_connection(url, timeout_s=2.0, factory=lambda: Recording(url))
        await asyncio.sleep(0.1)
        assert raised == []
    finally:
        server.close()


async def test_a_brokers_service_not_ready_reaches_the_client_as_metadata_error(settings):
    # The Java client closes its whole connection on a FAILED lookup or partition-metadata answer with
    # ServiceNotReady (ClientCnx.checkServerError). Its connection to a broker can go; its connection to
    # tc-server carries its coordinator handlers, which then reconnect and resend. A broker says
    # ServiceNotReady routinely (a bundle unloading, a broker starting): relayed as MetadataError, which
    # the clients retry as well, with the broker's message.
    broker = StandInBroker(
        lambda lookup: LookupResponse(lookup.request_id, LookupType.FAILED, error=ServerError.ServiceNotReady,
                                      message="Namespace bundle is being unloaded"),
        metadata_answer=lambda request: PartitionedMetadataResponse(
            request.request_id, error=ServerError.ServiceNotReady, message="broker is starting"))
    async with front_door(settings, [broker]) as (_, client):
        failed = await client.lookup(TOPIC)
        assert (failed.response, failed.error) == (LookupType.FAILED, ServerError.MetadataError), failed
        message = failed.message or ""
        assert "Namespace bundle is being unloaded" in message and "ServiceNotReady" in message, failed
        metadata = await client.partitioned_metadata(TOPIC)
        assert metadata.error is ServerError.MetadataError, metadata
        assert "broker is starting" in (metadata.message or ""), metadata


async def test_a_brokers_service_not_ready_error_reaches_the_client_as_metadata_error(settings):
    # The same for a request a broker refuses with ERROR (GET_TOPICS_OF_NAMESPACE, a pattern consumer's):
    # it reached the client unchanged, and the Java client closed its connection to tc-server.
    class Refusing(StandInBroker):
        async def _on_frame(self, frame: bytes, writer: asyncio.StreamWriter) -> None:
            base = pb.BaseCommand.FromString(frame)
            if base.type == pb.BaseCommand.GET_TOPICS_OF_NAMESPACE:
                writer.write(encode_command(Error(base.getTopicsOfNamespace.request_id, ServerError.ServiceNotReady,
                                                  "broker is starting")))
                return
            await super()._on_frame(frame, writer)

    async with front_door(settings, [Refusing()]) as (_, client):
        request_id = client.next_request_id()
        base = pb.BaseCommand(type=pb.BaseCommand.GET_TOPICS_OF_NAMESPACE)
        base.getTopicsOfNamespace.request_id = request_id
        answer, _ = await client.request_frame(encode_frame(base.SerializeToString()), request_id, 5)
        assert isinstance(answer, Error) and answer.error is ServerError.MetadataError, answer
        assert "broker is starting" in (answer.message or ""), answer


async def test_a_redirect_loop_fails_the_lookup_with_metadata_error(settings):
    looping = StandInBroker()
    looping.answer = lambda lookup: redirect_to(looping.url)(lookup)
    async with front_door(settings, [looping]) as (_, client):
        failed = await client.lookup(TOPIC)
        assert (failed.response, failed.error) == (LookupType.FAILED, ServerError.MetadataError), failed
        assert "lookup redirects" in (failed.message or "")


async def test_a_proxied_connection_to_a_broker_this_instance_has_not_seen_yet_is_refused_as_retryable(settings):
    # Several tc-server processes behind one address (replicas behind a Service, or --workers N on one
    # port): a client's LOOKUP went through one of them, its proxied connection lands on another, which
    # learns brokers only from the lookups it answers. It said NotAllowedError, which the Java client
    # does not retry: the producer failed. ServiceNotReady before CONNECTED is a failed connection the
    # client opens again (another instance, or this one once a lookup named the broker).
    owner = StandInBroker()  # the broker that owns TOPIC, named by the upstream's lookup answer
    upstream = StandInBroker(lambda lookup: connect_to(owner.url)(lookup))
    async with front_door(settings, [upstream], (owner,)) as (app, client):
        other = await start_app(replace(settings, upstream_url=upstream.url, request_timeout_s=2.0))
        try:
            proxied = replace(connect_command(), proxy_to_broker_url=f"127.0.0.1:{owner.port}")
            assert (await client.lookup(TOPIC)).response is LookupType.CONNECT  # through the first only
            refused = await raw_connect(other.listeners[0].port, proxied)
            assert refused.closed_by_server
            assert [(c.error, "retry" in c.message) for c in refused.commands if isinstance(c, Error)] == [
                (ServerError.ServiceNotReady, True)], refused.commands
            carried = await raw_connect(app.listeners[0].port, proxied, until=bool)  # the first has seen it: carried
            assert [type(c) for c in carried.commands] == [Connected], carried.commands
        finally:
            await other.stop()


class TokenCheckingBroker(StandInBroker):
    """A broker that takes only the token it is told is valid now (``valid``), at CONNECT."""

    def __init__(self, valid: bytes) -> None:
        super().__init__(lambda lookup: connect_to("pulsar://broker-1:6650")(lookup))
        self.valid = valid

    async def _on_frame(self, frame: bytes, writer: asyncio.StreamWriter) -> None:
        command = decode_command(frame)
        if isinstance(command, Connect) and command.auth_data != self.valid:
            self.connects.append(command)
            writer.write(encode_command(Error(NO_REQUEST_ID, ServerError.AuthenticationError, "token expired")))
            writer.close()
            return
        await super()._on_frame(frame, writer)


@pytest.mark.parametrize("refreshes", [True, False], ids=["client-refreshes", "client-cannot-refresh"])
async def test_a_client_whose_token_expired_at_the_broker_is_asked_for_a_fresh_one(settings, refreshes):
    # tc-server's own authentication off, the brokers checking tokens: forwarded requests carry the
    # client's token from its CONNECT. Once the broker refused it (expired), every forwarded request
    # failed with AuthenticationError for the rest of the client's connection, which itself stayed up,
    # so the client never sent a fresh token. Now tc-server asks the client for fresh credentials
    # (AUTH_CHALLENGE, as a broker does), or closes the connection of a client that cannot refresh
    # them (it reconnects with fresh ones); the request in between is answered MetadataError, retried.
    broker = TokenCheckingBroker(valid=b"first")
    async with front_door(settings, [broker]) as (app, _):
        flags = FeatureFlags(supports_auth_refresh=refreshes)
        client = await connect("127.0.0.1", app.listeners[0].port, handshake=False)
        connect_first = replace(connect_command(ClientAuth("token", b"first")), feature_flags=flags)
        await client.handshake(connect_first, timeout_s=5)
        try:
            assert (await client.lookup(TOPIC)).response is LookupType.CONNECT
            for conn in list(broker.open):  # the token expires; the broker drops the connection
                conn.close()
            broker.valid = b"second"
            client.auth_data_source = lambda: b"second"  # what the client's provider gives now
            failed = await client.lookup(TOPIC)
            assert (failed.response, failed.error) == (LookupType.FAILED, ServerError.MetadataError), failed
            if not refreshes:
                await asyncio.wait_for(client.closed, 5)
                return
            async with asyncio.timeout(5):
                while (await client.lookup(TOPIC)).response is not LookupType.CONNECT:
                    await asyncio.sleep(0.05)
            assert broker.connects[-1].auth_data == b"second"
        finally:
            client.close()


@pytest.mark.parametrize("fresh", [b"second", b"first"], ids=["expired-meanwhile", "wrong"])
async def test_a_token_refused_at_the_first_forward_is_asked_for_again_once(settings, fresh):
    # The client's service-URL connection lives as long as the client, and its first forwarded request (its
    # first producer) may come after the token of its CONNECT expired. A fresh one was asked for only when a
    # broker had taken the token before: here none had, so every forward of the connection failed with
    # AuthenticationError for its life (the client refreshes only when asked). Now the client is asked once;
    # a token that is simply wrong still ends in AuthenticationError, after that one retry.
    broker = TokenCheckingBroker(valid=b"second")
    async with front_door(settings, [broker]) as (app, _):
        client = await connect("127.0.0.1", app.listeners[0].port, handshake=False)
        connect_first = replace(connect_command(ClientAuth("token", b"first")),
                                feature_flags=FeatureFlags(supports_auth_refresh=True))
        await client.handshake(connect_first, timeout_s=5)
        client.auth_data_source = lambda: fresh  # what the client's token provider gives now
        try:
            failed = await client.lookup(TOPIC)
            assert (failed.response, failed.error) == (LookupType.FAILED, ServerError.MetadataError), failed
            async with asyncio.timeout(5):  # the challenge answered, the next forward carries the answer
                while broker.connects[-1].auth_data != fresh or len(broker.connects) < 2:
                    answer = await client.lookup(TOPIC)
                    await asyncio.sleep(0.05)
            if fresh == b"second":
                assert answer.response is LookupType.CONNECT, answer
            else:
                assert (answer.response, answer.error) == (LookupType.FAILED, ServerError.AuthenticationError), answer
                again = await client.lookup(TOPIC)
                assert again.error is ServerError.AuthenticationError, again
        finally:
            client.close()


def test_a_broker_not_named_by_a_lookup_for_an_hour_is_no_longer_carried_to(monkeypatch):
    # Every broker a lookup had named stayed a relay target for the process's life: brokers' addresses
    # (pod IPs) change with restarts and are given to other pods, which then got clients' credentials.
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    upstream = Upstream(["pulsar://upstream:6650"], request_timeout_s=2.0, connection_mode="upstream",
                        metrics=Metrics("test"), keepalive_s=30.0)
    upstream.note_broker("pulsar://10.0.0.7:6650", None)
    assert upstream.proxy_target("10.0.0.7:6650") == "pulsar://10.0.0.7:6650"
    now[0] += upstream_module.LEARNED_BROKER_TTL_S - 1
    upstream.note_broker("pulsar://10.0.0.7:6650", None)  # named again: kept
    now[0] += upstream_module.LEARNED_BROKER_TTL_S - 1
    assert upstream.proxy_target("10.0.0.7:6650") == "pulsar://10.0.0.7:6650"
    now[0] += 2
    assert upstream.proxy_target("10.0.0.7:6650") is None
    assert upstream.proxy_target("upstream:6650") == "pulsar://upstream:6650"  # configured: always


def producer_frame(request_id: int) -> bytes:
    """PRODUCER (5) for TOPIC, a command the codec reads no request id of."""
    producer = _field(1, TOPIC.encode()) + bytes([0x10, 1, 0x18, request_id])  # topic, producer_id, request_id
    return encode_frame(bytes([0x08, 5]) + _field(5, producer))


def _field(number: int, data: bytes) -> bytes:
    assert len(data) < 128
    return bytes([number << 3 | 2, len(data)]) + data


async def test_a_command_that_is_no_lookup_is_refused_not_forwarded(settings):
    # Everything without a route of its own went to the broker, PRODUCER and SEND included: with no request
    # id the codec could read, their answers were dropped as unsolicited (the client heard nothing), the
    # decoder had kept no payload (a SEND arrived without its message), and the broker's pushes for them
    # piled up toward a client that did not read. The README promised NotAllowedError.
    broker = StandInBroker(connect_to("pulsar://broker-1:6650"))
    seen: list[int] = []
    recorded = broker._on_frame

    async def recording(frame: bytes, writer: asyncio.StreamWriter) -> None:
        seen.append(pb.BaseCommand.FromString(frame).type)
        await recorded(frame, writer)

    broker._on_frame = recording  # type: ignore[method-assign]
    async with front_door(settings, [broker]) as (_, client):
        await client.lookup(TOPIC)  # forwarded, as before
        refused: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        client.set_listener(lambda cmd, frame: None if refused.done() else refused.set_result(cmd))
        client.send_raw(producer_frame(77))
        answer = await asyncio.wait_for(refused, 5)
        assert isinstance(answer, Error) and answer.error is ServerError.NotAllowedError, answer
        assert "forwards lookups only" in answer.message
        assert seen.count(pb.BaseCommand.LOOKUP) == 1 and 5 not in seen


async def test_a_relayed_connection_whose_broker_stopped_reading_is_closed_when_the_client_leaves(
        settings, monkeypatch):
    # The broker side was closed with transport.close(), which waits for its write buffer to drain: a
    # broker that stopped reading never drains it, and the socket stayed open, tracked by nothing.
    monkeypatch.setattr(connection_module, "CLOSE_FLUSH_S", 0.3)
    owner = StandInBroker(reads=False)
    upstream = StandInBroker()
    async with front_door(settings, [upstream], (owner,)) as (app, client):
        upstream.answer = connect_to(owner.url)
        await client.lookup(TOPIC)  # the owner is named: a proxied connection may go there
        writer = await ask_to_be_relayed(app, owner)
        await async_wait_for(lambda: any(c._relay is not None and c._relay.transport is not None
                                     for c in app.context.connections))
        (relayed,) = [c for c in app.context.connections if c._relay is not None]
        assert relayed._relay is not None and relayed._relay.transport is not None
        broker_side = relayed._relay.transport
        closed = asyncio.Event()
        relay_closed = relayed.relay_closed

        def noting(exc: Exception | None) -> None:
            closed.set()
            relay_closed(exc)

        relayed.relay_closed = noting  # type: ignore[method-assign]
        while not broker_side.get_write_buffer_size():  # the broker reads nothing: bytes wait in tc-server
            writer.write(b"y" * 65536)
            await asyncio.sleep(0.01)
        writer.close()  # the client leaves
        await asyncio.wait_for(closed.wait(), 10)  # the broker side is gone (it waited for good before)


async def test_a_redirect_to_a_plain_url_is_not_followed_from_a_tls_upstream():
    # A REDIRECT whose TLS field held a pulsar:// URL was followed in the clear with the client's token.
    class Redirecting:
        async def request_frame(self, frame: bytes, request_id: int) -> tuple[object, bytes]:
            answer = LookupResponse(request_id, LookupType.REDIRECT, broker_service_url="pulsar://b:6650",
                                    broker_service_url_tls="pulsar://b:6650")
            return answer, encode_command(answer)

    async def never(url: str) -> PulsarConnection:
        raise AssertionError(f"connected to {url}")

    answer, _ = await upstream_module.follow_lookup(Redirecting(), Lookup(TOPIC, 1), never,  # type: ignore[arg-type]
                                                    use_tls=True)
    assert isinstance(answer, LookupResponse) and (answer.response, answer.error) == (
        LookupType.FAILED, ServerError.MetadataError), answer
    assert "not a pulsar+ssl:// URL" in (answer.message or "")


def test_a_tls_upstream_carries_no_client_to_a_broker_named_by_a_plain_url_in_the_tls_field():
    upstream = Upstream(["pulsar+ssl://upstream:6651"], request_timeout_s=2.0, connection_mode="upstream",
                        metrics=Metrics("tls_field"), keepalive_s=30.0, ssl_context=ssl.create_default_context())
    upstream.note_broker("pulsar://10.0.0.7:6650", "pulsar://10.0.0.7:6650")
    assert upstream.proxy_target("10.0.0.7:6650") is None
    assert upstream.named_without_tls("10.0.0.7:6650")


def test_upstream_urls_of_both_schemes_are_refused():
    # With the TLS URL down, a client's token went to the plain one in the clear.
    with pytest.raises(ConfigError, match="upstream_url: must be all pulsar:// or all pulsar\\+ssl://"):
        replace(Settings(), upstream_url="pulsar+ssl://a:6651,pulsar://b:6650").validate()


async def test_a_relayed_connection_whose_broker_reads_nothing_is_closed_after_two_keepalives(settings):
    # The client is not read while the broker does not read, and the keep-alive runs end to end: a client
    # that left was never noticed, and both connections stayed open for good.
    owner = StandInBroker(reads=False)
    upstream = StandInBroker()
    async with front_door(replace(settings, keepalive_s=0.5), [upstream], (owner,)) as (app, client):
        upstream.answer = connect_to(owner.url)
        await client.lookup(TOPIC)
        writer = await ask_to_be_relayed(app, owner)
        await async_wait_for(lambda: any(c._relay is not None for c in app.context.connections))
        (relayed,) = [c for c in app.context.connections if c._relay is not None]
        with capture_logs() as logged:
            async with asyncio.timeout(30):  # a bound for a failing test, not a timing check
                while not relayed._closing:  # the client writes on; the broker reads nothing
                    writer.write(b"y" * 65536)
                    await asyncio.sleep(0.05)
        assert [line["waited_s"] for line in logged
                if line["event"] == "the broker of a relayed connection read nothing; closing it"] == [1.0]
        writer.close()


async def test_a_relayed_connection_whose_client_reads_nothing_is_closed_after_two_keepalives(settings):
    # The broker's side is not read while the client does not read: the broker's own close (its keep-alive,
    # which the silent client fails) went unnoticed, and the client's connection stayed open for good.
    broker_left = asyncio.Event()

    async def pushing_broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        while decoder.next_frame() is None:
            decoder.feed(await reader.read(65536))
        writer.write(encode_command(Connected("stand-in", 21)))
        for _ in range(200):  # 12.5 MiB toward a client that reads nothing
            writer.write(b"m" * 65536)
            await asyncio.sleep(0)
        await asyncio.sleep(0.5)
        writer.transport.abort()
        broker_left.set()

    owner = await asyncio.start_server(pushing_broker, "127.0.0.1", 0)
    owner_port = owner.sockets[0].getsockname()[1]
    upstream = StandInBroker(connect_to(f"pulsar://127.0.0.1:{owner_port}"))
    try:
        async with front_door(replace(settings, keepalive_s=0.5), [upstream]) as (app, client):
            await client.lookup(TOPIC)  # names the owner: tc-server may carry connections there
            silent = socket.socket()
            silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            silent.connect(("127.0.0.1", app.listeners[0].port))
            silent.sendall(encode_command(replace(connect_command(), proxy_to_broker_url=f"127.0.0.1:{owner_port}")))
            try:
                await async_wait_for(lambda: any(c._relay is not None for c in app.context.connections))
                (relayed,) = [c for c in app.context.connections if c._relay is not None]
                with capture_logs() as logged:
                    await asyncio.wait_for(broker_left.wait(), 10)
                    await async_wait_for(lambda: relayed._closing)
                assert [line["waited_s"] for line in logged
                        if line["event"] == "the client of a relayed connection read nothing; closing it"] == [1.0]
            finally:
                silent.close()
    finally:
        owner.close()


async def test_a_relay_slower_to_set_up_than_the_keepalive_interval_is_not_closed_for_it(settings, monkeypatch):
    # The setup is bounded by the upstream's request timeout (2 s here). Before, the keep-alive tick of
    # the connection's first interval took the setup for a client that never sent CONNECT and closed it.
    opening = relay_module.open_relay

    async def slow_network(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.8)  # two keep-alive intervals
        return await opening(*args, **kwargs)

    monkeypatch.setattr(connection_module, "open_relay", slow_network)
    owner = StandInBroker()
    upstream = StandInBroker()
    async with front_door(replace(settings, keepalive_s=0.4), [upstream], (owner,)) as (app, client):
        upstream.answer = connect_to(owner.url)
        await client.lookup(TOPIC)
        writer = await ask_to_be_relayed(app, owner)
        assert await async_wait_for(lambda: any(c._relay is not None for c in app.context.connections))
        assert not [c for c in app.context.connections if c._relay is not None][0]._closing
        assert await async_wait_for(lambda: len(owner.connects) == 1)  # the client's CONNECT reached the broker
        writer.close()


def test_the_brokers_learned_from_lookups_stay_within_their_bound(monkeypatch):
    # Past MAX_LEARNED_BROKERS with none expired, each address a lookup answer named was added all the same.
    monkeypatch.setattr(upstream_module, "MAX_LEARNED_BROKERS", 3)
    for ssl_context in (None, ssl.create_default_context()):
        upstream = Upstream(["pulsar://upstream:6650"], request_timeout_s=2.0, connection_mode="upstream",
                            metrics=Metrics("bound"), keepalive_s=30.0, ssl_context=ssl_context)
        for n in range(10):
            upstream.note_broker(f"pulsar://10.0.0.{n}:6650", None)
        assert len(upstream._named_at) == 3 and len(upstream._without_tls) <= 3
        assert upstream.proxy_target("upstream:6650") == "pulsar://upstream:6650"  # configured: always
    assert upstream.named_without_tls("10.0.0.9:6650") and not upstream.named_without_tls("10.0.0.0:6650")


async def test_a_relayed_connect_names_no_original_principal_for_a_client_that_is_no_proxy(settings):
    # Forwarded lookups dropped the original_* fields of a client whose role is not in --proxy-roles; a
    # relayed connection kept them, and a broker that honoured them would take the client for whomever
    # it named.
    owner = StandInBroker()
    upstream = StandInBroker()
    async with front_door(settings, [upstream], (owner,)) as (app, client):
        upstream.answer = connect_to(owner.url)
        await client.lookup(TOPIC)
        writer = await ask_to_be_relayed(app, owner, original_principal="admin", original_auth_method="token",
                                         original_auth_data="admin's token")
        await async_wait_for(lambda: bool(owner.connects))
        (relayed,) = owner.connects
        assert (relayed.original_principal, relayed.original_auth_method, relayed.original_auth_data) == (
            None, None, None)
        writer.close()


async def test_a_request_id_already_being_forwarded_is_refused_at_once(settings):
    # A second request of an id whose forward was not answered yet took that forward's place: the broker's
    # first answer went to the second, and the first waited out the request timeout (MetadataError). The
    # answers of one id cannot be told apart, so the second is refused at once, naming the problem.
    broker = StandInBroker(connect_to("pulsar://broker-a:6650"), lookup_delay_s=0.5)
    async with front_door(settings, [broker], request_timeout_s=5.0) as (app, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", app.listeners[0].port)
        writer.write(encode_command(Connect(client_version="test", protocol_version=21)))
        for _ in range(2):
            writer.write(encode_command(Lookup(topic=TOPIC, request_id=7)))
        decoder = FrameDecoder(5 * 1024 * 1024)
        answers: list[LookupResponse] = []
        async with asyncio.timeout(4.0):  # under the request timeout: no answer may be a timeout's
            while len(answers) < 2:
                decoder.feed(await reader.read(65536))
                while (frame := decoder.next_frame()) is not None:
                    if isinstance(answer := decode_command(frame), LookupResponse):
                        answers.append(answer)
        writer.close()
    refused, served = answers
    assert (refused.request_id, refused.response, refused.error) == (7, LookupType.FAILED,
                                                                     ServerError.NotAllowedError), refused
    assert "request id 7 is already in use" in (refused.message or ""), refused
    assert (served.request_id, served.response, served.broker_service_url) == (
        7, LookupType.CONNECT, "pulsar://broker-a:6650"), served
    assert len(broker.lookup_frames) == 1


class ConnectionRefusingBroker(StandInBroker):
    """Answers every CONNECT with ERROR (request id -1) and closes, as a broker past brokerMaxConnections or
    brokerMaxConnectionsPerIp does before any CONNECT is read (ServerCnx.channelActive)."""

    def __init__(self, error: ServerError, message: str) -> None:
        super().__init__(connect_to("pulsar://never:6650"))
        self.error = error
        self.message = message

    async def _on_frame(self, frame: bytes, writer: asyncio.StreamWriter) -> None:
        if isinstance(command := decode_command(frame), Connect):
            self.connects.append(command)
            writer.write(encode_command(Error(NO_REQUEST_ID, self.error, self.message)))
            writer.close()
            return
        await super()._on_frame(frame, writer)


@pytest.mark.parametrize(("error", "message"), [
    (ServerError.NotAllowedError, "Reached the maximum number of connections on address"),
    (ServerError.ServiceNotReady, "broker is starting")], ids=["connection-limit", "service-not-ready"])
@pytest.mark.parametrize("where", ["upstream-url", "redirect"])
async def test_a_broker_refusing_the_connection_itself_gives_the_client_a_retriable_error(settings, error, message,
                                                                                           where):
    # Every client's upstream connection comes from tc-server's one address, so a broker's per-address
    # connection limit is reached much sooner than by the clients themselves. Its refusal reached the client
    # as the broker's NotAllowedError ("refused the client's credentials"), which the Java client takes as
    # final: the producer failed for good; and ServiceNotReady made it close its connection to tc-server.
    refusing = ConnectionRefusingBroker(error, message)
    upstream: list[StandInBroker]
    others: tuple[StandInBroker, ...]
    if where == "upstream-url":
        upstream, others = [refusing], ()
    else:  # a broker the upstream's lookup answer redirects to (its port known once started)
        upstream, others = [StandInBroker(lambda lookup: redirect_to(refusing.url)(lookup))], (refusing,)
    async with front_door(settings, upstream, others) as (app, client):
        lookup = await client.lookup(TOPIC)
        metadata = await client.partitioned_metadata(TOPIC) if where == "upstream-url" else None
        failed = {labels[1] for labels in app.metrics.forwarded_total._metrics}
    assert refusing.connects, "the broker never saw tc-server's CONNECT"
    assert (lookup.response, lookup.error) == (LookupType.FAILED, ServerError.MetadataError), lookup
    assert f"{error.name}: {message}" in (lookup.message or "") and "credentials" not in (lookup.message or "")
    if metadata is not None:
        assert metadata.error is ServerError.MetadataError, metadata
        # As a failed connection: TcServerUpstreamUnreachable counts it (deploy/prometheus/alerts.yml).
        assert failed == {"ConnectionFailed"}, failed


async def test_a_broker_past_its_connection_limit_leaves_the_next_upstream_url_to_be_tried(settings):
    # The credentials a broker refuses, any broker of the cluster refuses; its connection limit is its own.
    full = ConnectionRefusingBroker(ServerError.NotAllowedError, "Reached the maximum number of connections")
    healthy = StandInBroker(connect_to("pulsar://broker-2:6650"))
    async with front_door(settings, [full, healthy]) as (_, client):
        answer = await client.lookup(TOPIC)
    assert answer.response is LookupType.CONNECT, answer
    assert full.connects and healthy.connections_total == 1


@pytest.mark.parametrize("announced", [None, 10 << 20])
async def test_answers_are_taken_up_to_the_size_the_broker_announces(announced: int | None) -> None:
    # A broker's frames are bounded by the maxMessageSize its CONNECTED announces, as the Java client's decoder
    # takes them: a broker with a larger one answered a forwarded GET_SCHEMA over 5 MiB in a frame that failed
    # tc-server's connection to it, and the client heard MetadataError on every retry (a review).
    big = "x" * (6 << 20)

    async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(1 << 20)
        while data := await reader.read(65536):
            decoder.feed(data)
            while (frame := decoder.next_frame()) is not None:
                command = decode_command(frame)
                if isinstance(command, Connect):
                    writer.write(encode_command(Connected("stand-in", 21, announced)))
                elif isinstance(command, Lookup):
                    writer.write(encode_command(LookupResponse(command.request_id, LookupType.FAILED, message=big)))
        writer.close()

    server = await asyncio.start_server(broker, "127.0.0.1", 0)
    try:
        connection = await open_connection(f"pulsar://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            if announced is None:  # the default bound, 5 MiB + 10 KiB: the frame fails the connection
                with pytest.raises(ConnectionClosed):
                    await connection.request(Lookup(TOPIC, 1), timeout_s=10)
            else:
                answer = await connection.request(Lookup(TOPIC, 1), timeout_s=10)
                assert isinstance(answer, LookupResponse) and answer.message == big
        finally:
            connection.close()
    finally:
        server.close()
