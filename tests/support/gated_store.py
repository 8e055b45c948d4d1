"""A memory store whose header writes wait for a gate: a stalled store, on cue (the server tests)."""

from __future__ import annotations

import asyncio

from tc_server.store.memory import MemoryStore


class GatedStore(MemoryStore):
    """Header writes wait for the gate: a stalled store, on cue. With ``writes_go_on``, a held write lands
    once the gate opens even if its caller gave up meanwhile (its request's deadline), as the embedded
    store's writer process goes on with a group whose requests timed out; without, the caller's
    cancellation withdraws it."""

    def __init__(self, writes_go_on: bool = False) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.writes_go_on = writes_go_on
        self.held = 0  # header writes waiting at the gate now

    async def put(self, key, value, **kwargs):
        if not key.startswith("/txn/id/"):
            return await super().put(key, value, **kwargs)
        if self.writes_go_on:
            return await asyncio.shield(asyncio.ensure_future(self._after_the_gate(key, value, kwargs)))
        return await self._after_the_gate(key, value, kwargs)

    async def _after_the_gate(self, key, value, kwargs):
        self.held += 1
        try:
            await self.gate.wait()
        finally:
            self.held -= 1
        return await super().put(key, value, **kwargs)
