"""What the security tests share: an in-process tc-server started with security settings, and a
bare CONNECT on a raw socket that reports whether the server closed the connection afterwards."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tc_server.app import App, start_app
from tc_server.bench.process import TcServerProcess
from tc_server.client import ClientAuth, TcClient, connect_command, open_connection
from tc_server.config import Settings
from tc_server.coordinator import layout
from tc_server.coordinator.layout import TxnHeader
from tc_server.store.memory import MemoryBackend, MemoryStore
from tc_server.wire import Command, Connect, encode_command
from tests.security.pki import make_token
from tests.support.raw_frames import read_commands

# Bounds every wait of these tests: a server that neither answers nor closes fails the test. 30 s: a bound
# for a failure, far above a token's expiry of 2-3 s plus a check on a loaded machine.
WAIT_S = 30.0


@dataclass
class RawConnectResult:
    commands: list[Command]  # everything the server sent, in order
    closed_by_server: bool  # the server closed the socket (EOF) within WAIT_S


async def raw_connect(port: int, connect: Connect, ssl_context: ssl.SSLContext | None = None,
                      then: Sequence[Command] | None = None,
                      until: Callable[[list[Command]], bool] | None = None) -> RawConnectResult:
    """Send CONNECT (and ``then``) on a fresh socket, read until the server closes it or WAIT_S passes, or
    ``until(commands received so far)`` holds (a connection expected to stay open: closed_by_server False).

    Our client closes its side after a refused handshake; this one never does, so an EOF here proves
    the server closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ssl_context,
                                                   server_hostname="localhost" if ssl_context else None)
    writer.write(encode_command(connect))
    for cmd in then or []:
        writer.write(encode_command(cmd))
    commands, closed = await read_commands(reader, WAIT_S, until)
    writer.close()
    return RawConnectResult(commands, closed)


def token_auth(token: str) -> ClientAuth:
    """What the Java client's AuthenticationToken puts in CONNECT."""
    return ClientAuth("token", token.encode())


async def tls_client(port: int, context: ssl.SSLContext, auth: ClientAuth) -> TcClient:
    """Our TC client over pulsar+ssl://, handshaken with ``auth``. Raises ConnectionFailed, HandshakeRefused."""
    url = f"pulsar+ssl://localhost:{port}"
    conn = await open_connection(url, connect_command(auth, "tc-server-test-client"), ssl_context=context,
                                 timeout_s=WAIT_S, factory=lambda: TcClient(url))
    assert isinstance(conn, TcClient)
    return conn


async def owner_of(app, most: int, least: int) -> str | None:
    """The owner recorded in the txn's header: the role that opened it."""
    record = await app.coordinator.store.get(layout.header_path(most, least), partition_key=layout.txn_key(most, least))
    assert record is not None
    return TxnHeader.from_json(record.value).owner


class Keys:
    """One HS256 key for brokers, tc-server and proxies of a test module, so a client's token is valid at
    each of them (one identity)."""

    def __init__(self) -> None:
        self.secret = os.urandom(32)

    def token(self, role: str) -> str:
        return make_token(self.secret, "HS256", role, expires_in_s=None)


def admin_json(server: TcServerProcess, path: str, token: str) -> tuple[int, Any]:
    """GET ``path`` of tc-server's admin port with a Bearer ``token``: (status, the JSON body)."""
    request = urllib.request.Request(server.admin_url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


async def relayed(port: int, context: ssl.SSLContext, auth: ClientAuth, broker: str) -> TcClient:
    """A connection to tc-server's TLS listener at ``port`` asking to be carried to ``broker`` (HOST:PORT), as the
    Java client does after a lookup answered proxy_through_service_url: the client, once CONNECTED came back.
    Raises ConnectionFailed, HandshakeRefused."""
    url = f"pulsar+ssl://localhost:{port}"
    conn = await open_connection(url, replace(connect_command(auth), proxy_to_broker_url=broker), ssl_context=context,
                                 timeout_s=WAIT_S, factory=lambda: TcClient(url))
    assert isinstance(conn, TcClient)
    return conn


async def sharing_instances(settings: Settings) -> tuple[App, App, str]:
    """Two instances on one memory store with ``settings`` (a TLS listener among them), once they share the
    coordinators: (a, b, b's TLS URL as a knows it). The caller stops both."""
    backend = MemoryBackend()
    a = await start_app(settings, store=MemoryStore(backend))
    b = await start_app(settings, store=MemoryStore(backend))
    b_url = f"pulsar://127.0.0.1:{b.listeners[0].port}"
    for _ in range(int(WAIT_S / 0.05)):
        if b_url in a.coordinator.assignments().values() and a.coordinator.tls_url(b_url):
            break
        await asyncio.sleep(0.05)
    b_tls = a.coordinator.tls_url(b_url)
    if b_tls is None:
        await b.stop()
        await a.stop()
        raise AssertionError("the two instances never shared the coordinators")
    return a, b, b_tls
