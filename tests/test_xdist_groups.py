"""make test's processes keep each group of tests (tests/conftest.py) in one of them: under pytest-xdist's
--dist loadgroup, a test's id carries its group. A pytest or pytest-xdist upgrade that drops it fails here,
instead of quietly doubling the suite's brokers and Spark sessions."""

from __future__ import annotations

import pytest


def test_each_test_carries_its_group_to_pytest_xdist(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        return  # one process (TEST_PROCESSES=0, or a single file run by hand): nothing is distributed
    assert request.node.nodeid.endswith("@tests/test_xdist_groups.py"), request.node.nodeid
