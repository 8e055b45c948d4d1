"""Fixtures every test directory can use."""

from __future__ import annotations

import inspect
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tc_server.bench.process import TcServerProcess
from tc_server.logs import logging_state, restore_logging
from tests.support.front_door import start_front_door
from tests.support.pulsar_broker import QUICK_START_JVM, PulsarBroker, running_broker

# TC_TEST_LOOP=uvloop runs every asyncio test on uvloop, the event loop production runs on (make
# test-uvloop); unset (or "asyncio") leaves pytest-asyncio's default loop alone. uvloop differs where
# it matters to us: its transports are not asyncio.Transport subclasses, and it schedules callbacks
# and flow control its own way.
TEST_LOOPS = ("asyncio", "uvloop")
TEST_LOOP = os.environ.get("TC_TEST_LOOP", "asyncio")
if TEST_LOOP not in TEST_LOOPS:
    raise pytest.UsageError(f"TC_TEST_LOOP={TEST_LOOP!r}: expected one of {', '.join(TEST_LOOPS)}")
if TEST_LOOP == "uvloop":
    import uvloop

    def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
        """pytest-asyncio's hook: every asyncio test and fixture runs on a fresh uvloop loop."""
        return {"uvloop": uvloop.new_event_loop}


# make test runs the suite on three processes (pytest-xdist, --dist loadgroup): each group of tests below runs
# whole in one of them. A test of the session's broker or Spark joins that one group, so each is started once
# (a second broker would cost its start and a core); every other test stays with its module, whose
# module-scoped fixtures (its own brokers, clusters, servers) are then started once too.
SHARED_SESSION_FIXTURES = {"pulsar_broker": "session-pulsar-broker", "front_door_server": "session-pulsar-broker",
                           "spark": "session-spark"}


# tryfirst: pytest-xdist reads the groups in its own pytest_collection_modifyitems, appending each to its test's
# id, which is what --dist loadgroup schedules by; so the markers must be there before it runs. Until 2026-12-02
# this hook ran after it, and pytest 9.2 ignores the appended id anyway (pyproject.toml pins pytest below it):
# either way no group was seen, every module's tests were spread over both processes, and each process started
# its own session broker, Spark session and module fixtures. tests/test_xdist_groups.py checks the groups hold.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TEST_LOOP == "uvloop":
        # Only the asyncio tests: a test that is no coroutine runs the same on either loop setting (it
        # drives tc-server processes, which run on uvloop anyway, or no loop at all), so rerunning it here
        # only took CI time. Reported as deselected.
        left_out = [item for item in items
                    if not inspect.iscoroutinefunction(getattr(item, "function", None))]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if item not in set(left_out)]
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        group = next((SHARED_SESSION_FIXTURES[name] for name in SHARED_SESSION_FIXTURES if name in fixtures),
                     item.nodeid.partition("::")[0])
        item.add_marker(pytest.mark.xdist_group(group))


# The signals whose disposition a child process inherits when it is "ignored" (exec resets only handlers).
INHERITED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _signals_left_as_they_were() -> Iterator[None]:
    """Every test leaves this process's signal handling as it found it (restored either way), and one that
    left a signal ignored fails: every process the suite started afterwards inherited that. A JVM started
    with SIGTERM ignored installs no handler for it, so each later broker stop waited out its 30 s bound
    (an in-process ``tc-server export`` did it, for the rest of every CI run)."""
    before = {sig: signal.getsignal(sig) for sig in INHERITED_SIGNALS}
    yield
    left_ignored = []
    for sig, handler in before.items():
        if signal.getsignal(sig) is signal.SIG_IGN and handler is not signal.SIG_IGN:
            left_ignored.append(sig.name)
        if handler is not None:  # None: a handler not set from Python, which cannot be set back
            signal.signal(sig, handler)
    assert not left_ignored, f"the test left {', '.join(left_ignored)} ignored in the test process"


@pytest.fixture(autouse=True)
def _logging_left_as_it_was() -> Iterator[None]:
    """A test that runs a command in-process (``tc-server export``, a benchmark's main) has logging configured
    as that command does (tc_server/logs.py, configure_command_logging): set back after it, as the suite runs,
    so that no later test logs under a command's level and format."""
    state = logging_state()
    yield
    if logging_state() != state:
        restore_logging(state)


@pytest.fixture(scope="session")
def pulsar_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulsarBroker]:
    """One real Pulsar 4.2.4 standalone broker for the whole session, with 16 transaction coordinators.

    Tests that stop or restart it must leave it running. A broker that cannot start fails the test
    with its log and the command that installs it; it never skips (docs/architecture.md §9).
    """
    broker = PulsarBroker(tmp_path_factory.mktemp("pulsar-broker"), jvm_options=QUICK_START_JVM)
    yield from running_broker(broker)


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
