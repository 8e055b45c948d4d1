"""Secrets never reach the log, the metrics or an error message: a real ``tc-server run`` process at
debug level, given its key and its broker-client token through the environment, sees good and bad
tokens on both ports; then its whole log and /metrics are searched for every secret."""

from __future__ import annotations

import asyncio
import base64

import pytest

from tc_server.auth.service import AuthenticationService
from tc_server.bench.process import TcServerProcess
from tc_server.client import HandshakeRefused, connect
from tc_server.config import ConfigError, load_settings
from tests.security.pki import data_url, make_token
from tests.security.support import token_auth
from tests.security.test_admin_auth import call


async def raw_http(port: int, request: bytes) -> bytes:
    """Send ``request`` as it is on a fresh connection; what came back before the server closed (bounded)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        async with asyncio.timeout(30):
            return await reader.read(65536)
    finally:
        writer.close()


def pieces(token: str) -> list[str]:
    """The token and its signature: a log line quoting either would leak a credential."""
    return [token, token.rsplit(".", 1)[1]]


async def test_no_secret_in_the_log_or_the_metrics(tmp_path, secret):
    broker_token = make_token(secret, "HS256", "tc-server")
    server = TcServerProcess(tmp_path / "data", "--log-level", "debug", "--authentication-providers", "token",
                             "--superuser-roles", "admin", "--authentication-refresh-check-s", "0.2",
                             store="memory", log_path=tmp_path / "server.log",
                             env={"TC_SERVER_TOKEN_SECRET_KEY": data_url(secret),
                                  "TC_SERVER_BROKER_CLIENT_AUTH_PLUGIN": "token",
                                  "TC_SERVER_BROKER_CLIENT_AUTH_PARAMS": f"token:{broker_token}"})
    good = make_token(secret, "HS256", "alice")
    forged = make_token(b"f" * 32, "HS256", "alice")
    expired = make_token(secret, "HS256", "alice", expires_in_s=-30)
    admin_token = make_token(secret, "HS256", "admin")
    await asyncio.to_thread(server.start)
    # Expires within 2-3 s (exp has whole seconds): still valid at its CONNECT below, after one more CONNECT.
    short = make_token(secret, "HS256", "alice", expires_in_s=3)
    try:
        client = await connect("127.0.0.1", server.port, auth=token_auth(good))
        txn = await client.new_txn(tc_id=0)
        closing = await connect("127.0.0.1", server.port, auth=token_auth(short))  # closed at expiry
        for bad in (forged, expired, "garbage-" + good):
            with pytest.raises(HandshakeRefused):
                await connect("127.0.0.1", server.port, auth=token_auth(bad))
        abort = f"{server.admin_url}/admin/v3/transactions/abort/{txn.most}/{txn.least}"
        assert (await asyncio.to_thread(call, abort, "POST", good))[0] == 403
        assert (await asyncio.to_thread(call, abort, "POST", forged))[0] == 401
        assert (await asyncio.to_thread(call, abort, "POST", admin_token))[0] == 200
        # Malformed requests carrying a token: a stray CR after it (a token file with CRLF line ends, given
        # to curl -H) and a NUL. aiohttp quotes the offending header line in its error, which was logged.
        for malformed in (f"Authorization: Bearer {admin_token}\r\r\n", f"Authorization: Bearer {admin_token}\x00\r\n"):
            await raw_http(server.admin_port, f"GET /metrics HTTP/1.1\r\nHost: x\r\n{malformed}\r\n".encode())
        async with asyncio.timeout(30):
            await closing.closed
        client.close()
        status, _, metrics = await asyncio.to_thread(call, f"{server.admin_url}/metrics")
        assert status == 200
    finally:
        await asyncio.to_thread(server.stop)
    log = server.log_path.read_text()
    assert "authentication failed" in log and "admin request refused" in log  # the refusals were logged
    assert "malformed HTTP request" in log
    secrets = [base64.b64encode(secret).decode(), data_url(secret)]
    for token in (good, short, forged, expired, admin_token, broker_token):
        secrets += pieces(token)
    for value in secrets:
        assert value not in log, "a secret is in the server log"
        assert value.encode() not in metrics, "a secret is in /metrics"


@pytest.mark.parametrize("setting, value", [
    ("TC_SERVER_TOKEN_SECRET_KEY", "not base64 but a s3cr3t passphrase"),
    ("TC_SERVER_TOKEN_SECRET_KEY", "data:;base64,c2hvcnQtczNjcjN0"),  # 'short-s3cr3t': fewer than 256 bits
    ("TC_SERVER_TOKEN_SECRET_KEY", "data:;base64,***s3cr3t***"),
    ("TC_SERVER_TOKEN_PUBLIC_KEY", "data:;base64,czNjcjN0czNjcjN0czNjcjN0czNjcjN0"),
])
def test_a_bad_key_setting_is_named_without_quoting_it(setting, value):
    env = {"TC_SERVER_AUTHENTICATION_PROVIDERS": "token", setting: value}
    with pytest.raises(ConfigError) as error:
        AuthenticationService.from_settings(load_settings(environ=env))
    message = str(error.value)
    assert setting.removeprefix("TC_SERVER_").lower() in message
    assert "s3cr3t" not in message and value not in message
