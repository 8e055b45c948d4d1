"""The real Pulsar broker for the tests: the one launcher lives in tc_server/bench/pulsar_broker.py (the
side-by-side benchmark starts it too, and the bench package must not import tests/)."""

from tc_server.bench.pulsar_broker import (
    ASSIGN_TOPIC,
    BROKER_LIB,
    CLUSTER,
    COORDINATORS,
    MAKE_COMMAND,
    BrokerStartError,
    PulsarBroker,
    split_topic,
)

__all__ = ["ASSIGN_TOPIC", "BROKER_LIB", "CLUSTER", "COORDINATORS", "MAKE_COMMAND", "BrokerStartError",
           "PulsarBroker", "split_topic"]
