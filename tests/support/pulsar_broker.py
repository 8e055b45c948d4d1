"""The real Pulsar broker for the tests: the one launcher lives in tc_server/bench/pulsar_broker.py (the
side-by-side benchmark starts it too, and the bench package must not import tests/)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

from tc_server.bench.process import LoggedProcess
from tc_server.bench.pulsar_broker import (
    ASSIGN_TOPIC,
    BROKER_LIB,
    CLUSTER,
    COORDINATORS,
    MAKE_COMMAND,
    QUICK_START_JVM,
    BrokerStartError,
    PulsarBroker,
    split_topic,
)
from tests.support.server_process import started

__all__ = ["ASSIGN_TOPIC", "BROKER_LIB", "CLUSTER", "COORDINATORS", "MAKE_COMMAND", "TOKEN_PLUGIN",
           "TOKEN_PROVIDER", "BrokerStartError", "PulsarBroker", "QUICK_START_JVM", "discard", "running_broker",
           "split_topic", "token_auth_broker"]

TOKEN_PROVIDER = "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


def running_broker(broker: PulsarBroker) -> Iterator[PulsarBroker]:
    """A fixture's body: start ``broker`` (a broker that cannot start fails the test with its log and the
    command that installs it; it never skips), yield it, kill it (see :func:`discard`)."""
    yield started(broker, "the Pulsar broker", BrokerStartError, f"\n(to install it: `{MAKE_COMMAND}`)")
    discard(broker)


def discard(process: LoggedProcess) -> None:
    """The end of a broker or proxy whose data goes with the test: SIGKILL, since nothing of it is kept.
    Tests that need a graceful stop call stop()."""
    process.kill()


def token_auth_broker(workdir: Path, secret: bytes, admin_token: str, super_users: str,
                      proxy_roles: str = "") -> PulsarBroker:
    """A broker (not started) with HS256 token authentication and authorization on: ``secret`` is its key,
    ``super_users`` its superuser roles, ``proxy_roles`` the roles it takes an original_principal from (as a
    Pulsar proxy's), ``admin_token`` (a superuser's) what it and the tests' admin calls present."""
    return PulsarBroker(workdir, extra_config={
        "proxyRoles": proxy_roles,
        "authenticationEnabled": "true",
        "authorizationEnabled": "true",
        "authenticationProviders": TOKEN_PROVIDER,
        "tokenSecretKey": "data:;base64," + base64.b64encode(secret).decode(),
        "superUserRoles": super_users,
        "brokerClientAuthenticationPlugin": TOKEN_PLUGIN,
        "brokerClientAuthenticationParameters": f"token:{admin_token}",
    }, admin_authorization=f"Bearer {admin_token}", jvm_options=QUICK_START_JVM)
