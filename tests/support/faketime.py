"""A real process with a faked wall clock: libfaketime (Debian's faketime package, `make debian-tools`) preloaded
into it, which its children (the embedded store's writer) inherit; the kernel and the test keep the real clock.

libfaketime 0.9.10 also breaks some of a faked process's own waits: with its monotonic clock left alone (as
here: faked, an offset back could take it below zero) ``time.sleep`` fails with EINVAL (libfaketime's
``clock_nanosleep`` with an absolute deadline), and with it faked too, timed condition waits hang. A faked
tc-server serves normally, but its graceful stop waits for the writer process with ``time.sleep`` and fails:
kill it."""

from __future__ import annotations

import glob

import pytest

# Where Debian's libfaketime package puts the library (the faketime command preloads it the same way; started
# through that command, tc-server would not be the process the test signals).
LIBFAKETIME = "/usr/lib/*/faketime/libfaketime.so.1"


def faked_clock_env(offset: str) -> dict[str, str]:
    """The environment of a process whose wall clock is ``offset`` off (libfaketime's syntax: ``+1h``, ``-30m``),
    its monotonic clock left alone. Fails the test when libfaketime is not installed."""
    found = sorted(glob.glob(LIBFAKETIME))
    if not found:
        pytest.fail(f"no {LIBFAKETIME}: `make debian-tools` installs Debian's faketime package")
    return {"LD_PRELOAD": found[0], "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
