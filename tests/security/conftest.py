"""Fixtures of the security tests: keys generated per test, in-process servers on real sockets."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tc_server.app import App, start_app
from tc_server.config import Settings
from tests.interop.conftest import go_harness, java_harness  # noqa: F401 - the built harnesses, for test_clients.py

BASE = Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", store="memory", coordinators=4,
                keepalive_s=30, log_format="json")

StartApp = Callable[..., Awaitable[App]]


@pytest.fixture
def secret() -> bytes:
    """An HS256 secret key, as ``pulsar tokens create-secret-key`` makes (256 random bits)."""
    return os.urandom(32)


@pytest.fixture(scope="session")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="session")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
async def start(tmp_path) -> AsyncIterator[StartApp]:
    """``await start(authentication_providers="token", ...)``: a tc-server with those settings; all
    of them are stopped at the end of the test."""
    started: list[App] = []

    async def _start(**settings: Any) -> App:
        app = await start_app(replace(BASE, data_dir=str(tmp_path / f"data{len(started)}"), **settings).validate())
        started.append(app)
        return app

    yield _start
    for app in started:
        await app.stop()
