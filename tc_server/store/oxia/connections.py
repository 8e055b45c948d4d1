"""One gRPC channel per server address (docs/oxia-client.md: requests go to each shard's leader).

Every shard led by the same server shares its channel: gRPC multiplexes the write streams, reads and
notification streams of all of them over one HTTP/2 connection.
"""

from __future__ import annotations

import grpc

from tc_server._proto import oxia_client_pb2_grpc as pb_grpc
from tc_server.store.api import StoreClosedError

# Oxia's server rejects client keepalive pings more often than every 5 s (docs/oxia-client.md); 10 s stays
# clear of that while still noticing a dead peer well within a session timeout.
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
# Oxia's server accepts messages up to 256 MiB (docs/oxia-client.md); scans come back in chunks far below
# this, but a single large record must not be refused by the client's default 4 MiB.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Reconnect quickly after a server restart; the store applies its own request timeout.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class ConnectionPool:
    """Channels and stubs keyed by ``host:port``, created on first use."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.OxiaClientStub] = {}
        self._closed = False

    def stub(self, address: str) -> pb_grpc.OxiaClientStub:
        """The stub for ``address``. Raises :class:`StoreClosedError` after :meth:`close`."""
        if self._closed:
            raise StoreClosedError("the Oxia store is closed")
        stub = self._stubs.get(address)
        if stub is None:
            channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._channels[address] = channel
            # The generated stub has no annotations (tc_server/_proto is not type-checked).
            stub = self._stubs[address] = pb_grpc.OxiaClientStub(channel)  # type: ignore[no-untyped-call]
        return stub

    async def close(self) -> None:
        """Close every channel; calls still running on them end with CANCELLED."""
        self._closed = True
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        for channel in channels:
            await channel.close()
