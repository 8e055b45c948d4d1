"""The admin port with authentication on, over real sockets: probes open, transaction endpoints for
superusers only (401 without or with bad credentials, 403 for another role), HTTPS, and malformed
HTTP answered 400 while the port keeps serving."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from tc_server.client import connect
from tests.security.pki import TestCa, data_url, make_token
from tests.security.support import token_auth
from tests.support.server_process import ServerProcess, started


def call(url: str, method: str = "GET", token: str | None = None, context: ssl.SSLContext | None = None,
         original_principal: str | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if original_principal is not None:
        request.add_header("X-Original-Principal", original_principal)  # as a Pulsar proxy forwards a call
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:  # noqa: S310 - loopback
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


async def admin(app, path: str, method: str = "GET", token: str | None = None,
                context: ssl.SSLContext | None = None,
                original_principal: str | None = None) -> tuple[int, dict[str, str], Any]:
    scheme = "https" if context is not None else "http"
    host = "localhost" if context is not None else "127.0.0.1"
    status, headers, body = await asyncio.to_thread(call, f"{scheme}://{host}:{app.admin.port}{path}", method,
                                                    token, context, original_principal)
    return status, headers, json.loads(body) if headers.get("Content-Type", "").startswith("application/json") \
        else body


async def test_admin_needs_a_superuser_token(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret), superuser_roles="admin")
    alice_token = make_token(secret, "HS256", "alice")
    alice = await connect("127.0.0.1", app.listener.port, auth=token_auth(alice_token))
    txn = await alice.new_txn(tc_id=1, ttl_ms=60_000)
    alice.close()
    abort = f"/admin/v3/transactions/abort/{txn.most}/{txn.least}"

    status, headers, doc = await admin(app, abort, "POST")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer") and "authentication required" in \
        doc["reason"]
    status, _, doc = await admin(app, abort, "POST", token=make_token(b"k" * 32, "HS256", "admin"))
    assert status == 401 and "signature" in doc["reason"]
    status, _, doc = await admin(app, abort, "POST", token=make_token(secret, "HS256", "admin", expires_in_s=-10))
    assert status == 401 and doc["reason"] == "token expired"
    status, _, doc = await admin(app, abort, "POST", token=alice_token)  # the owner, but not a superuser
    assert status == 403 and "'alice' is not a superuser" in doc["reason"]
    status, _, doc = await admin(app, f"/admin/v3/transactions/transactionMetadata/{txn.most}/{txn.least}",
                                 token=alice_token)
    assert status == 403
    drop = f"/admin/v3/transactions/undelivered/{txn.most}/{txn.least}/drop?topic=t"
    assert (await admin(app, drop, "POST"))[0] == 401
    assert (await admin(app, drop, "POST", token=alice_token))[0] == 403

    superuser = make_token(secret, "HS256", "admin")
    status, _, doc = await admin(app, f"/admin/v3/transactions/transactionMetadata/{txn.most}/{txn.least}",
                                 token=superuser)
    assert status == 200 and doc["owner"] == "alice" and doc["status"] == "OPEN"
    status, _, doc = await admin(app, abort, "POST", token=superuser)
    assert status == 200 and doc["status"] == "ABORTED"


async def test_a_proxy_role_acts_for_the_client_it_names(start, secret):
    # A Pulsar proxy forwarding an admin call names its client in X-Original-Principal. The admin port took
    # the proxy's own role: a proxy role that is a superuser let every client of the proxy read and abort
    # every txn (a review's). Now both must be superusers, as on the Pulsar port and in Pulsar's
    # validateSuperUserAccess, and a proxy role naming no client (or a proxy role) is refused.
    app = await start(authentication_providers="token", token_secret_key=data_url(secret),
                      proxy_roles="proxy", superuser_roles="ops, proxy")
    alice = await connect("127.0.0.1", app.listener.port, auth=token_auth(make_token(secret, "HS256", "alice")))
    txn = await alice.new_txn(tc_id=1, ttl_ms=60_000)
    alice.close()
    metadata = f"/admin/v3/transactions/transactionMetadata/{txn.most}/{txn.least}"
    abort = f"/admin/v3/transactions/abort/{txn.most}/{txn.least}"
    proxy = make_token(secret, "HS256", "proxy")

    status, _, doc = await admin(app, abort, "POST", token=proxy, original_principal="bob")
    assert status == 403 and "both must be superusers" in doc["reason"], doc
    status, _, _ = await admin(app, metadata, token=proxy, original_principal="bob")
    assert status == 403
    for named in (None, " ", "proxy"):
        status, headers, doc = await admin(app, "/admin/v3/transactions/coordinatorStats", token=proxy,
                                           original_principal=named)
        assert status == 401 and "X-Original-Principal" in doc["reason"], (named, doc)
    status, _, doc = await admin(app, metadata, token=proxy, original_principal="ops")
    assert status == 200 and doc["status"] == "OPEN", doc
    status, _, doc = await admin(app, abort, "POST", token=proxy, original_principal="ops")
    assert status == 200 and doc["status"] == "ABORTED", doc


async def test_probes_and_metrics_are_open_unless_configured(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret), superuser_roles="admin")
    assert (await admin(app, "/healthz"))[0] == 200
    assert (await admin(app, "/readyz"))[0] == 200
    assert (await admin(app, "/metrics"))[0] == 200
    assert (await admin(app, "/admin/v3/transactions/coordinators"))[0] == 401

    locked = await start(authentication_providers="token", token_secret_key=data_url(secret),
                         superuser_roles="admin", authenticate_metrics_endpoint=True)
    assert (await admin(locked, "/healthz"))[0] == 200  # kubelet probes carry no credentials
    assert (await admin(locked, "/metrics"))[0] == 401
    # Any authenticated role may scrape; it need not be a superuser.
    assert (await admin(locked, "/metrics", token=make_token(secret, "HS256", "prometheus")))[0] == 200


async def test_authorization_header_that_is_not_bearer_is_401(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret), superuser_roles="admin")

    def basic() -> int:
        request = urllib.request.Request(f"http://127.0.0.1:{app.admin.port}/admin/v3/transactions/coordinators",
                                         headers={"Authorization": "Basic YWRtaW46YWRtaW4="})
        try:
            urllib.request.urlopen(request, timeout=10)  # noqa: S310 - loopback
        except urllib.error.HTTPError as error:
            return error.code
        return 200

    assert await asyncio.to_thread(basic) == 401


async def test_https_admin_with_a_superuser_token(start, secret, tmp_path):
    ca = TestCa(tmp_path)
    server = ca.issue("localhost", "server", server=True)
    app = await start(authentication_providers="token", token_secret_key=data_url(secret), superuser_roles="admin",
                      admin_tls=True, tls_cert_file=str(server.cert_file), tls_key_file=str(server.key_file))
    context = ssl.create_default_context(cafile=str(ca.cert_file))
    status, _, doc = await admin(app, "/admin/v3/transactions/coordinators", token=make_token(secret, "HS256", "admin"),
                                 context=context)
    assert status == 200 and len(doc) == 4
    assert (await admin(app, "/admin/v3/transactions/coordinators", context=context))[0] == 401


async def send_raw_http(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    async with asyncio.timeout(10):
        answer = await reader.read(65536)
    writer.close()
    return answer


async def test_malformed_http_gets_400_and_the_port_keeps_serving(start, secret):
    app = await start(authentication_providers="token", token_secret_key=data_url(secret), superuser_roles="admin")
    port = app.admin.port
    for garbage in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",  # a TLS ClientHello
                    b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: banana\r\n\r\n",
                    b"GET /healthz HTTP/1.1\r\n" + b"X-Long: " + b"a" * 20_000 + b"\r\n\r\n",
                    b"NOT HTTP AT ALL\r\n\r\n"):
        answer = await send_raw_http(port, garbage)
        assert answer.split(b" ", 2)[1] == b"400", answer[:100]
    assert (await admin(app, "/healthz"))[0] == 200
    superuser = make_token(secret, "HS256", "admin")
    assert (await admin(app, "/admin/v3/transactions/coordinatorStats", token=superuser))[0] == 200


async def test_https_admin_with_a_client_certificate(start, tmp_path):
    """The ``tls`` method on the admin port: the client certificate's CN is the role."""
    ca = TestCa(tmp_path)
    server = ca.issue("localhost", "server", server=True)
    app = await start(authentication_providers="tls", superuser_roles="ops", admin_tls=True,
                      tls_cert_file=str(server.cert_file), tls_key_file=str(server.key_file),
                      tls_trust_certs_file=str(ca.cert_file))

    def context_for(role: str | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(ca.cert_file))
        if role is not None:
            issued = ca.issue(role, f"client-{role}")
            context.load_cert_chain(issued.cert_file, issued.key_file)
        return context

    path = "/admin/v3/transactions/coordinatorStats"
    assert (await admin(app, path, context=context_for("ops")))[0] == 200
    status, _, doc = await admin(app, path, context=context_for("alice"))
    assert status == 403 and "'alice' is not a superuser" in doc["reason"]
    status, _, doc = await admin(app, path, context=context_for(None))
    assert status == 401 and "client certificate" in doc["reason"]


def test_authenticate_metrics_endpoint_covers_the_supervisors_metrics_too(tmp_path, secret):
    # With --workers the supervisor serves --admin-listen itself, the port scrapers are pointed at first:
    # its /metrics answered anyone while every worker's asked for a role. Its probes stay open.
    server = started(ServerProcess(tmp_path / "data", "--workers", "2", "--coordinators", "2",
                                   "--authentication-providers", "token", "--token-secret-key", data_url(secret),
                                   "--superuser-roles", "admin", "--authenticate-metrics-endpoint"))
    try:
        worker = f"http://127.0.0.1:{server.admin_port + 1}"
        assert (call(f"{worker}/metrics")[0], call(f"{server.admin_url}/metrics")[0]) == (401, 401)
        assert call(f"{server.admin_url}/readyz")[0] == 200
        token = make_token(secret, "HS256", "scraper")  # any role may read metrics, as at a broker
        assert call(f"{server.admin_url}/metrics", token=token)[0] == 200
    finally:
        server.stop()
