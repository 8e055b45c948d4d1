"""The admin port on aiohttp: HTTP/1.1 parsing, keep-alive and limits are the library's; what is ours
is who may call what (docs/security.md):

- ``/healthz`` and ``/readyz`` are always open (kubelet probes carry no credentials);
- ``/metrics`` is open unless ``--authenticate-metrics-endpoint``, then any authenticated role;
- everything else (``/admin/v3/transactions/...``) needs a superuser role, as ``pulsar-admin
  transactions`` does against a broker: no or bad credentials → 401, another role → 403. A proxy role
  (``--proxy-roles``) acts for the client it names in ``X-Original-Principal`` (as a Pulsar proxy forwards
  HTTP): none named → 401; both must be superusers, else 403.

With authentication off everything is open, as on a broker without authentication. Credentials are
an ``Authorization: Bearer <token>`` header or, over HTTPS, a client certificate (the ``tls`` method).
Errors are JSON ``{"reason": …}`` as Pulsar's admin API answers them.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Protocol, cast

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from tc_server.admin.routes import json_response
from tc_server.auth.api import AuthenticationFailed
from tc_server.auth.certificates import ServerTlsContext
from tc_server.auth.service import AuthenticationService
from tc_server.auth.tls_accept import TlsServer
from tc_server.logs import LogLimiter
from tc_server.server.address_budget import AddressBudget
from tc_server.server.sockets import bound_socket
from tc_server.store.api import StoreError

log = structlog.get_logger("tc_server.admin")

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
METRICS_PATH = "/metrics"
# No endpoint takes a body; this bounds what a client can make us buffer.
MAX_BODY_BYTES = 64 * 1024
# Request line and each header (aiohttp's defaults, named here): a longer one is answered 400.
MAX_LINE_BYTES = 8190
MAX_HEADERS = 64
# Idle keep-alive connections are closed after this.
KEEPALIVE_TIMEOUT_S = 75.0
# Connections open on the admin port at once, in all and from one address: past them a new one is closed
# at once. The port is open without credentials (probes, often scrapes, reachable cluster-wide), and
# aiohttp keeps a connection that sent half a request line for KEEPALIVE_TIMEOUT_S: without a bound a few
# hundred idle sockets used up the process's descriptors, the Pulsar port's and the store's with them.
# Kept inside app.RESERVED_DESCRIPTORS. One address's share is a fraction, so that one client cannot
# take the probes' and scrapers' places.
MAX_CONNECTIONS = 128
MAX_CONNECTIONS_PER_ADDRESS = 32
# A connection whose client has read none of its answers for this long is closed (one that reads, however
# slowly, is given another interval). aiohttp's keep-alive timeout closes idle connections only, and one that
# pipelined 20,000 requests and read nothing kept its slot (and ~4 MB of socket buffers) for good, waiting to
# write: a few addresses took every slot, the probes' too (a review).
WRITE_STALL_S = 30.0
# How long a stop waits for admin requests still open (aiohttp's default: 60 s). Every endpoint answers
# within the request timeout or far sooner; a client that sends its headers and never the body it
# announced must not hold up the stop of the whole process.
SHUTDOWN_TIMEOUT_S = 1.0
# The paths of a Pulsar client's HTTP lookups (a service URL of http:// or https://: partitioned metadata,
# topic lookups, namespaces' topics, schemas). tc-server answers lookups on its Pulsar protocol port only, so
# such a client fails with a bare "Not Found"; the 404 says what to give it instead, for whoever reads it.
HTTP_LOOKUP_PREFIXES = ("/lookup/", "/admin/v2/")
HTTP_LOOKUP_HINT = ("tc-server answers lookups on its Pulsar protocol port only: give clients its pulsar:// "
                    "(or pulsar+ssl://) URL as their service URL, not this HTTP address")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _MalformedRequestLog(logging.Filter):
    """aiohttp answers a malformed request (a ``Content-Length: ²``, a bad request line) with 400 and logs
    it with a traceback at error level; a client can send those at will (issue 15). Such a record
    becomes one warning line without the traceback, once per interval; every other record passes."""

    def __init__(self) -> None:
        super().__init__()
        self._limiter = LogLimiter()

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        if (left_out := self._limiter.allow("malformed HTTP request")) is not None:
            # What was wrong, without what aiohttp quotes after it: the offending header line, which may
            # be an Authorization header with a whole token (a stray CR after it, from a token file with
            # CRLF line ends); no part of a credential is ever logged.
            reason = str(error.message).split(":", 1)[0].split("\n", 1)[0][:120]
            log.warning("malformed HTTP request answered 400", error=type(error).__name__, reason=reason,
                        left_out_since_last_line=left_out)
        return False


_aiohttp_log = logging.getLogger("tc_server.admin.aiohttp")
_aiohttp_log.addFilter(_MalformedRequestLog())


class Routes(Protocol):
    """What an admin port serves: AdminRoutes in an instance, the supervisor's probes with --workers."""

    def add_to(self, app: web.Application) -> None: ...

    def stopping(self) -> None:
        """The process has begun its stop (AdminServer.stopping): readiness says so from now on."""


