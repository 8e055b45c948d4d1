"""The admin port's input (issue 15): odd or huge ids and coordinator ids are 400 naming the parameter,
never 500; a damaged stored header is answered without its bytes. Raw HTTP over a real socket."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tc_server.admin import http as admin_http
from tc_server.app import App, start_app
from tc_server.client import TcClient
from tc_server.config import Settings
from tc_server.coordinator import layout
from tests.security.pki import TestCa, data_url
from tests.support.waiting import async_wait_for

from .conftest import tracebacks

T = "/admin/v3/transactions"
BEYOND_A_LONG = str(2**63)  # txn id halves are Java longs
TWENTY_NINES = "9" * 20  # beyond even uint64
HUGE = "9" * 5000  # beyond int()'s 4,300 digits
SUPERSCRIPT = "%C2%B2"  # '²': str.isdigit() says yes, int() says no
ARABIC_ONE = "%D9%A1"  # a Unicode decimal digit: int() reads it as 1, a regex's \d matches it


async def http(app: App, method: str, target: str) -> tuple[int, dict[str, Any]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", app.admin.port)
    writer.write(f"{method} {target} HTTP/1.1\r\nHost: tc\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                 .encode("ascii"))
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body) if body.startswith(b"{") else {"raw": body.decode()}


BAD_TARGETS = [
    ("GET", f"{T}/transactionMetadata/{SUPERSCRIPT}/1", "most"),
    ("GET", f"{T}/transactionMetadata/{ARABIC_ONE}/1", "most"),
    ("GET", f"{T}/transactionMetadata/1/{BEYOND_A_LONG}", "least"),
    ("GET", f"{T}/transactionMetadata/{TWENTY_NINES}/1", "most"),
    ("GET", f"{T}/transactionMetadata/1/{HUGE}", "least"),
    ("GET", f"{T}/transactionMetadata/1/-1", "least"),
    ("POST", f"{T}/abort/{BEYOND_A_LONG}/1", "most"),
    ("POST", f"{T}/abort/1/{HUGE}", "least"),
    ("POST", f"{T}/abort/1/{SUPERSCRIPT}", "least"),
    ("GET", f"{T}/slowTransactions/{HUGE}", "timeout"),
    ("GET", f"{T}/slowTransactions/{SUPERSCRIPT}", "timeout"),
    ("GET", f"{T}/slowTransactions/1000?coordinatorId={SUPERSCRIPT}", "coordinatorId"),
    ("GET", f"{T}/slowTransactions/1000?coordinatorId=x", "coordinatorId"),
    ("GET", f"{T}/coordinatorStats?coordinatorId={SUPERSCRIPT}", "coordinatorId"),
    ("GET", f"{T}/coordinatorStats?coordinatorId={HUGE}", "coordinatorId"),
    ("GET", f"{T}/coordinatorStats?coordinatorId=-1", "coordinatorId"),
    ("GET", f"{T}/undelivered?coordinatorId={SUPERSCRIPT}", "coordinatorId"),
    ("GET", f"{T}/undelivered?coordinatorId={HUGE}", "coordinatorId"),
]


@pytest.mark.parametrize(("method", "target", "parameter"), BAD_TARGETS, ids=lambda v: str(v)[-40:])
async def test_a_bad_number_is_400_naming_the_parameter(app: App, method: str, target: str, parameter: str,
                                                        server_log: list[dict[str, Any]]) -> None:
    status, doc = await http(app, method, target)
    assert status == 400, doc
    assert str(doc["reason"]).startswith(f"{parameter}: "), doc
    assert tracebacks(server_log) == []


async def test_a_coordinator_that_does_not_exist_is_still_404(app: App) -> None:
    status, doc = await http(app, "GET", f"{T}/coordinatorStats?coordinatorId=16")
    assert status == 404, doc


@pytest.mark.parametrize("method, endpoint", [("GET", "transactionMetadata"), ("POST", "abort")])
async def test_a_damaged_header_is_reported_without_its_bytes(app: App, client: TcClient,
                                                              server_log: list[dict[str, Any]], method: str,
                                                              endpoint: str) -> None:
    # The force-abort, the operator's tool for a stuck txn, said "internal error: StoreCorrupted" with an
    # error-level traceback.
    opened = await client.new_txn(tc_id=4)
    assert opened.error is None
    path = layout.header_path(4, opened.least)
    stored = await app.store.get(path)
    assert stored is not None
    await app.store.put(path, stored.value.replace(b'"OPEN"', b'"<damaged>"'),
                        partition_key=layout.txn_key(4, opened.least))
    app.coordinator.partition(4)._headers.pop(opened.least, None)  # as after a restart: read from the store
    status, doc = await http(app, method, f"{T}/{endpoint}/4/{opened.least}")
    assert status == 500, doc
    assert "damaged" not in json.dumps(doc) and f"(4,{opened.least})" in str(doc["reason"])
    assert tracebacks(server_log) == []


@pytest.mark.parametrize("request_head", [
    b"POST /admin/v3/transactions/abort/1/1 HTTP/1.1\r\nHost: tc\r\nContent-Length: \xc2\xb2\r\n\r\n",
    b"GET /readyz HTTP/1.1\r\nHost: tc\r\nContent-Length: -1\r\n\r\n",
    b"GET /\xd9\xa1 HTTP/1.1\r\nHost: tc\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not HTTP at all\r\n\r\n",
])
async def test_a_malformed_http_request_is_400_with_one_line_and_no_traceback(
        app: App, request_head: bytes, server_log: list[dict[str, Any]],
        caplog: pytest.LogCaptureFixture) -> None:
    for _ in range(3):  # repeated: still one line
        reader, writer = await asyncio.open_connection("127.0.0.1", app.admin.port)
        writer.write(request_head)
        raw = await reader.read()
        writer.close()
        assert raw.startswith(b"HTTP/1.") and b" 400 " in raw.split(b"\r\n")[0], raw[:100]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= 40], caplog.records
    assert len([e for e in server_log if e["event"] == "malformed HTTP request answered 400"]) <= 1
    status, _ = await http(app, "GET", "/healthz")
    assert status == 200


async def test_idle_connections_beyond_the_admin_ports_budget_are_closed_at_once(app: App) -> None:
    # Connections that send half a request line and wait: aiohttp keeps each for its keep-alive timeout
    # (75 s). Without a bound, a few hundred of them, from anyone (no credentials needed), used up the
    # process's descriptors: every accept failed, the Pulsar port's and the probes' included.
    app.admin.budget.per_address, app.admin.budget.total = 5, 8  # MAX_CONNECTIONS_PER_ADDRESS, MAX_CONNECTIONS
    held = []
    for _ in range(5):
        reader, writer = await asyncio.open_connection("127.0.0.1", app.admin.port)
        writer.write(b"GET /heal")  # half a request line, never finished
        held.append((reader, writer))
    await asyncio.sleep(0.1)
    reader, writer = await asyncio.open_connection("127.0.0.1", app.admin.port)  # the sixth from this address
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed at once, unanswered
    writer.close()
    assert app.admin.budget.count == 5
    for _, held_writer in held:
        held_writer.close()
    await async_wait_for(lambda: app.admin.budget.count == 0)  # the slots come back as the held connections go
    assert (await http(app, "GET", "/healthz"))[0] == 200
    assert app.admin.budget.count == 0 and app.admin.budget.by_address == {}


async def test_a_client_that_reads_none_of_its_answers_loses_its_connection(app: App, monkeypatch) -> None:
    # Found by a review: aiohttp's keep-alive timeout closes idle connections only, and one that pipelined
    # requests and read none of the answers waited to write for good, holding its slot: a few addresses took
    # every one, the probes' too. Closed once its answers stay unread for WRITE_STALL_S (1 s here).
    monkeypatch.setattr(admin_http, "WRITE_STALL_S", 1.0)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", app.admin.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n" * 500)  # ~10 MB of answers, never read
    try:  # paused, then closed WRITE_STALL_S later
        await async_wait_for(lambda: app.admin.budget.count == 0, "the stalled admin connection closed", bound_s=30)
    finally:
        writer.close()
    assert (await http(app, "GET", "/healthz"))[0] == 200


async def test_tls_handshakes_never_finished_are_bounded_by_the_admin_ports_budget(
        settings: Settings, tmp_path: Path, monkeypatch) -> None:
    # With --admin-tls the budget was counted once a TLS handshake was done (asyncio calls connection_made
    # then): sockets that never sent their ClientHello were neither counted nor closed, each held for
    # asyncio's 60 s handshake timeout, as many as anyone opened. The handshakes under way have a budget of
    # the same size now.
    monkeypatch.setattr(admin_http, "MAX_CONNECTIONS_PER_ADDRESS", 5)
    monkeypatch.setattr(admin_http, "MAX_CONNECTIONS", 8)
    ca = TestCa(tmp_path)
    issued = ca.issue("localhost", "server", server=True)
    app = await start_app(replace(settings, admin_tls=True, tls_cert_file=str(issued.cert_file),
                                  tls_key_file=str(issued.key_file)))
    held = []
    try:
        for _ in range(5):  # the per-address budget of handshakes, none sends a byte
            held.append(await asyncio.open_connection("127.0.0.1", app.admin.port))
        reader, writer = await asyncio.open_connection("127.0.0.1", app.admin.port)  # the sixth
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed at once
        writer.close()
        # An HTTPS request from another address is served meanwhile.
        context = ssl.create_default_context(cafile=str(ca.cert_file))
        reader, writer = await asyncio.open_connection("127.0.0.1", app.admin.port, ssl=context,
                                                       server_hostname="localhost", local_addr=("127.0.0.2", 0))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: tc\r\nConnection: close\r\n\r\n")
        assert (await reader.read()).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        for _, held_writer in held:
            held_writer.close()
        await app.stop()


async def test_refused_unauthenticated_requests_are_logged_once_per_interval_with_the_path_cut_short(
        settings: Settings, server_log: list[dict[str, Any]]) -> None:
    # Each refused request was logged, with its whole path (up to aiohttp's 8190-byte request line): anyone
    # who reached the port wrote as much log as they sent, no credentials needed.
    app = await start_app(replace(settings, authentication_providers="token", token_secret_key=data_url(
        b"k" * 32), superuser_roles="admin"))
    request = f"GET /admin/v3/transactions/{'x' * 8000} HTTP/1.1\r\nHost: tc\r\n\r\n".encode()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", app.admin.port)
        writer.write(request * 200)  # pipelined on one keep-alive connection
        for _ in range(200):  # each is answered 401
            async with asyncio.timeout(10):
                assert b" 401 " in await reader.readline()
                length = 0
                while (line := await reader.readline()) != b"\r\n":
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
        writer.close()
    finally:
        await app.stop()
    refused = [e for e in server_log if e["event"] == "admin request refused: not authenticated"]
    assert len(refused) == 1 and len(refused[0]["path"]) == 200, [(len(e["path"]), e["reason"]) for e in refused]


async def test_readiness_checks_at_once_share_one_store_read(app: App, monkeypatch) -> None:
    # Found by a review: every /readyz (open to anyone) and /metrics made a store read of its own; 128
    # connections asking in a loop loaded the store and the event loop. Checks at once share one read now.
    reads = 0
    original = app.coordinator.store.get

    async def counted(key: str, **kwargs: Any) -> Any:
        nonlocal reads
        if key == layout.PARALLELISM_PATH:
            reads += 1
            # A store that takes its time, so that the 30 checks overlap: 1 s, under the probe's own 2 s bound
            # (READY_PROBE_TIMEOUT_S); 0.2 s let a stall of the loaded machine split them over two reads.
            await asyncio.sleep(1.0)
        return await original(key, **kwargs)

    monkeypatch.setattr(app.coordinator.store, "get", counted)
    answers = await asyncio.gather(*(http(app, "GET", "/readyz") for _ in range(30)))
    assert [code for code, _ in answers] == [200] * 30
    assert reads == 1, reads
