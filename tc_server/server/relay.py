"""Carrying a client's connection to a broker byte for byte, as Pulsar's proxy does.

When a broker answers LOOKUP with ``proxy_through_service_url`` (Pulsar standalone always does on
loopback; so does a Pulsar Proxy in front of brokers), the client opens its producer and consumer
connections to its service URL, i.e. to tc-server, naming the broker in CONNECT's
``proxy_to_broker_url`` (docs/client-behaviour.md). tc-server then connects to that broker, sends it the
client's CONNECT (its own credentials, so the broker authenticates the client itself) and from then on
relays bytes both ways without looking at them. Back-pressure runs both ways: a side that cannot keep up
stops the other side's reads.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Protocol, cast

from tc_server.client import Endpoint


class RelayClientSide(Protocol):
    """What the client's connection offers the broker side."""

    def relay_to_client(self, data: bytes) -> None: ...

    def relay_closed(self, exc: Exception | None) -> None: ...

    def pause_client_reading(self) -> None: ...

    def resume_client_reading(self) -> None: ...


class BrokerSide(asyncio.Protocol):
    """The broker end of a carried connection."""

    def __init__(self, client: RelayClientSide) -> None:
        self._client = client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._client.relay_to_client(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._client.relay_closed(exc)

    # The broker is not reading what the client sends: stop reading from the client until it does.
    def pause_writing(self) -> None:
        self._client.pause_client_reading()

    def resume_writing(self) -> None:
        self._client.resume_client_reading()


async def open_relay(url: str, client: RelayClientSide, *, ssl_context: ssl.SSLContext | None,
                     timeout_s: float) -> BrokerSide:
    """Connect to the broker at ``url``. Raises OSError / TimeoutError / ValueError (a bad URL, or a plain one
    with ``ssl_context``: Endpoint.with_tls)."""
    endpoint, ssl_context = Endpoint.with_tls(url, ssl_context)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout_s):
        _, broker = await loop.create_connection(lambda: BrokerSide(client), endpoint.host, endpoint.port,
                                                 ssl=ssl_context)
    return broker
