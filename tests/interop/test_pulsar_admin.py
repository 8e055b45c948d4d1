"""What an operator who points the real ``PulsarAdmin`` (pulsar-client-admin-original 4.2.4) at tc-server's
admin URL gets, for every path README *Operations* / **Admin** names: the values the client deserializes, the
exceptions it raises, token authentication, HTTPS, the paging headers, and a worker's redirect to the worker
that leads a coordinator.

The harness (tests/interop/admin-java, built by ``make interop-admin``) runs a list of ``admin.transactions()``
calls in one JVM and prints, per call, the value the client deserialized (with the Java types it read) or the
PulsarAdminException it raised. Upstream facts (pulsar 4.2.4: ``TransactionsImpl`` of the admin client,
``admin/v3/Transactions.java`` of the broker):

- ``abortTransaction(TxnID)`` is ``POST /admin/v3/transactions/abortTransaction/{most}/{least}`` with an empty
  JSON body; the broker answers 204, 404 for an unknown transaction or coordinator, and needs a superuser.
- ``TransactionMetadata.producedPartitions`` is ``{topic: TransactionInBufferStats}`` and
  ``ackedPartitions`` ``{topic: {subscription: TransactionInPendingAckStats}}``, one entry per partition /
  subscription the coordinator recorded, for ``transactionMetadata`` and every entry of ``slowTransactions``.
- A broker redirects (307) a request about what another broker owns; the client follows.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tc_server.client import connect
from tc_server.client.connection import NO_AUTH, ClientAuth
from tests.support.routed_txns import end_txns, txns_on_coordinators
from tests.support.server_process import ServerProcess, started

JAR = Path(__file__).resolve().parent / "admin-java" / "target" / "tc-interop-admin.jar"
JVM_OPTS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]

pytestmark = pytest.mark.java


class Admin:
    """``PulsarAdmin`` settings; :meth:`run` makes the calls in one JVM."""

    def __init__(self, jar: Path, tmp: Path, url: str, **settings: Any) -> None:
        self.jar = jar
        self.tmp = tmp
        self.config: dict[str, Any] = {"url": url, **settings}

    def run(self, *ops: dict[str, Any]) -> list[dict[str, Any]]:
        config = {**self.config, "ops": list(ops)}
        proc = subprocess.run(["java", *JVM_OPTS, f"-Djava.io.tmpdir={self.tmp}", "-jar", str(self.jar)],
                              input=json.dumps(config), capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0 and proc.stdout.strip(), f"harness failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
        results = json.loads(proc.stdout.strip().splitlines()[-1])
        assert isinstance(results, list)
        return results

    def one(self, op: dict[str, Any]) -> dict[str, Any]:
        return self.run(op)[0]


@pytest.fixture
def admin_for(tmp_path: Path) -> Callable[..., Admin]:
    """``admin_for(url, **settings)``: the PulsarAdmin calls of one JVM against ``url``."""
    if shutil.which("java") is None:
        pytest.fail("java not found on PATH: the admin interop tests need a Java 17+ JDK (see mk/interop.mk)")
    if not JAR.exists() or not (JAR.parent / "lib").is_dir():
        pytest.fail(f"{JAR} is missing: run `make interop-admin`")

    def make(url: str, **settings: Any) -> Admin:
        tmp = tmp_path / "java-tmp"
        tmp.mkdir(exist_ok=True)
        return Admin(JAR, tmp, url, **settings)

    return make


@pytest.fixture
def server_with(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """``server_with(*args)``: a started tc-server process (stopped at the end of the test)."""
    servers: list[ServerProcess] = []

    def make(*args: str) -> ServerProcess:
        server = ServerProcess(tmp_path / f"data-{len(servers)}", *args)
        servers.append(server)
        return started(server)

    yield make
    for server in servers:
        try:
            server.stop()
        except Exception:  # noqa: BLE001 - stop every server we started
            server.kill()


Servers = Callable[..., ServerProcess]
Admins = Callable[..., Admin]


def ok(result: dict[str, Any]) -> Any:
    assert result["ok"], f"the admin client raised {result.get('exception')}: {result.get('message')}"
    return result.get("value")


def raised(result: dict[str, Any], exception: str, status: int | None = None) -> str:
    """The message of the PulsarAdminException subclass ``exception`` (simple name) the call raised."""
    assert not result["ok"], f"expected {exception}, the call returned {result.get('value')!r}"
    assert result["exception"].rsplit("$", 1)[-1].rsplit(".", 1)[-1] == exception, result
    if status is not None:
        assert result["status"] == status, result
    return str(result["message"])


PRODUCED = "persistent://public/default/orders-partition-0"
ACKED_TOPIC = "persistent://public/default/payments"
ACKED_SUB = "billing"


async def _open(port: int, ttls: list[tuple[int, int]], auth: ClientAuth = NO_AUTH) -> list[tuple[int, int]]:
    """Open one txn per (coordinator, ttl_ms); returns their ids."""
    client = await connect("127.0.0.1", port, auth=auth)
    try:
        for tc in sorted({tc for tc, _ in ttls}):
            assert (await client.tc_client_connect(tc)).error is None
        ids = []
        for tc, ttl in ttls:
            r = await client.new_txn(tc, ttl)
            assert r.error is None, r
            ids.append((r.most, r.least))
        return ids
    finally:
        client.close()


async def _with_participants(port: int) -> tuple[int, int]:
    """An open txn on coordinator 0 that produced to PRODUCED and acked on ACKED_TOPIC/ACKED_SUB."""
    client = await connect("127.0.0.1", port)
    try:
        assert (await client.tc_client_connect(0)).error is None
        txn = await client.new_txn(0, 600_000)
        assert txn.error is None
        assert (await client.add_partition(txn.most, txn.least, PRODUCED)).error is None
        assert (await client.add_subscription(txn.most, txn.least, ACKED_TOPIC, ACKED_SUB)).error is None
        return txn.most, txn.least
    finally:
        client.close()


def _metadata(most: int, least: int) -> dict[str, Any]:
    return {"op": "metadata", "most": most, "least": least}


def test_reads_deserialize_into_the_clients_types(server_with: Servers, admin_for: Admins) -> None:
    server = server_with("--coordinators", "2")
    open0, open1, done = asyncio.run(_open(server.port, [(0, 60_000), (1, 120_000), (0, 30_000)]))
    asyncio.run(end_txns(server.port, 2, [done]))
    coordinators, stats, stats0, meta, committed, slow_all, slow1, slow_long = admin_for(server.admin_url).run(
        {"op": "listCoordinators"}, {"op": "coordinatorStats"}, {"op": "coordinatorStatsById", "id": 0},
        _metadata(*open0), _metadata(*done), {"op": "slow", "timeoutMs": 0},
        {"op": "slow", "timeoutMs": 0, "coordinatorId": 1}, {"op": "slow", "timeoutMs": 90_000})

    assert coordinators["valueType"].endswith("TransactionCoordinatorInfo")
    assert ok(coordinators) == [{"id": i, "brokerServiceUrl": server.url} for i in (0, 1)]

    assert stats["keyType"] == "java.lang.Integer" and stats["valueType"].endswith("TransactionCoordinatorStats")
    assert set(ok(stats)) == {"0", "1"}
    assert stats0["type"].endswith("TransactionCoordinatorStats")
    assert ok(stats0) == {"state": "Ready", "leastSigBits": done[1], "lowWaterMark": open0[1] - 1,
                          "ongoingTxnSize": 1, "recoverStartTime": 0, "recoverEndTime": 0}
    assert ok(stats)["1"]["leastSigBits"] == open1[1] and ok(stats)["1"]["ongoingTxnSize"] == 1

    assert meta["type"].endswith("TransactionMetadata")
    value = ok(meta)
    assert value["txnId"] == f"({open0[0]},{open0[1]})" and value["status"] == "OPEN"
    assert value["timeoutAt"] == 60_000 and value["owner"] is None
    assert abs(value["openTimestamp"] - open0[1] // 1_000_000) < 60_000  # a wall-clock ms timestamp
    assert ok(committed)["status"] == "COMMITTED"

    assert slow_all["keyType"] == "java.lang.String" and slow_all["valueType"].endswith("TransactionMetadata")
    assert set(ok(slow_all)) == {f"({m},{lst})" for m, lst in (open0, open1)}
    assert set(ok(slow1)) == {f"({open1[0]},{open1[1]})"}
    assert set(ok(slow_long)) == {f"({open1[0]},{open1[1]})"}  # configured timeout > 90 s, as Pulsar


def test_errors_are_the_clients_specific_exceptions(server_with: Servers, admin_for: Admins) -> None:
    server = server_with("--coordinators", "2")
    unknown_txn, unknown_coordinator, slow_unknown, bad_half = admin_for(server.admin_url).run(
        _metadata(1, 424242), {"op": "coordinatorStatsById", "id": 7},
        {"op": "slow", "timeoutMs": 0, "coordinatorId": 9}, _metadata(-1, 5))
    assert "(1,424242) not found" in raised(unknown_txn, "NotFoundException", 404)
    assert "coordinator 7" in raised(unknown_coordinator, "NotFoundException", 404)
    assert "coordinator 9" in raised(slow_unknown, "NotFoundException", 404)
    assert "most" in raised(bad_half, "PulsarAdminException", 400)


def test_token_authentication_and_superusers(server_with: Servers, admin_for: Admins,
        tmp_path: Path) -> None:
    from tests.security.pki import data_url, make_token

    secret = b"s" * 32
    server = server_with("--coordinators", "2", "--authentication-providers", "token",
                       "--token-secret-key", data_url(secret), "--superuser-roles", "ops")
    alice = make_token(secret, "HS256", "alice")
    (txn,) = asyncio.run(_open(server.port, [(1, 60_000)], auth=ClientAuth("token", alice.encode())))
    plugin = "org.apache.pulsar.client.impl.auth.AuthenticationToken"

    (meta,) = admin_for(server.admin_url, authPlugin=plugin,
                        authParams=f"token:{make_token(secret, 'HS256', 'ops')}").run(_metadata(*txn))
    assert ok(meta)["owner"] == "alice" and ok(meta)["status"] == "OPEN"
    token_file = tmp_path / "ops.jwt"
    token_file.write_text(make_token(secret, "HS256", "ops"))
    (stats,) = admin_for(server.admin_url, authPlugin=plugin, authParams=f"file://{token_file}").run(
        {"op": "coordinatorStats"})
    assert set(ok(stats)) == {"0", "1"}

    (as_alice,) = admin_for(server.admin_url, authPlugin=plugin, authParams=f"token:{alice}").run(_metadata(*txn))
    assert "'alice' is not a superuser" in raised(as_alice, "NotAuthorizedException", 403)
    (anonymous,) = admin_for(server.admin_url).run(_metadata(*txn))
    raised(anonymous, "NotAuthorizedException", 401)
    expired = make_token(secret, "HS256", "ops", expires_in_s=-10)
    (late,) = admin_for(server.admin_url, authPlugin=plugin, authParams=f"token:{expired}").run(_metadata(*txn))
    assert "expired" in raised(late, "NotAuthorizedException", 401)


def test_https_with_trusted_ca_hostname_verification_and_client_certificates(server_with: Servers, admin_for: Admins,
        tmp_path: Path) -> None:
    from tests.security.pki import TestCa, data_url, make_token

    ca = TestCa(tmp_path)
    server_cert = ca.issue("tc-server", "server", server=True)
    ops_cert = ca.issue("ops", "ops-client")
    alice_cert = ca.issue("alice", "alice-client")
    secret = b"s" * 32
    server = server_with("--coordinators", "2", "--admin-tls", "--tls-cert-file", str(server_cert.cert_file),
                       "--tls-key-file", str(server_cert.key_file), "--tls-trust-certs-file", str(ca.cert_file),
                       "--authentication-providers", "token,tls", "--token-secret-key", data_url(secret),
                       "--superuser-roles", "ops")
    url = f"https://localhost:{server.admin_port}"
    trust = {"tlsTrustCertsFilePath": str(ca.cert_file), "enableTlsHostnameVerification": True}
    token = {"authPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
             "authParams": f"token:{make_token(secret, 'HS256', 'ops')}"}

    def tls_auth(issued: Any) -> dict[str, str]:
        return {"authPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationTls",
                "authParams": f"tlsCertFile:{issued.cert_file},tlsKeyFile:{issued.key_file}"}

    (with_token,) = admin_for(url, **trust, **token).run({"op": "listCoordinators"})
    assert [c["id"] for c in ok(with_token)] == [0, 1]
    (with_cert,) = admin_for(url, **trust, **tls_auth(ops_cert)).run({"op": "coordinatorStats"})
    assert set(ok(with_cert)) == {"0", "1"}
    (other_cert,) = admin_for(url, **trust, **tls_auth(alice_cert)).run({"op": "coordinatorStats"})
    assert "'alice' is not a superuser" in raised(other_cert, "NotAuthorizedException", 403)
    # Without the CA the client refuses the server's certificate: nothing is sent.
    (untrusted,) = admin_for(url, **token).run({"op": "listCoordinators"})
    assert not untrusted["ok"]


def test_paging_headers_leave_the_first_page_readable(server_with: Servers, admin_for: Admins) -> None:
    server = server_with("--coordinators", "2")
    ids = asyncio.run(_open(server.port, [(i % 2, 60_000) for i in range(1001)]))
    with urllib.request.urlopen(f"{server.admin_url}/admin/v3/transactions/slowTransactions/0",  # noqa: S310
                                timeout=10) as response:
        assert response.headers["X-Next-After"] and 'rel="next"' in response.headers["Link"]
        assert len(json.load(response)) == 1000
    (slow,) = admin_for(server.admin_url).run({"op": "slow", "timeoutMs": 0})
    page = ok(slow)
    assert len(page) == 1000 and set(page) == {f"({m},{lst})" for m, lst in sorted(ids)[:1000]}


def test_abort_transaction_with_the_client(server_with: Servers, admin_for: Admins) -> None:
    """pulsar-admin's abortTransaction posts to ``abortTransaction/{most}/{least}``: it was "no such endpoint"
    (tc-server served its own ``abort/`` only) and the transaction stayed OPEN."""
    server = server_with("--coordinators", "2")
    (txn,) = asyncio.run(_open(server.port, [(1, 600_000)]))
    abort, after, unknown = admin_for(server.admin_url).run(
        {"op": "abort", "most": txn[0], "least": txn[1]}, _metadata(*txn),
        {"op": "abort", "most": 1, "least": 424242})
    ok(abort)
    assert ok(after)["status"] == "ABORTED"
    assert "(1,424242)" in raised(unknown, "NotFoundException", 404)


def test_transaction_metadata_lists_the_participants(server_with: Servers, admin_for: Admins) -> None:
    """transactionMetadata and slowTransactions name each partition the txn produced to and each subscription
    it acked on, as a broker's do; both maps were always empty."""
    server = server_with("--coordinators", "2")
    txn = asyncio.run(_with_participants(server.port))
    meta, slow = admin_for(server.admin_url).run(_metadata(*txn), {"op": "slow", "timeoutMs": 0})
    for value in (ok(meta), ok(slow)[f"({txn[0]},{txn[1]})"]):
        assert set(value["producedPartitions"]) == {PRODUCED}, value
        assert {t: set(subs) for t, subs in value["ackedPartitions"].items()} == {ACKED_TOPIC: {ACKED_SUB}}, value


