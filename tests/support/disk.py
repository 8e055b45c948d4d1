"""Real disk trouble under a running tc-server: a small tmpfs that fills up (ENOSPC), a read-only bind mount
over a directory (EROFS), and the embedded store's writer process to kill. Mounting needs root (CAP_SYS_ADMIN),
which this project's test machines give; without it these fail, as a missing broker does."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tc_server.bench.process import descendants_of


def _mount(*args: str) -> None:
    run = subprocess.run(["mount", *args], capture_output=True, text=True)
    assert run.returncode == 0, f"mount {' '.join(args)} failed (these tests need root): {run.stderr.strip()}"


def _unmount(path: Path) -> None:
    for _ in range(50):  # a process that just died may hold a file a moment longer
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. "6m") mounted at ``path`` while the block runs."""
    path.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    try:
        yield path
    finally:
        _unmount(path)


@contextlib.contextmanager
def bind_mounted(path: Path) -> Iterator[Path]:
    """``path`` bind-mounted over itself, so that it can be made read-only (:func:`remount`) in place."""
    _mount("--bind", str(path), str(path))
    try:
        yield path
    finally:
        _unmount(path)


def remount(path: Path, *, read_only: bool) -> None:
    _mount("-o", f"remount,bind,{'ro' if read_only else 'rw'}", str(path))


def fill(path: Path) -> Path:
    """Fill the file system of ``path`` to its last byte; returns the filler file (unlink it to free)."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for size in (65536, 4096, 512, 1):
            chunk = b"\0" * size
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, chunk)
    finally:
        os.close(fd)
    return filler


def writer_pid(server_pid: int) -> int:
    """The embedded store's writer process of the tc-server ``server_pid``."""
    found = [pid for pid in descendants_of(server_pid)
             if "sqlite_writer" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")]
    assert len(found) == 1, found
    return found[0]
