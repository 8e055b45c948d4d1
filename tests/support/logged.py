"""What a tc-server process logged, read back: the lines that are JSON objects (--log-format json)."""

from __future__ import annotations

import json
from typing import Any


def json_objects(lines: list[str]) -> list[dict[str, Any]]:
    """The lines that are one JSON object each, parsed, in order (other lines left out)."""
    found = []
    for line in lines:
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            found.append(parsed)
    return found
