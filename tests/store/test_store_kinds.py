"""The one registry of store kinds (tc_server.store.STORE_KINDS): settings, the factory and the
conformance suite agree with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tc_server.config import ConfigError, Settings
from tc_server.store import DURABLE_STORE_KINDS, LOCAL_STORE_KINDS, STORE_KINDS, open_store
from tests.store.conftest import BACKENDS


def test_every_kind_runs_the_conformance_suite() -> None:
    # Oxia runs as "oxia-standin-…" (and "oxia-real-…" where the server can be installed).
    covered = {name.split("-")[0] for name in BACKENDS}
    assert set(STORE_KINDS) <= covered, f"no conformance backend for {set(STORE_KINDS) - covered}"


def test_the_derived_lists() -> None:
    assert LOCAL_STORE_KINDS == ("memory", "embedded")
    assert DURABLE_STORE_KINDS == ("embedded", "oxia")


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_settings_accept_every_kind(kind: str) -> None:
    assert Settings(store=kind).validate().store == kind


def test_settings_name_the_kinds_when_refusing_one() -> None:
    with pytest.raises(ConfigError, match="store: must be one of memory, embedded, oxia") as refused:
        Settings(store="zookeeper").validate()
    assert "zookeeper" in str(refused.value)


async def test_open_store_refuses_an_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown store kind 'zookeeper'; expected one of memory, embedded, oxia"):
        await open_store("zookeeper", data_dir=str(tmp_path))


@pytest.mark.parametrize("kind", LOCAL_STORE_KINDS)
async def test_open_store_opens_the_local_kinds(kind: str, tmp_path: Path) -> None:
    store = await open_store(kind, data_dir=str(tmp_path))
    try:
        written = await store.put("/k", b"v")
        assert (await store.get("/k")) == written
    finally:
        await store.close()
