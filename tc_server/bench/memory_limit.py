"""Run a process under a real memory limit, as Kubernetes enforces one: a memory cgroup of its own
(issue 15: the hostile-load and recovery figures must hold under the limit the manifests ship).

cgroup v2 (``memory.max`` in a child of /sys/fs/cgroup) where the unified hierarchy has the memory
controller, else cgroup v1 (``memory.limit_in_bytes`` under /sys/fs/cgroup/memory). Past the limit the
kernel reclaims page cache and then OOM-kills, exactly what a container's limit does. ``prlimit --as``
is no substitute (it caps virtual address space, which Python and glibc arenas overshoot by far
without using it), so without a writable memory cgroup :func:`open_memory_limit` raises.

The process enters its group before it execs (``wrap``: a ``sh`` that writes its own pid to the group,
then ``exec``s the command), so every byte it ever allocates is charged there.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
MIB = 1024 * 1024


class MemoryLimitUnavailable(RuntimeError):
    """No memory cgroup this process may create; the message says what was tried."""


class MemoryLimit:
    """One memory cgroup with a limit; :meth:`close` removes it (its processes must have exited)."""

    def __init__(self, path: Path, version: int, limit_bytes: int) -> None:
        self.path = path
        self.version = version
        self.limit_bytes = limit_bytes

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` started inside this group (as the ``command`` of bench.process.TcServerProcess)."""
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path), *command]

    def _read(self, v1: str, v2: str) -> str:
        return (self.path / (v2 if self.version == 2 else v1)).read_text()

    def peak_bytes(self) -> int:
        """The most the group was charged at once (anonymous memory and page cache, as the kernel
        counts against the limit); 0 where the kernel does not say (cgroup v2 before Linux 5.19)."""
        try:
            return int(self._read("memory.max_usage_in_bytes", "memory.peak"))
        except (OSError, ValueError):
            return 0

    def oom_kills(self) -> int:
        """Processes of the group the kernel OOM-killed."""
        try:
            text = self._read("memory.oom_control", "memory.events")
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def describe(self) -> str:
        return f"cgroup v{self.version} {self.path} (limit {self.limit_bytes // MIB} MiB)"

    def close(self, wait_s: float = 10.0) -> None:
        """Remove the group once its processes are gone (rmdir fails while one is left)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def __enter__(self) -> MemoryLimit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_memory_limit(limit_bytes: int, name: str | None = None) -> MemoryLimit:
    """A new memory cgroup limited to ``limit_bytes`` (swap included where v1 can say so). Raises
    MemoryLimitUnavailable naming every place tried and why it failed."""
    name = name or f"tc-server-bench-{os.getpid()}"
    tried = []
    unified = CGROUP_ROOT / "cgroup.controllers"
    candidates = []
    if unified.exists() and "memory" in unified.read_text().split():
        candidates.append((2, CGROUP_ROOT / name, "memory.max"))
    candidates.append((1, CGROUP_ROOT / "memory" / name, "memory.limit_in_bytes"))
    for version, path, limit_file in candidates:
        try:
            path.mkdir()
        except FileExistsError:
            pass
        except OSError as exc:
            tried.append(f"mkdir {path}: {exc.strerror}")
            continue
        try:
            (path / limit_file).write_text(str(limit_bytes))
            if version == 1:
                _no_swap_v1(path, limit_bytes)
        except OSError as exc:
            tried.append(f"write {path / limit_file}: {exc.strerror}")
            path.rmdir()
            continue
        return MemoryLimit(path, version, limit_bytes)
    if not tried:
        tried.append(f"no memory controller under {CGROUP_ROOT}")
    raise MemoryLimitUnavailable("no memory cgroup could be created: " + "; ".join(tried))


def _no_swap_v1(path: Path, limit_bytes: int) -> None:
    """Memory + swap limited too, where the kernel accounts swap (a pod has no swap by default)."""
    memsw = path / "memory.memsw.limit_in_bytes"
    if memsw.exists():
        try:
            memsw.write_text(str(limit_bytes))
        except OSError:
            pass  # swap accounting off: the memory limit alone applies
