"""The Pulsar-protocol listener: accepts connections and stops them gracefully.

Shutdown order (as uvicorn's): stop accepting, let the requests in flight finish within a bound,
then close every connection.
"""

from __future__ import annotations

import asyncio

import structlog

from tc_server.server.connection import ClientConnection, ServerContext

log = structlog.get_logger("tc_server.listener")


class PulsarListener:
    def __init__(self, context: ServerContext, host: str, port: int) -> None:
        self.context = context
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientConnection(self.context), self._host, self._port, reuse_address=True, backlog=1024
        )
        log.info("listening", address=f"{self._host}:{self.port}")

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self, drain_timeout_s: float = 5.0) -> None:
        if self._server is None:
            return
        self._server.close()
        connections = list(self.context.connections)
        if connections:
            await asyncio.gather(*(c.drain(drain_timeout_s) for c in connections))
        await self._server.wait_closed()
        self._server = None
