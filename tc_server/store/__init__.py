"""Metadata-store backends behind one Protocol (docs/architecture.md §3) and the factory that opens them."""

from __future__ import annotations

from typing import Any

from tc_server.store.api import MetadataStore

STORE_KINDS = ("memory", "embedded", "oxia")


async def open_store(kind: str, *, data_dir: str, **options: Any) -> MetadataStore:
    """Open the backend named ``kind``.

    * ``memory``: a fresh in-memory data set (``data_dir`` unused); unit tests only.
    * ``embedded``: the SQLite file in ``data_dir``; ``options`` go to :meth:`EmbeddedStore.open`.
    * ``oxia``: :func:`tc_server.store.oxia.connect` with ``options`` (``address`` and the rest).

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
        from tc_server.store.oxia import connect

        # data_dir is unused: Oxia holds the data. options: address, namespace, session_timeout_ms,
        # request_timeout_s (see tc_server.store.oxia.connect).
        address = options.pop("address", "127.0.0.1:6648")
        return await connect(address, **options)
    raise ValueError(f"unknown store kind {kind!r}; expected one of {', '.join(STORE_KINDS)}")
