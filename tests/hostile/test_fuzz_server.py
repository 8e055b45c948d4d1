"""Fuzzing the running server over its real socket (issue 15): every command type, with any field
values the wire can carry, plus well-framed garbage and mutated frames.

For every example: each request is answered, no well-formed request is answered UnknownError (that
code means "our bug"; a bad id, topic or timeout has its own code), the connection still serves a
good NEW_TXN afterwards, nothing reached the event loop's exception handler and nothing was logged
with a traceback or at error level.

The suite runs a bounded number of examples; ``make fuzz-long`` (mk/fuzz.mk) runs the same tests with
``TC_FUZZ_EXAMPLES`` raised so that at least a million frames are sent, and prints how many were.
The server runs in its own thread with its own event loop, because hypothesis drives synchronous
tests; the client side is plain blocking sockets."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tc_server.app import App, start_app
from tc_server.client import connect_command
from tc_server.server.discovery import ASSIGN_TOPIC
from tc_server.wire import (
    AddPartitionToTxn,
    AddSubscriptionToTxn,
    AuthResponse,
    Command,
    Connect,
    Connected,
    EndTxn,
    EndTxnOnPartition,
    EndTxnOnSubscription,
    Error,
    FrameDecoder,
    Lookup,
    MalformedCommand,
    NewTxn,
    NewTxnResponse,
    PartitionedMetadata,
    Ping,
    Pong,
    ServerError,
    Subscription,
    TcClientConnect,
    TxnAction,
    Unknown,
    WatchTcAssignments,
    WatchTcAssignmentsClose,
    decode_command,
    encode_command,
    encode_frame,
)

from .conftest import BASE

EXAMPLES = int(os.environ.get("TC_FUZZ_EXAMPLES", "40"))
# Commands per example at most: the long run raises it, so that a million frames take minutes, not hours.
BATCH = int(os.environ.get("TC_FUZZ_BATCH", "25"))
MIN_BATCH = min(BATCH, int(os.environ.get("TC_FUZZ_MIN_BATCH", "1")))
# Each generated batch is sent this many times (fresh request ids; the server's state differs each
# time): generating examples costs far more than serving them, so the long run repeats them.
REPEAT = int(os.environ.get("TC_FUZZ_REPEAT", "1"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="TC_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
# An answer that has not come by then never will (the server answers within --request-timeout-s).
ANSWER_BOUND_S = 20.0
# Frames sent by this module, printed at the end (the long run must reach a million).
FRAMES_SENT = [0]

u64 = st.integers(min_value=0, max_value=2**64 - 1)
small_ids = st.integers(min_value=0, max_value=40)  # coordinators that exist, and a few that do not
ids = small_ids | u64
texts = st.text(max_size=40)
topics = (texts | st.sampled_from(["", ASSIGN_TOPIC, "pulsar/system/transaction_coordinator_assign"])
          | st.builds(lambda s: f"{ASSIGN_TOPIC}-partition-{s}", st.integers(-5, 40).map(str) | texts))
actions = st.sampled_from(list(TxnAction))


def _decodes_as_unknown(type_code: int) -> bool:
    """A bare BaseCommand of this type is a well-formed command tc-server does not serve (types whose
    body is required are malformed without it: the garbage tests cover those)."""
    try:
        return isinstance(decode_command(encode_command(Unknown(type_code))[8:]), Unknown)
    except MalformedCommand:
        return False


UNSERVED_TYPES = [code for code in range(1, 200) if _decodes_as_unknown(code)]

# Every command type a client can send on a connection it opened; request ids are set per example (unique, so
# each answer is matched to its request). A second CONNECT is not among them: it ends the connection, as at a
# broker (tests/hostile/test_protocol_edges.py); COMMANDS below adds it.
COMMANDS_ON_A_CONNECTION = st.one_of(
    st.builds(NewTxn, st.just(0), ttl_ms=u64 | st.integers(0, 120_000), tc_id=ids, scalable=st.booleans()),
    st.builds(EndTxn, st.just(0), most=ids, least=ids, action=actions, scalable=st.booleans()),
    st.builds(AddPartitionToTxn, st.just(0), most=ids, least=ids,
              partitions=st.lists(topics, max_size=3).map(tuple), scalable=st.booleans()),
    st.builds(AddSubscriptionToTxn, st.just(0), most=ids, least=ids,
              subscriptions=st.lists(st.builds(Subscription, topics, texts), max_size=3).map(tuple),
              scalable=st.booleans()),
    st.builds(TcClientConnect, st.just(0), tc_id=ids, scalable=st.booleans()),
    st.builds(Lookup, topics, st.just(0), authoritative=st.booleans()),
    st.builds(PartitionedMetadata, topics, st.just(0), metadata_auto_creation_enabled=st.booleans()),
    st.builds(WatchTcAssignments, u64),
    st.builds(WatchTcAssignmentsClose, u64),
    st.builds(EndTxnOnPartition, st.just(0), ids, ids, topics, actions, u64),
    st.builds(EndTxnOnSubscription, st.just(0), ids, ids, st.builds(Subscription, topics, texts), actions, u64),
    st.builds(AuthResponse, texts, st.none() | texts, st.none() | st.binary(max_size=20), st.integers(0, 30)),
    st.builds(Unknown, st.sampled_from(UNSERVED_TYPES)),
    st.just(Ping()),
    st.just(Pong()),
)
COMMANDS = COMMANDS_ON_A_CONNECTION | st.builds(Connect, texts, protocol_version=st.integers(0, 30))


class ServerThread:
    """tc-server (memory store) on its own uvloop event loop in a thread, with what it logged and what
    reached its loop's exception handler."""

    def __init__(self, data_dir: Path) -> None:
        self.loop = uvloop.new_event_loop()  # the loop production runs on (tc_server/cli.py)
        self.loop_errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _loop, context: self.loop_errors.append(context))
        self.thread = threading.Thread(target=self.loop.run_forever, name="tc-server-under-fuzz", daemon=True)
        # No cap on open txns: the good NEW_TXN each example ends with must not meet the cap after a
        # long run's flood of them (the cap has its own test, test_open_txn_limit.py).
        self.settings = replace(BASE, data_dir=str(data_dir), max_active_transactions_per_coordinator=0)
        self.app: App | None = None

    def start(self) -> int:
        self.thread.start()
        self.app = asyncio.run_coroutine_threadsafe(start_app(self.settings), self.loop).result(30)
        return self.app.listeners[0].port

    def stop(self) -> None:
        if self.app is not None:
            asyncio.run_coroutine_threadsafe(self.app.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


class Target:
    """The server under fuzz, its port and its log (a short repr: hypothesis prints its arguments)."""

    def __init__(self, thread: ServerThread, port: int, logged: list[Any]) -> None:
        self.thread, self.port, self.logged = thread, port, logged

    def __repr__(self) -> str:
        return f"Target(port={self.port})"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    with structlog.testing.capture_logs() as logged:
        thread = ServerThread(tmp_path_factory.mktemp("fuzz") / "data")
        port = thread.start()
        yield Target(thread, port, logged)
        thread.stop()
    print(f"\nfuzz: {FRAMES_SENT[0]} frames sent to the server")


class WireClient:
    """A blocking-socket Pulsar client that sends whatever it is given."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_BOUND_S)
        self.decoder = FrameDecoder(64 * 1024 * 1024)
        self.closed = False

    def send(self, data: bytes, frames: int) -> None:
        self.sock.sendall(data)
        FRAMES_SENT[0] += frames

    def read(self) -> list[Command]:
        """What arrives next (waits up to the bound); [] and ``closed`` once the server closed."""
        try:
            data = self.sock.recv(1 << 16)
        except (TimeoutError, ConnectionResetError):
            data = b""
        if not data:
            self.closed = True
            return []
        self.decoder.feed(data)
        out = []
        while (frame := self.decoder.next_frame()) is not None:
            out.append(decode_command(frame))
        return out

    def wait_for(self, kind: type[Command]) -> bool:
        """Read until a ``kind`` arrives (True), or the bound passes or the server closes (False)."""
        deadline = time.monotonic() + ANSWER_BOUND_S
        while time.monotonic() < deadline and not self.closed:
            if any(isinstance(cmd, kind) for cmd in self.read()):
                return True
        return False

    def handshake(self) -> None:
        self.send(encode_command(connect_command()), 1)
        if not self.wait_for(Connected):
            pytest.fail("no CONNECTED")

    def close(self) -> None:
        self.sock.close()


def answer_error(cmd: Command) -> ServerError | None:
    return cmd.error if isinstance(cmd, Error) else getattr(cmd, "error", None)


def assert_server_clean(target: Target) -> None:
    assert target.thread.loop_errors == []
    bad = [e for e in target.logged if e.get("exc_info") or e.get("log_level") in ("error", "critical")]
    assert bad == []


@FUZZ
@given(commands=st.lists(COMMANDS_ON_A_CONNECTION, min_size=MIN_BATCH, max_size=BATCH))
def test_every_command_type_gets_a_specific_answer(server: Target,
                                                   commands: list[Any]) -> None:
    port = server.port
    client = WireClient(port)
    try:
        client.handshake()
        expected: dict[int, Any] = {}
        numbered = []
        for cmd in commands * REPEAT:
            if hasattr(cmd, "request_id") and not isinstance(cmd, Unknown):
                cmd = replace(cmd, request_id=len(expected) + 1)
                expected[cmd.request_id] = cmd
            numbered.append(cmd)
        # A good request last: the connection must still serve it.
        good_id = len(expected) + 1
        numbered.append(NewTxn(good_id, 60_000, 0))
        expected[good_id] = numbered[-1]
        client.send(b"".join(encode_command(cmd) for cmd in numbered), len(numbered))
        answers: dict[int, Command] = {}
        deadline = time.monotonic() + ANSWER_BOUND_S
        while len(answers) < len(expected) and time.monotonic() < deadline and not client.closed:
            for cmd in client.read():
                request_id = getattr(cmd, "request_id", None)
                if request_id in expected:
                    answers[request_id] = cmd
        missing = {rid: expected[rid] for rid in expected if rid not in answers}
        assert not missing, f"unanswered: {missing}"
        unknown = {rid: (expected[rid], answers[rid]) for rid in answers
                   if answer_error(answers[rid]) is ServerError.UnknownError}
        assert not unknown, unknown
        good = answers[good_id]
        assert isinstance(good, NewTxnResponse) and good.error is None, good
        client.send(encode_command(EndTxn(good_id + 1, 0, good.least, TxnAction.ABORT)), 1)
    finally:
        client.close()
    assert_server_clean(server)


@FUZZ
@given(bodies=st.lists(st.binary(min_size=1, max_size=120), min_size=1, max_size=8),
       raw_tail=st.binary(max_size=40))
def test_garbage_is_contained(server: Target, bodies: list[bytes],
                              raw_tail: bytes) -> None:
    """Well-framed garbage, then unframed bytes: the server answers or closes this connection, and
    serves the next one."""
    port = server.port
    client = WireClient(port)
    try:
        client.handshake()
        client.send(b"".join(encode_frame(body) for body in bodies) + raw_tail, len(bodies) + bool(raw_tail))
        client.send(encode_command(Ping()), 1)
        client.wait_for(Pong)
    finally:
        client.close()
    fresh = WireClient(port)
    try:
        fresh.handshake()
        fresh.send(encode_command(NewTxn(1, 60_000, 1)), 1)
        got: list[Command] = []
        while not got and not fresh.closed:
            got = [cmd for cmd in fresh.read() if getattr(cmd, "request_id", None) == 1]
        assert got and answer_error(got[0]) is None, got
    finally:
        fresh.close()
    assert_server_clean(server)


@FUZZ
@given(command=COMMANDS, flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1,
                                        max_size=4))
def test_mutated_frames_are_contained(server: Target, command: Any,
                                      flips: list[tuple[int, int]]) -> None:
    """A valid frame with a few bytes changed (sizes included): answered, refused or closed."""
    port = server.port
    frame = bytearray(encode_command(command))
    for where, value in flips:
        frame[where % len(frame)] = value
    total = struct.unpack_from(">I", frame)[0]
    client = WireClient(port)
    try:
        client.handshake()
        client.send(bytes(frame), 1)
        if total + 4 == len(frame):  # still one whole frame: a PING after it must be answered
            client.send(encode_command(Ping()), 1)
            client.wait_for(Pong)
    finally:
        client.close()
    assert_server_clean(server)
