"""``tc-server export`` where it cannot work says what to do, with exit code 2 and no traceback (in the image,
which has the runtime dependencies only, no pyarrow; on a directory without a store); beside a running server it
reads the store and writes nothing to it."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path

import pytest

from tc_server.app import open_configured_store
from tc_server.cli import main
from tc_server.client import connect
from tc_server.config import Settings
from tc_server.store.embedded import DB_FILENAME
from tests.support.server_process import ServerProcess


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


def test_export_beside_a_running_server_reads_its_store_and_writes_nothing(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # Before, the export took the store's lock, so it refused while a tc-server ran on it ("stop the tc-server
    # first": an audit cost a coordinator outage), and once stopped it wrote to the file it exported (the
    # ephemeral records deleted, the layout upgraded). Now it reads the file read-only, beside the server.
    data = tmp_path / "data"
    server = ServerProcess(data, "--coordinators", "2")
    server.start()
    try:
        asyncio.run(drive(server.port, commit=True))
        asyncio.run(drive(server.port, commit=None))  # left open
        before = ephemeral_records(data)
        assert before, "the running server's session holds ephemeral records (its coordinators' leases)"
        assert export(data, tmp_path / "snap") == 0, capsys.readouterr().err
        snapshot = json.loads((tmp_path / "snap" / "snapshot.json").read_text())
        assert snapshot["row_counts"]["headers"] == 2
        assert ephemeral_records(data) == before
        asyncio.run(drive(server.port, commit=False))  # the server goes on serving
    finally:
        assert server.stop() == 0, server.log_tail()


async def drive(port: int, commit: bool | None) -> None:
    """One transaction on coordinator 0: committed, aborted or (None) left open."""
    client = await connect("127.0.0.1", port)
    try:
        assert (await client.tc_client_connect(0)).error is None
        txn = await client.new_txn(0, 60_000)
        assert txn.error is None, txn
        if commit is not None:
            assert (await client.end_txn(txn.most, txn.least, commit=commit)).error is None
    finally:
        client.close()


def ephemeral_records(data: Path) -> list[tuple[str, bytes]]:
    with sqlite3.connect(f"{(data / DB_FILENAME).resolve().as_uri()}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT key, value FROM records WHERE ephemeral = 1 ORDER BY key").fetchall()


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
