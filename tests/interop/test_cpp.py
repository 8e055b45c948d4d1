"""The C++ client, through the Python `pulsar-client` wheel, against tc-server.

The wheel has no transaction API, so this covers what the C++ client does on its own: the handshake at
protocol version 20, PARTITIONED_METADATA on the assign topic, and answering the server's PINGs.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from tests.interop.conftest import ASSIGN_TOPIC, COORDINATORS, TcServer

pytestmark = [pytest.mark.slow]

# Not 1: after a stall of the server's process as long as an interval, uvloop runs the due tick before it reads a
# PONG waiting in the socket, and closes a client that answered.
KEEPALIVE_S = 2


def client_ports(server_port: int) -> set[int]:
    """Local ports of the established TCP connections to ``server_port`` (from /proc/net/tcp[6])."""
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(name)
        if not path.exists():
            continue
        for row in path.read_text().splitlines()[1:]:
            cols = row.split()
            local, remote, state = cols[1], cols[2], cols[3]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == server_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


@pytest.fixture
def client(tc_server: TcServer) -> Iterator[pulsar.Client]:
    c = pulsar.Client(tc_server.url, operation_timeout_seconds=10)
    yield c
    c.close()


def test_assign_topic_has_one_partition_per_coordinator(client: pulsar.Client) -> None:
    partitions = client.get_topic_partitions(ASSIGN_TOPIC)
    assert partitions == [f"{ASSIGN_TOPIC}-partition-{i}" for i in range(COORDINATORS)]


def test_idle_client_survives_server_keepalive(tc_server_factory) -> None:
    # Set through the environment to check the TC_SERVER_<FLAG> contract as well.
    server = tc_server_factory(env={"TC_SERVER_KEEPALIVE_S": str(KEEPALIVE_S)})
    server.start()
    client = pulsar.Client(server.url, operation_timeout_seconds=10)
    try:
        assert len(client.get_topic_partitions(ASSIGN_TOPIC)) == COORDINATORS
        before = client_ports(server.port)
        assert len(before) == 1, before
        # The C++ client pings every 30 s, so in these 3.5 s only the server's PINGs cross the wire; a
        # client that did not answer them would be dropped at the second tick.
        time.sleep(3.5 * KEEPALIVE_S)
        assert client_ports(server.port) == before, "the server dropped the idle connection"
        assert len(client.get_topic_partitions(ASSIGN_TOPIC)) == COORDINATORS
        assert client_ports(server.port) == before, "the client had to reconnect"
    finally:
        client.close()


def _frame(command_type: int, body_field: int, body: bytes) -> bytes:
    """A simple Pulsar frame holding BaseCommand{type, <body_field>: body}; enough for CONNECT."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)

    cmd = b"\x08" + varint(command_type) + bytes([body_field << 3 | 2]) + varint(len(body)) + body
    return (4 + len(cmd)).to_bytes(4, "big") + len(cmd).to_bytes(4, "big") + cmd


def _read_command_type(sock: socket.socket) -> int | None:
    """The BaseCommand.type of the next frame, None at EOF."""
    def exactly(n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return buf

    header = exactly(8)
    if header is None:
        return None
    rest = exactly(int.from_bytes(header[:4], "big") - 4)
    assert rest is not None and rest[0] == 0x08, rest
    return rest[1]  # every command type this test meets is below 128, a one-byte varint


def test_silent_client_is_dropped(tc_server_factory) -> None:
    """The control for the test above: a peer that never answers PING is closed after two ticks."""
    server = tc_server_factory(extra_args=["--keepalive-s", str(KEEPALIVE_S)])
    server.start()
    connect_body = b"\x0a\x03raw" + b"\x20\x14"  # client_version="raw" (1), protocol_version=20 (4)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(_frame(2, 2, connect_body))  # CONNECT = 2, BaseCommand.connect = 2
        assert _read_command_type(sock) == 3  # CONNECTED
        start = time.monotonic()
        seen = []
        while (kind := _read_command_type(sock)) is not None:
            seen.append(kind)
        elapsed = time.monotonic() - start
    assert 18 in seen, seen  # PING
    # The server closed the connection (the loop ended on EOF; a server that kept it open would
    # have hit the socket's 10 s timeout and failed the test). The time is reported, not asserted.
    print(f"silent client dropped after {elapsed:.1f} s")
