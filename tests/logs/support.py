"""Reading what a real tc-server process wrote to its log file (tests/support/server_process.py puts the
process's stderr in ``log_path``, after a ``---- start`` line of the launcher's own)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.logged import json_objects


def log_lines(log_path: Path) -> list[str]:
    """Every line the process wrote (the launcher's ``---- start`` lines left out)."""
    return [line for line in log_path.read_text(errors="replace").splitlines()
            if line.strip() and not line.startswith("---- start ")]


def not_json(lines: list[str]) -> list[str]:
    """The lines that are not one JSON object each."""
    return [line for line in lines if not json_objects([line])]


def events(log_path: Path) -> list[dict[str, Any]]:
    """The JSON lines of the log, parsed (other lines skipped)."""
    return json_objects(log_lines(log_path))


def counts(log_path: Path) -> Counter[str]:
    return Counter(str(event.get("event")) for event in events(log_path))


def named(log_path: Path, event: str) -> list[dict[str, Any]]:
    return [e for e in events(log_path) if e.get("event") == event]