def test_a_workers_admin_port_redirects_to_the_worker_that_leads_the_coordinator(server_with: Servers,
                                                                                 admin_for: Admins) -> None:
    """With --workers 2, worker 0's admin port asked about coordinator 1 redirects (307) to worker 1's, which
    the client follows: it answered "transaction (1,...) not found" and an empty slowTransactions (its store
    does not hold coordinator 1), and a force-abort there was refused."""
    server = server_with("--coordinators", "2", "--workers", "2")
    _, txn1 = asyncio.run(txns_on_coordinators(server.port, 2, range(2), commit=None))
    admin = admin_for(server.worker_admin_url(0))
    meta, slow, stats, abort, after = admin.run(
        _metadata(*txn1), {"op": "slow", "timeoutMs": 0, "coordinatorId": 1}, {"op": "coordinatorStatsById", "id": 1},
        {"op": "abort", "most": txn1[0], "least": txn1[1]}, _metadata(*txn1))
    assert ok(meta)["status"] == "OPEN"
    assert set(ok(slow)) == {f"({txn1[0]},{txn1[1]})"}
    assert ok(stats)["state"] == "Ready" and ok(stats)["ongoingTxnSize"] == 1
    ok(abort)
    assert ok(after)["status"] == "ABORTED"


def test_the_supervisors_admin_url_answers_for_every_worker(server_with: Servers, admin_for: Admins,
                                                            tmp_path: Path) -> None:
    """With --workers 2, the one admin URL the operator configured (--admin-listen, the supervisor's) answered
    "no such endpoint" to every transactions call: only the workers' own ports (+1 + k) served them. It now
    forwards each call to the worker that leads the coordinator, over HTTPS, with the caller's token."""
    from tests.security.pki import TestCa, data_url, make_token

    ca = TestCa(tmp_path)
    server_cert = ca.issue("tc-server", "server", server=True)
    ops_cert = ca.issue("ops", "ops-client")
    secret = b"s" * 32
    server = server_with("--coordinators", "4", "--workers", "2", "--admin-tls",
                         "--tls-cert-file", str(server_cert.cert_file), "--tls-key-file", str(server_cert.key_file),
                         "--tls-trust-certs-file", str(ca.cert_file), "--authentication-providers", "token,tls",
                         "--token-secret-key", data_url(secret), "--superuser-roles", "ops")
    as_alice = ClientAuth("token", make_token(secret, "HS256", "alice").encode())
    txns = asyncio.run(txns_on_coordinators(server.port, 4, range(4), commit=None, auth=as_alice))
    url = f"https://localhost:{server.admin_port}"
    trust = {"tlsTrustCertsFilePath": str(ca.cert_file), "enableTlsHostnameVerification": True}
    plugin = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
    admin = admin_for(url, **trust, authPlugin=plugin, authParams=f"token:{make_token(secret, 'HS256', 'ops')}")
    meta1, meta3, slow, stats, abort, after = admin.run(
        _metadata(*txns[1]), _metadata(*txns[3]), {"op": "slow", "timeoutMs": 0}, {"op": "coordinatorStats"},
        {"op": "abort", "most": txns[3][0], "least": txns[3][1]}, _metadata(*txns[3]))
    assert ok(meta1)["status"] == ok(meta3)["status"] == "OPEN"
    assert set(ok(slow)) == {f"({most},{least})" for most, least in txns}
    assert {tc: (value["state"], value["ongoingTxnSize"]) for tc, value in ok(stats).items()} == {
        str(tc): ("Ready", 1) for tc in range(4)}
    ok(abort)
    assert ok(after)["status"] == "ABORTED"

    (alice,) = admin_for(url, **trust, authPlugin=plugin,
                         authParams=f"token:{make_token(secret, 'HS256', 'alice')}").run({"op": "coordinatorStats"})
    assert "'alice' is not a superuser" in raised(alice, "NotAuthorizedException", 403)
    # A client certificate proves who called the supervisor, but cannot be passed on: said, with where to ask.
    (by_cert,) = admin_for(url, **trust, authPlugin="org.apache.pulsar.client.impl.auth.AuthenticationTls",
                           authParams=f"tlsCertFile:{ops_cert.cert_file},tlsKeyFile:{ops_cert.key_file}").run(
        {"op": "coordinatorStats"})
    assert server.worker_admin_url(1) in raised(by_cert, "NotAuthorizedException", 401)


def test_what_the_coordinator_does_not_hold_is_refused_saying_where_it_is(server_with: Servers,
                                                                          admin_for: Admins) -> None:
    """The transaction buffer and pending-ack stats are a broker's topics' state, and the number of
    coordinators is a setting: each answer says so, not "no such endpoint"."""
    server = server_with("--coordinators", "2")
    buffer, pending, scale = admin_for(server.admin_url).run(
        {"op": "bufferStats", "topic": PRODUCED}, {"op": "pendingAckStats", "topic": ACKED_TOPIC, "sub": ACKED_SUB},
        {"op": "scale", "replicas": 4})
    for result in (buffer, pending):
        assert "broker's web service URL" in raised(result, "NotFoundException", 404)
    assert "--coordinators" in raised(scale, "PulsarAdminException", 406)
