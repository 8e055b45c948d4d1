"""``tc-server export`` where it cannot work says what to do, with exit code 2 and no traceback: in the image
(runtime dependencies only, no pyarrow) and on an embedded store a running server holds."""

from __future__ import annotations

import asyncio
import fcntl
import os
import sys
from pathlib import Path

import pytest

from tc_server.app import open_configured_store
from tc_server.cli import main
from tc_server.config import Settings
from tc_server.store.embedded import DB_FILENAME


def export(data_dir: Path, out: Path) -> int:
    return main(["export", "--store", "embedded", "--data-dir", str(data_dir), "--out", str(out)])


def test_export_without_pyarrow_names_the_audit_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # What the image has: tc_server without the audit extra (None in sys.modules: the import fails).
    monkeypatch.delitem(sys.modules, "tc_server.audit.export", raising=False)
    monkeypatch.delitem(sys.modules, "tc_server.audit.schema", raising=False)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    assert export(tmp_path / "data", tmp_path / "snap") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "pyarrow" in err and "tc-server[audit]" in err, err
    assert not (tmp_path / "data").exists(), "nothing is opened before the export can run"


def test_export_of_a_store_a_server_holds_says_to_stop_it(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    # What a running tc-server holds on its embedded store (tc_server/store/embedded.py, _lock).
    holder = os.open(data / DB_FILENAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert export(data, tmp_path / "snap") == 2
    finally:
        os.close(holder)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("tc-server: cannot export: ") and "in use by another tc-server" in err, err
    assert "stop the tc-server" in err and "--store oxia" in err, err
    assert not (tmp_path / "snap" / "snapshot.json").exists()


def test_export_of_a_directory_without_a_store_says_so_and_creates_none(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # A mistyped --data-dir (or the default ./data from another directory): the export created an empty
    # store there and wrote an empty snapshot, which an audit then passed as a clean store.
    typo = tmp_path / "dta"
    assert export(typo, tmp_path / "snap") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no embedded store" in err and str(typo) in err, err
    assert not (typo / DB_FILENAME).exists()
    assert not (tmp_path / "snap" / "snapshot.json").exists()


def make_embedded_store(data: Path) -> None:
    async def go() -> None:
        store = await open_configured_store(Settings(store="embedded", data_dir=str(data)))
        await store.close()

    asyncio.run(go())


@pytest.mark.parametrize("out_is", ["a non-empty directory", "a file"])
def test_an_out_that_cannot_take_the_snapshot_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          out_is: str) -> None:
    # Before, a traceback and exit code 1 (FileExistsError, NotADirectoryError): a re-run of the same export
    # from cron is the ordinary way to meet the first.
    data, out = tmp_path / "data", tmp_path / "snap"
    make_embedded_store(data)
    if out_is == "a file":
        out.write_text("")
    else:
        out.mkdir()
        (out / "snapshot.json").write_text("{}")
    assert export(data, out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tc-server: cannot export: "), err
