"""Fixtures every test directory can use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
