"""``die_with_parent()``: ask Linux to SIGKILL this process when the thread that started it ends (prctl
``PR_SET_PDEATHSIG``), whatever ends it, ``kill -9`` included.

Used by a worker of ``--workers N`` (tc_server/supervisor.py) and by the embedded store's writer process
(tc_server/store/sqlite_writer.py): neither may outlive the process that started it holding ports or the
store file's lock. A writer that was stopped (SIGSTOP) or stalled on a disk never reads the EOF that
ends it otherwise, and a tc-server started again on the same data found the file in use.

Standard library only: the writer runs with no site packages (``python -I -S``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from typing import Final

PR_SET_PDEATHSIG: Final = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent ends. SIGKILL: a kill loses nothing acknowledged (the
    embedded store answers a write once it is on disk), and it reaches a stopped process too. A no-op
    where prctl is missing (not Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def parent_gone(parent_pid: int | None) -> bool:
    """After :func:`die_with_parent`: whether the parent ended before the request took effect (the interpreter's
    start takes tens of ms), so that nothing will signal this process: it was handed to init or a subreaper.
    ``parent_pid``: the parent's pid, as the parent passed it; compared with it, not with 1, since a parent may be
    PID 1 itself (a container's first process). None (not passed): init as the parent says so."""
    parent = os.getppid()
    return parent == 1 if parent_pid is None else parent != parent_pid
