"""The supervisor of ``--workers N`` (tc_server/supervisor.py) run in this process over stand-in workers:
real processes and real signals, each a few lines of Python that answer ``/readyz`` on the worker's
admin port, so that restarts and stops can be driven without a tc-server start per worker.
tests/server/test_workers.py runs the real thing."""

from __future__ import annotations

import os
import subprocess
import sys

# Bound on a stand-in process's run (interpreter start on a loaded machine).
PROCESS_BOUND_S = 60.0


def test_a_worker_follows_the_supervisor_that_started_it_whatever_its_pid() -> None:
    """The worker's check of its parent, with the supervisor's pid given as the supervisor gives it.

    The case that failed, a supervisor that is PID 1 (the Docker image's entrypoint), needs a PID
    namespace (``unshare --pid``), which takes privileges CI may not have; so the check is tested here
    with the pid injected: a worker whose given supervisor is its parent keeps running, whatever that pid
    is (it was compared with 1, so under a PID 1 supervisor every worker exited at once), and a worker
    whose given supervisor is not its parent (gone: the worker was left to init or to a subreaper) exits.
    """
    follow = "import sys; from tc_server.supervisor import follow_supervisor; " \
             "follow_supervisor(int(sys.argv[1])); print('following')"
    under_its_supervisor = subprocess.run([sys.executable, "-c", follow, str(os.getpid())],
                                          capture_output=True, text=True, timeout=PROCESS_BOUND_S, check=False)
    assert (under_its_supervisor.returncode, under_its_supervisor.stdout) == (0, "following\n"), \
        under_its_supervisor.stderr
    # This test's own parent: alive, but not the parent of the process started here.
    supervisor_gone = subprocess.run([sys.executable, "-c", follow, str(os.getppid())],
                                     capture_output=True, text=True, timeout=PROCESS_BOUND_S, check=False)
    assert (supervisor_gone.returncode, supervisor_gone.stdout) == (1, ""), supervisor_gone.stderr
