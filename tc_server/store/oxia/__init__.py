"""The Oxia backend: an asyncio client for Oxia's gRPC client API (docs/oxia-client.md).

One module per concern: :mod:`.routing` (key -> shard), :mod:`.assignments` (the shard map stream),
:mod:`.connections` (channels per leader), :mod:`.write_stream` (batched writes per shard),
:mod:`.reads` (gets and scans), :mod:`.sessions` (ephemeral records), :mod:`.notifications` (change
streams) and :mod:`.store` (:class:`OxiaStore`, the :class:`~tc_server.store.api.MetadataStore`).
"""

from tc_server.store.oxia.store import OxiaStore, connect

__all__ = ["OxiaStore", "connect"]
