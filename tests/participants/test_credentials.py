"""tc-server's own broker credential on its pooled connections (delivery): a token file is read again
for every new connection, so a rotated token is used without a restart. The "broker" is a tc-server
with token authentication on (the same CONNECT handling a broker has), on real sockets."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from tc_server.app import start_app
from tc_server.auth.broker_client import broker_client_credentials
from tc_server.client import ConnectionPool, HandshakeRefused, connect_command
from tc_server.config import Settings
from tests.security.pki import data_url, make_token


async def test_pool_reads_a_rotated_token_file_for_each_new_connection(tmp_path: Path) -> None:
    secret = os.urandom(32)
    broker = await start_app(Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", store="memory",
                                      coordinators=2, log_format="json", data_dir=str(tmp_path / "data"),
                                      authentication_providers="token", token_secret_key=data_url(secret)))
    token_file = tmp_path / "token"
    token_file.write_text(make_token(os.urandom(32), "HS256", "tc-server"))  # signed with the wrong key
    credentials = broker_client_credentials(replace(Settings(), broker_client_auth_plugin="token",
                                                    broker_client_auth_params=f"file://{token_file}"))
    pool = ConnectionPool(connect_command(credentials.client_auth()), timeout_s=10,
                          auth_data_source=credentials.auth_data)
    url = f"pulsar://127.0.0.1:{broker.listener.port if broker.listener else 0}"
    try:
        with pytest.raises(HandshakeRefused):
            await pool.get(url)
        token_file.write_text(make_token(secret, "HS256", "tc-server"))  # rotated: now a valid token
        conn = await pool.get(url)
        assert conn.is_usable
    finally:
        await pool.close()
        await broker.stop()
