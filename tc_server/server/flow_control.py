"""Flow control of one client connection: the reasons it is not being read right now.

Reading stops when the first reason appears and resumes when the last one is gone, so independent
causes never undo each other (a write buffer that drains must not resume a connection that is over its
request budget). The connection names the reasons (docs/architecture.md §8):

- ``write-buffer``: the client does not read its answers (the transport's ``pause_writing``);
- ``in-flight``: the connection holds its share of ``--max-requests-in-flight``;
- ``server-busy``: the server as a whole is at ``--max-requests-in-flight``;
- ``relay-setup``, ``relay-write-buffer``: a connection carried to a broker is not connected yet, or the
  broker does not read what the client sends.

A stopping server's drain drops ``in-flight`` and ``server-busy``: it reads on and refuses what arrives.

No asyncio here beyond the transport's own ``pause_reading`` / ``resume_reading``, as in uvicorn's
``flow_control.py``.
"""

from __future__ import annotations

import asyncio


class ReadFlowControl:
    __slots__ = ("_reasons", "_transport")

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._reasons: set[str] = set()

    def attach(self, transport: asyncio.Transport) -> None:
        """The transport to pause and resume (known from ``connection_made`` on)."""
        self._transport = transport

    @property
    def paused(self) -> bool:
        return bool(self._reasons)

    def paused_for(self, reason: str) -> bool:
        return reason in self._reasons

    def pause(self, reason: str) -> None:
        """Stop reading for ``reason`` (the socket stops at the first reason)."""
        if not self._reasons and self._open():
            assert self._transport is not None
            self._transport.pause_reading()
        self._reasons.add(reason)

    def resume(self, reason: str) -> bool:
        """Drop ``reason``; True when that was the last one and reading resumed, so the caller goes on
        with what was already received."""
        if reason not in self._reasons:
            return False
        self._reasons.discard(reason)
        if self._reasons or not self._open():
            return False
        assert self._transport is not None
        self._transport.resume_reading()
        return True

    def _open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()
