"""A small HTTP/1.1 server for the admin port: enough for probes, Prometheus and pulsar-admin.

Deliberately minimal (one request per connection, no chunking): its clients are kubelet probes,
Prometheus and operators, never the hot path, and it keeps the service free of a web framework.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import structlog

log = structlog.get_logger("tc_server.admin")

MAX_REQUEST_HEAD = 16 * 1024
READ_TIMEOUT_S = 10.0


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: bytes


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, doc: object) -> Response:
        return cls(status, json.dumps(doc, indent=None, separators=(",", ":")).encode())


Handler = Callable[[Request], Awaitable[Response]]
REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           409: "Conflict", 413: "Payload Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


class HttpServer:
    def __init__(self, handler: Handler, host: str, port: int) -> None:
        self._handler = handler
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port, reuse_address=True)
        log.info("admin listening", address=f"{self._host}:{self.port}")

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(self._read(reader), READ_TIMEOUT_S)
            response = Response.json(400, {"reason": "malformed HTTP request"}) if request is None else None
            if request is not None:
                try:
                    response = await self._handler(request)
                except Exception as exc:  # noqa: BLE001 - one bad request must not kill the admin port
                    log.exception("admin handler failed", path=request.path)
                    response = Response.json(500, {"reason": f"internal error: {type(exc).__name__}"})
            assert response is not None
            head = [f"HTTP/1.1 {response.status} {REASONS.get(response.status, 'Status')}",
                    f"Content-Type: {response.content_type}", f"Content-Length: {len(response.body)}",
                    "Connection: close"]
            head += [f"{k}: {v}" for k, v in response.headers.items()]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + response.body)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> Request | None:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > MAX_REQUEST_HEAD:
            return None
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return None
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or 0) if headers.get("content-length", "0").isdigit() else -1
        if length < 0 or length > 1024 * 1024:
            return None
        body = await reader.readexactly(length) if length else b""
        url = urlsplit(parts[1])
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        return Request(parts[0].upper(), url.path, query, body)
