"""Fixtures of the Pulsar 5 tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.oxia_standin import StandinStartError, standin_oxia_process


@pytest.fixture
def oxia_address(tmp_path: Path) -> Iterator[str]:
    """The project's Oxia stand-in (one shard) for one test; a module may override it (more shards, a module's
    scope)."""
    try:
        with standin_oxia_process(tmp_path / "standin.log", shards=1) as address:
            yield address
    except StandinStartError as exc:
        pytest.fail(str(exc))
