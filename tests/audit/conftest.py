"""Fixtures for the audit pipeline tests: one local Spark session for the whole run.

A missing Java fails the Spark tests with the fix, it never skips them (docs/architecture.md §9).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest


def _java_problem() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return None
    if shutil.which("java"):
        return None
    return (
        "the audit's Spark tests need Java 17: `java` is not on PATH and JAVA_HOME is not set "
        "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    problem = _java_problem()
    if problem:
        pytest.fail(problem, pytrace=False)
    from tc_server.audit.job import spark_session

    try:
        # Two local cores and a small heap: the test snapshots are tiny.
        session, owned = spark_session("local[2]", driver_memory="1g")
    except Exception as exc:
        pytest.fail(f"could not start a local Spark session (is Java 17 installed?): {exc}", pytrace=False)
    yield session
    if owned:
        session.stop()
