"""A memory store whose header writes wait for a gate: a stalled store, on cue (the server tests)."""

from __future__ import annotations

import asyncio

from tc_server.store.memory import MemoryStore


class GatedStore(MemoryStore):
    """Header writes wait for the gate: a stalled store, on cue."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def put(self, key, value, **kwargs):
        if key.startswith("/txn/id/"):
            await self.gate.wait()
        return await super().put(key, value, **kwargs)
