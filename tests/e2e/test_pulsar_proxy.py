"""A real Pulsar proxy in front of tc-server (``--proxy-roles``), as clusters that give clients one proxy
URL run it: stock Java clients -> pulsar-proxy (4.0.8, token authentication) -> tc-server (the proxy's
``brokerServiceURL``; token authentication, ``--proxy-roles pulsar-proxy``) -> the real 4.2.4 broker
(token authentication and authorization, ``proxyRoles=pulsar-proxy``).

The proxy connects to tc-server with its own token and names each client in ``original_principal``.
With ``--proxy-roles`` the client owns its txn (not the proxy's role) and its commit through the proxy
delivers its messages (tests/security/test_proxy_roles.py shows another client behind the same proxy
refused on it). Needs `make pulsar-broker pulsar-proxy interop-java`; any missing fails the test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tc_server.bench.process import TcServerProcess
from tc_server.bench.pulsar_broker import BrokerStartError
from tests.interop.conftest import Harness
from tests.security.support import Keys, admin_json
from tests.support.front_door import start_front_door
from tests.support.pulsar_broker import TOKEN_PLUGIN, PulsarBroker, discard, running_broker, token_auth_broker
from tests.support.pulsar_proxy import MAKE_COMMAND, PulsarProxy
from tests.support.server_process import started

pytestmark = [pytest.mark.java, pytest.mark.slow, pytest.mark.timeout(600)]

PROXY_ROLE = "pulsar-proxy"
PARTITIONS = 2
MESSAGES = 10


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@pytest.fixture(scope="module")
def broker(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarBroker]:
    admin = keys.token("broker-admin")
    secured = token_auth_broker(tmp_path_factory.mktemp("proxied-broker"), keys.secret, admin,
                                super_users="broker-admin,tc-server")
    secured.extra_config["proxyRoles"] = PROXY_ROLE
    yield from running_broker(secured)


@pytest.fixture(scope="module")
def tc_server(broker: PulsarBroker, keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TcServerProcess]:
    workdir = tmp_path_factory.mktemp("proxied-tc-server")
    key_file = workdir / "secret.key"
    key_file.write_bytes(keys.secret)
    # --lookup-connections direct: a lookup names the broker itself, so the proxy carries produce and
    # consume connections straight to it, and tc-server sees the proxy's coordinator connections only.
    server = start_front_door(broker.url, workdir,
                              "--authentication-providers", "token", "--token-secret-key", f"file://{key_file}",
                              "--superuser-roles", "tc-admin", "--proxy-roles", PROXY_ROLE,
                              "--lookup-connections", "direct",
                              "--broker-client-auth-plugin", TOKEN_PLUGIN,
                              "--broker-client-auth-params", f"token:{keys.token('tc-server')}")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def proxy(tc_server: TcServerProcess, broker: PulsarBroker, keys: Keys,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarProxy]:
    running = PulsarProxy(tmp_path_factory.mktemp("pulsar-proxy"), tc_server.url, broker.admin_url, keys.secret,
                          keys.token(PROXY_ROLE))
    yield started(running, "the Pulsar proxy", BrokerStartError, f"\n(to install it: `{MAKE_COMMAND}`)")
    discard(running)


def grant(broker: PulsarBroker, role: str) -> None:
    code, body = broker.post_json(f"/admin/v2/namespaces/public/default/permissions/{role}", ["produce", "consume"])
    assert code in (200, 204), (code, body)


def test_each_client_behind_a_pulsar_proxy_owns_its_txns(java_harness: Harness, broker: PulsarBroker,
                                                          tc_server: TcServerProcess, proxy: PulsarProxy,
                                                          keys: Keys) -> None:
    # The broker checks the proxy's role and the client it names, both.
    for role in (PROXY_ROLE, "app"):
        grant(broker, role)
    topic = "persistent://public/default/through-pulsar-proxy"
    broker.create_topic(topic, PARTITIONS)

    result = java_harness.run("txn-produce", timeout_s=240, service_url=proxy.url, topic=topic, count=MESSAGES,
                              action="commit", op_timeout_ms=30_000, receive_timeout_ms=30_000,
                              token=keys.token("app")).result
    assert result["end"]["outcome"] == "ok", (result, tc_server.log_tail(), proxy.log_tail())
    assert result["visible_before_end"] == [], result
    assert sorted(result["received_after_end"]) == sorted(f"txn-{i}" for i in range(MESSAGES)), result
    assert sorted(result["received_with_markers"]) == sorted(result["markers_sent"]), result

    # The txn is the client's, not the proxy's (read with a tc-server superuser token).
    status, header = admin_json(tc_server, f"/admin/v3/transactions/transactionMetadata/{result['most']}/"
                                           f"{result['least']}", keys.token("tc-admin"))
    assert status == 200 and header["owner"] == "app" and header["status"] == "COMMITTED", header
    log = tc_server.log_path.read_text()
    assert '"role": "pulsar-proxy"' in log or "role=pulsar-proxy" in log, tc_server.log_tail()
