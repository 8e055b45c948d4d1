"""Metadata-store backends behind one Protocol (docs/architecture.md §3) and the factory that opens them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from tc_server.store.api import MetadataStore


@dataclass(frozen=True)
class StoreKind:
    """One backend as settings, help texts and benchmarks need to know it."""

    summary: str  # for --help: what it is and when to use it
    durable: bool  # what was acknowledged survives a restart of tc-server
    needs_server: bool  # runs against a server that must be started first


# The one registry of store kinds: `tc-server run --store`, the config check, the CLI help, the
# benchmarks and the tests all read it. Adding a backend starts here and in open_store below.
STORE_KINDS: Final[dict[str, StoreKind]] = {
    "memory": StoreKind("in memory, lost on exit; tests only", durable=False, needs_server=False),
    "embedded": StoreKind("SQLite in --data-dir, one instance; the default", durable=True, needs_server=False),
    "oxia": StoreKind("an Oxia cluster at --oxia-address, any number of instances", durable=True,
                      needs_server=True),
}
# The kinds that run on this machine alone: what benchmarks measure unless told otherwise.
LOCAL_STORE_KINDS: Final = tuple(name for name, kind in STORE_KINDS.items() if not kind.needs_server)
# The kinds whose data outlive the process: what a restart or recovery can be measured on.
DURABLE_STORE_KINDS: Final = tuple(name for name, kind in STORE_KINDS.items() if kind.durable)


def store_kinds_help() -> str:
    """``memory (…), embedded (…) or oxia (…)``, for --help texts."""
    parts = [f"{name} ({kind.summary})" for name, kind in STORE_KINDS.items()]
    return ", ".join(parts[:-1]) + " or " + parts[-1]


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
