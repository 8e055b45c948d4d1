"""``--baseline-src DIR`` of the benchmarks that measure two source trees in one sitting (vs_pulsar, txn_java,
instructions): a directory without a ``tc_server`` package is refused by the argument parser, naming it,
before anything starts; a good one is resolved and put first on the baseline tc-server's PYTHONPATH."""

from __future__ import annotations

from pathlib import Path

import pytest

from tc_server.bench import instructions, txn_java, vs_pulsar
from tc_server.bench.process import baseline_env, baseline_src


def test_a_tree_with_the_package_is_taken_and_goes_first_on_the_path(tmp_path: Path) -> None:
    (tmp_path / "tree" / "tc_server").mkdir(parents=True)
    (tmp_path / "tree" / "tc_server" / "__init__.py").write_text("")
    src = baseline_src(str(tmp_path / "tree" / "."))
    assert src == (tmp_path / "tree").resolve()
    assert baseline_env(src) == {"PYTHONPATH": str(src)}


@pytest.mark.parametrize("bench", [vs_pulsar, txn_java, instructions])
def test_a_directory_without_the_package_is_refused_at_parse(bench: object, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.main(["--baseline-src", str(tmp_path)])  # type: ignore[attr-defined]
    assert exited.value.code == 2
    assert f"{tmp_path}: no tc_server/__init__.py there" in capsys.readouterr().err
