"""Connections to brokers, one per URL, shared by everything tc-server asks of that broker on its own
behalf (lookups for participant delivery, END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION).

A broken connection is replaced on the next ``get``; after a failed attempt the next one waits out an
exponential backoff, so a broker that is down is not hammered by every caller at once.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tc_server.backoff import Backoff
from tc_server.client.connection import PulsarConnection, open_connection
from tc_server.client.errors import ClientError, ConnectionFailed
from tc_server.wire import Connect

# First retry after 100 ms, then doubling up to 5 s (Pulsar's client starts at 100 ms too).
RECONNECT_INITIAL_S = 0.1
RECONNECT_MAX_S = 5.0


@dataclass
class _Slot:
    conn: PulsarConnection | None = None
    opening: asyncio.Task[PulsarConnection] | None = None
    backoff: Backoff = field(default_factory=lambda: Backoff(RECONNECT_INITIAL_S, RECONNECT_MAX_S))
    not_before: float = 0.0  # loop time before which no new attempt starts
    last_error: ClientError | None = None


class ConnectionPool:
    """``await pool.get(url)`` returns a handshaken connection to ``url``, opening one if needed."""

    def __init__(self, connect: Connect, *, ssl_context: ssl.SSLContext | None = None,
                 timeout_s: float = 10.0, keepalive_s: float | None = 30.0,
                 auth_data_source: Callable[[], bytes] | None = None) -> None:
        self._connect = connect
        # Fresh credentials for every new connection and every refresh challenge (a token file read
        # again: BrokerClientCredentials.auth_data); None: CONNECT's auth_data as given.
        self._auth_data_source = auth_data_source
        self._ssl_context = ssl_context
        self._timeout_s = timeout_s
        self._keepalive_s = keepalive_s
        self._slots: dict[str, _Slot] = {}
        self._closed = False

    async def get(self, url: str) -> PulsarConnection:
        """Raises ConnectionFailed / HandshakeRefused when ``url`` cannot be reached now."""
        if self._closed:
            raise ConnectionFailed(url, "connection pool is closed")
        slot = self._slots.setdefault(url, _Slot())
        if slot.conn is not None and slot.conn.is_usable:
            return slot.conn
        if slot.opening is None:
            slot.opening = asyncio.create_task(self._open(url, slot), name=f"connect {url}")
        return await asyncio.shield(slot.opening)

    async def _open(self, url: str, slot: _Slot) -> PulsarConnection:
        loop = asyncio.get_running_loop()
        try:
            wait = slot.not_before - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            connect = self._connect
            if self._auth_data_source is not None:
                try:
                    connect = replace(connect, auth_data=self._auth_data_source())
                except Exception as exc:  # noqa: BLE001 - e.g. an unreadable token file: retried like a failed connect
                    raise ConnectionFailed(url, f"cannot read the credentials: {exc}") from None
            conn = await open_connection(url, connect, ssl_context=self._ssl_context,
                                         timeout_s=self._timeout_s, keepalive_s=self._keepalive_s)
            conn.auth_data_source = self._auth_data_source
        except ClientError as exc:
            slot.last_error = exc
            slot.not_before = loop.time() + slot.backoff.next_delay()
            raise
        finally:
            slot.opening = None
        slot.backoff.reset()
        slot.last_error = None
        if slot.conn is not None:
            slot.conn.close()
        slot.conn = conn
        return conn

    def healthy(self, url: str) -> bool | None:
        """True if the last attempt on ``url`` succeeded and the connection is up, False if it failed,
        None if never tried."""
        slot = self._slots.get(url)
        if slot is None:
            return None
        return slot.conn is not None and slot.conn.is_usable

    async def close(self) -> None:
        self._closed = True
        slots, self._slots = self._slots, {}
        for slot in slots.values():
            if slot.opening is not None:
                slot.opening.cancel()
            if slot.conn is not None:
                slot.conn.close()
