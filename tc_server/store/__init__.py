"""Metadata-store backends behind one Protocol (design §5) and the factory that opens them."""

from __future__ import annotations

import importlib
from typing import Any

from tc_server.store.api import MetadataStore

STORE_KINDS = ("memory", "embedded", "oxia")


async def open_store(kind: str, *, data_dir: str, **options: Any) -> MetadataStore:
    """Open the backend named ``kind``.

    * ``memory``: a fresh in-memory data set (``data_dir`` unused); unit tests only.
    * ``embedded``: the SQLite file in ``data_dir``; ``options`` go to :meth:`EmbeddedStore.open`.
    * ``oxia``: ``tc_server.store.oxia.open_store(data_dir=..., **options)``.

    Raises ValueError for an unknown kind or when the backend's module is not available.
    """
    # Backends are imported on demand so that e.g. the memory store does not pay for grpc.
    if kind == "memory":
        from tc_server.store.memory import MemoryStore

        if options:
            raise ValueError(f"the memory store takes no options, got {sorted(options)}")
        return MemoryStore()
    if kind == "embedded":
        from tc_server.store.embedded import EmbeddedStore

        return await EmbeddedStore.open(data_dir, **options)
    if kind == "oxia":
        # The Oxia backend lives in its own package and exposes
        # ``async def open_store(*, data_dir: str, **options) -> MetadataStore``.
        try:
            oxia = importlib.import_module("tc_server.store.oxia")
        except ModuleNotFoundError as exc:
            if exc.name not in ("tc_server.store.oxia",):
                raise
            raise ValueError("the oxia store backend is not available in this build") from exc
        store: MetadataStore = await oxia.open_store(data_dir=data_dir, **options)
        return store
    raise ValueError(f"unknown store kind {kind!r}; expected one of {', '.join(STORE_KINDS)}")
