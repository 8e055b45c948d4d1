"""`tc-server export` refuses a data directory without a store, because "its export would look like a clean,
empty one" (cli._export). The memory store is the same trap, and worse: it lives inside the process that
serves it, so an export (another process) can never read a single record, yet it exits 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.run_as_operator import clean_env, tc_server


@pytest.mark.parametrize("how", ["flag", "env"])
def test_export_of_the_memory_store_is_refused_not_an_empty_snapshot(tmp_path: Path, how: str) -> None:
    out = tmp_path / "snapshot"
    if how == "flag":
        done = tc_server(["export", "--store", "memory", "--out", str(out)], clean_env())
    else:  # `kubectl exec` into a container whose environment says TC_SERVER_STORE=memory
        done = tc_server(["export", "--out", str(out)], clean_env(TC_SERVER_STORE="memory"))
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "memory" in done.stderr
    assert not out.exists() or not any(out.iterdir()), "an empty snapshot that looks like a clean store"
