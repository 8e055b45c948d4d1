"""tc-server as the one service URL in front of a real broker (the front door, tc_server/server/upstream.py).

``start_front_door`` starts a ``tc-server run`` (the shared launcher, tc_server/bench/process.py) with
``--upstream-url`` naming the broker, so that a stock client pointed at it finds the coordinators there and
every other topic at the broker. The ``front_door_server`` session fixture (tests/conftest.py) is one of
these; tests that need another mode (``--lookup-connections direct``) start their own with this function.
"""

from __future__ import annotations

from pathlib import Path

from tc_server.bench.process import TcServerProcess
from tests.support.server_process import started

# As many coordinators as the broker's own assign topic has (tc_server.bench.pulsar_broker.COORDINATORS):
# clients then see the same partition count whichever of the two answers.
COORDINATORS = 16


def start_front_door(broker_url: str, workdir: Path, *extra_args: str) -> TcServerProcess:
    """A started tc-server (embedded store under ``workdir``) forwarding to ``broker_url``; ``extra_args``
    come last, so they override (``--lookup-connections proxy``). Fails the test with the server's log
    tail when it does not become ready."""
    return started(TcServerProcess(workdir / "data", "--upstream-url", broker_url, "--coordinators",
                                   str(COORDINATORS), *extra_args, log_path=workdir / "tc-server.log"),
                   "the front-door tc-server")