class _ConnectionBudget(AddressBudget):
    """The admin port's connections open now, in all and by address (MAX_CONNECTIONS...), each refusal logged
    once per interval."""

    def __init__(self) -> None:
        super().__init__(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_ADDRESS, self.refused)
        self._limiter = LogLimiter()

    def closing_unread(self, address: str) -> None:
        """Log a connection closed for reading none of its answers for WRITE_STALL_S (once per interval)."""
        if (left_out := self._limiter.allow("admin connection unread")) is not None:
            log.warning("admin connection closed: its answers unread", unread_for_s=WRITE_STALL_S, address=address,
                        left_out_since_last_line=left_out)

    def refused(self, address: str, bound: str = "connections open") -> None:
        """Log a connection closed at once for a bound (once per interval): the connections open, or the TLS
        handshakes under way."""
        if (left_out := self._limiter.allow("admin connection refused")) is not None:
            log.warning("admin connection refused", bound=bound, address=address, open=self.count,
                        from_address=self.by_address.get(address, 0), max_connections=self.total,
                        max_connections_per_address=self.per_address, left_out_since_last_line=left_out)


class _Budgeted(asyncio.Protocol):
    """aiohttp's connection handler behind the budget: a connection over it is closed before the handler
    sees it. A wrapper (the handler's class has __slots__), passing on the protocol calls asyncio makes."""

    def __init__(self, handler: asyncio.Protocol, budget: _ConnectionBudget) -> None:
        self._handler = handler
        self._budget = budget
        self._address: str | None = None  # set once admitted
        self._transport: asyncio.Transport | None = None
        self._stall: asyncio.TimerHandle | None = None  # while writing is paused (WRITE_STALL_S)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else ""
        if not self._budget.admit(address):
            cast(asyncio.Transport, transport).abort()
            return
        self._address = address
        self._transport = cast(asyncio.Transport, transport)
        self._handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received()

    def pause_writing(self) -> None:
        if self._stall is None:
            self._stall = asyncio.get_running_loop().call_later(WRITE_STALL_S, self._stalled, self._unsent())
        self._handler.pause_writing()

    def _unsent(self) -> int:
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    def resume_writing(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        self._handler.resume_writing()

    def _stalled(self, unsent: int) -> None:
        if (now := self._unsent()) < unsent:  # read slowly, but read: another interval
            self._stall = asyncio.get_running_loop().call_later(WRITE_STALL_S, self._stalled, now)
            return
        self._stall = None
        self._budget.closing_unread(self._address or "")
        if self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._address is None:
            return  # refused: the handler never saw it
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        self._budget.release(self._address)
        self._handler.connection_lost(exc)


class _BudgetedSite(web.TCPSite):
    """aiohttp's TCP site, its connections going through the budget (its start, with the factory wrapped)."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, *, ssl_context: ssl.SSLContext | None,
                 budget: _ConnectionBudget) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context, reuse_address=True)
        self._budget = budget

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        budget = self._budget
        loop = asyncio.get_running_loop()
        assert self._host is not None
        sock = bound_socket(self._host, self._port)
        if self._ssl_context is None:
            self._server = await loop.create_server(lambda: _Budgeted(server(), budget), sock=sock,
                                                    backlog=self._backlog)
            return
        # The budget counts a connection once its TLS handshake is done: the handshakes under way have one
        # of their own, the same size (tls_accept.py).
        handshakes = AddressBudget(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_ADDRESS,
                                     refused=lambda address: budget.refused(address, "TLS handshakes under way"))
        self._server = TlsServer([sock], lambda: _Budgeted(server(), budget), self._ssl_context, handshakes,
                                 backlog=self._backlog)


class AdminServer:
    def __init__(self, routes: Routes, host: str, port: int, *,
                 authentication: AuthenticationService | None = None,
                 authenticate_metrics: bool = False,
                 tls: ServerTlsContext | None = None) -> None:
        self._host = host
        self._port = port
        self._tls = tls  # HTTPS with its reloading context; None: HTTP
        self._ssl = tls.context if tls is not None else None
        self._auth = authentication or AuthenticationService()
        self._authenticate_metrics = authenticate_metrics
        self.app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_json_errors, self._authorize])
        self._routes = routes
        routes.add_to(self.app)
        self._runner: web.AppRunner | None = None
        self.budget = _ConnectionBudget()
        self._refusals_log = LogLimiter()

    async def start(self) -> None:
        # access_log=None: no per-request lines (probes and scrapes would flood the log).
        self._runner = web.AppRunner(self.app, access_log=None, keepalive_timeout=KEEPALIVE_TIMEOUT_S,
                                     shutdown_timeout=SHUTDOWN_TIMEOUT_S,
                                     max_line_size=MAX_LINE_BYTES, max_field_size=MAX_LINE_BYTES,
                                     max_headers=MAX_HEADERS, logger=_aiohttp_log)
        await self._runner.setup()
        site = _BudgetedSite(self._runner, self._host, self._port, ssl_context=self._ssl, budget=self.budget)
        try:
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            raise
        log.info("admin listening", address=f"{self._host}:{self.port}", tls=self._ssl is not None)

    @property
    def port(self) -> int:
        assert self._runner is not None and self._runner.addresses
        return int(self._runner.addresses[0][1])

    def stopping(self) -> None:
        """The process has begun its stop: the routes' readiness says so from now on (/readyz 503, and
        tc_server_ready 0), and every path (/healthz and /metrics too) is served until :meth:`stop`, after the
        drain. Closed at the stop's start, the port refused a liveness probe for the whole drain (up to
        DRAIN_MAX_S and the step-down) and the drain's own metrics were never scraped."""
        self._routes.stopping()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self._auth.enabled or request.path in OPEN_PATHS:
            return await handler(request)
        if request.path == METRICS_PATH and not self._authenticate_metrics:
            return await handler(request)
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport is not None else None
        peer_certificate = self._tls.verified_peer_certificate(ssl_object) if self._tls is not None else None
        try:
            identity = self._auth.authenticate_http(request.headers.get("Authorization"), peer_certificate)
        except AuthenticationFailed as exc:
            # Anyone may send these, as fast as they like: one line per interval, the path cut short.
            if (left_out := self._refusals_log.allow("not authenticated")) is not None:
                log.info("admin request refused: not authenticated", path=request.path[:200], reason=str(exc),
                         left_out_since_last_line=left_out)
            refused = _unauthorized(str(exc))
            if ssl_object is not None and self._tls is not None and self._tls.stale(ssl_object):
                # Its handshake trusted an earlier trust file: closed after the answer, so that the client's next
                # request comes with a new handshake (kept alive, a scraper's every request was refused for good).
                refused.force_close()
            return refused
        if request.path == METRICS_PATH:
            return await handler(request)
        if self._auth.is_proxy_role(identity.role):
            # A Pulsar proxy forwarding its clients' admin calls acts for the client it names, as on the Pulsar
            # port: both must be superusers (Pulsar's validateSuperUserAccess). A proxy role that is a
            # superuser itself let any client of that proxy list and abort every txn (a review's).
            original = request.headers.get(ORIGINAL_PRINCIPAL_HEADER, "").strip()
            if not original or self._auth.is_proxy_role(original):
                return self._refused(request, "proxy names no client", 401, identity.role,
                                     f"role {identity.role!r} is a proxy role (--proxy-roles): it must name the "
                                     f"client it acts for, not a proxy role, in {ORIGINAL_PRINCIPAL_HEADER}")
            if not (self._auth.is_superuser(identity.role) and self._auth.is_superuser(original)):
                return self._refused(request, "not a superuser", 403, identity.role,
                                     f"proxy role {identity.role!r} acting for {original[:64]!r}: both must be "
                                     "superusers")
        elif not self._auth.is_superuser(identity.role):
            return self._refused(request, "not a superuser", 403, identity.role,
                                 f"role {identity.role!r} is not a superuser")
        return await handler(request)

    def _refused(self, request: web.Request, why: str, status: int, role: str, reason: str) -> web.Response:
        if (left_out := self._refusals_log.allow(why)) is not None:
            log.info(f"admin request refused: {why}", path=request.path[:200], role=role, reason=reason,
                     left_out_since_last_line=left_out)
        return _unauthorized(reason) if status == 401 else json_response(status, {"reason": reason})


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Router errors (404, 405) and failures as Pulsar's JSON ``{"reason": …}``; one bad request
    never stops the port."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 405:
            allowed = exc.headers.get("Allow", "")
            reason = f"{request.method} is not allowed on {request.path[:200]}; use {allowed or 'another method'}"
        elif exc.status == 404:
            reason = f"no such endpoint: {request.method} {request.path[:200]}"
            if request.path.startswith(HTTP_LOOKUP_PREFIXES):
                reason = f"{reason}; {HTTP_LOOKUP_HINT}"
        else:
            reason = exc.reason
        response = json_response(exc.status, {"reason": reason})
        if exc.status == 405 and "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except (StoreError, TimeoutError) as exc:
        # The store is down or slow (every handler that reads or writes it): not our bug, so no 500 and no
        # traceback. One line a second at most: probes and dashboards poll these pages.
        if (left_out := _STORE_ERRORS.allow(request.path.rsplit("/", 1)[0])) is not None:
            log.warning("admin request failed: metadata store", path=request.path, error=repr(exc),
                        left_out_since_last_line=left_out)
        return json_response(503, {"reason": f"metadata store error: {exc!r}"})
    except Exception as exc:  # noqa: BLE001 - one bad request must not kill the admin port
        log.exception("admin handler failed", path=request.path)
        return json_response(500, {"reason": f"internal error: {type(exc).__name__}"})


_STORE_ERRORS = LogLimiter(interval_s=1.0)
# The header a Pulsar proxy names its client in when it forwards an HTTP call (Pulsar's AuthenticationFilter).
ORIGINAL_PRINCIPAL_HEADER = "X-Original-Principal"


def _unauthorized(reason: str) -> web.Response:
    response = json_response(401, {"reason": reason})
    response.headers["WWW-Authenticate"] = 'Bearer realm="tc-server"'
    return response
