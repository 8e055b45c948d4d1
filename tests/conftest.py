"""Fixtures every test directory can use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tc_server.bench.process import TcServerProcess
from tests.support.front_door import start_front_door
from tests.support.pulsar_broker import MAKE_COMMAND, BrokerStartError, PulsarBroker


@pytest.fixture(scope="session")
def pulsar_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarBroker]:
    """One real Pulsar 4.2.4 standalone broker for the whole session, with 16 transaction coordinators.

    Tests that stop or restart it must leave it running. A broker that cannot start fails the test
    with its log and the command that installs it; it never skips (docs/architecture.md §9).
    """
    broker = PulsarBroker(tmp_path_factory.mktemp("pulsar-broker"))
    try:
        broker.start()
    except BrokerStartError as exc:
        broker.kill()
        pytest.fail(f"the Pulsar broker did not start: {exc}\n(to install it: `{MAKE_COMMAND}`)")
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def front_door_server(pulsar_broker: PulsarBroker,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[TcServerProcess]:
    """One tc-server for the whole session in front of the session broker (``pulsar_broker``): stock
    clients use its ``url`` as their one service URL; it serves the coordinators and forwards everything
    else to the broker.

    It runs ``tc-server run`` (tests/support/front_door.py) with ``--upstream-url <pulsar_broker.url>``,
    ``--lookup-connections upstream`` (the default: producers and consumers go where the broker's LOOKUP
    answer says; a standalone broker says "through the service URL", so they come through tc-server),
    ``--store embedded`` in a session temporary directory, ``--coordinators 16``, ``--request-timeout-s 10``
    (the default) and 127.0.0.1 on free ports. Its attributes: ``url``, ``port``, ``admin_url``,
    ``log_tail()``, ``get_json(path)``. Tests must not stop it; a test that needs other settings starts
    its own with ``start_front_door(pulsar_broker.url, workdir, *extra_args)``.
    """
    server = start_front_door(pulsar_broker.url, tmp_path_factory.mktemp("front-door"))
    yield server
    server.stop()
