"""A TLS client that closes its connection must not make the server log a warning: eof_received()
returning True (the half-close handling of ClientConnection) has no effect under TLS, and asyncio's (and
uvloop's) SSL layer then logs "returning true from eof_received() has no effect when using ssl" at WARNING
on the 'asyncio' logger, once per TLS client that goes away."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tc_server.client import ClientAuth
from tests.security.pki import TestCa
from tests.security.support import tls_client
from tests.security.test_tls import client_context, tls_settings


@pytest.fixture
def ca(tmp_path) -> TestCa:
    return TestCa(tmp_path)


async def test_a_tls_client_closing_logs_no_asyncio_warning(start, ca, caplog):
    server = ca.issue("localhost", "server", server=True)
    app = await start(**tls_settings(ca, server))
    caplog.set_level(logging.WARNING, logger="asyncio")
    for _ in range(3):
        client = await tls_client(app.tls_listener.port, client_context(ca), ClientAuth())
        created = await client.new_txn(tc_id=0)
        assert (await client.end_txn(created.most, created.least, commit=True)).error is None
        client.close()
        await asyncio.sleep(0.2)  # the server sees the close
    warned = [r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.WARNING]
    assert not warned, warned
