"""A process's state as Linux's /proc tells it, for tests that check what a kill or a stop left running."""

from __future__ import annotations

from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    # After the command name, which is in parentheses and may itself hold spaces.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def state(pid: int) -> str | None:
    """``R``, ``S``, ``T`` (stopped), ``Z`` (a zombie: dead, waiting for its parent to reap it)...; None if gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs or is stopped (a zombie does not count: it is dead)."""
    return state(pid) not in (None, "Z")
