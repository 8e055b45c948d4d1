"""The front door: what tc-server hands to the upstream broker (docs/client-behaviour.md, "One service URL").

A Pulsar client has one service URL and finds its coordinators through it, so tc-server answers the
coordinator assign topic itself and forwards every other request of the service-URL connection
(PARTITIONED_METADATA, LOOKUP, GET_TOPICS_OF_NAMESPACE, GET_SCHEMA, …) to a broker, relaying the broker's
answer under the client's request id.

Decision (docs/client-behaviour.md, "Authorization of forwarded requests"): each client connection that
forwards anything gets upstream connections of its own, opened with the client's own CONNECT credentials.
The broker then authenticates and authorizes the client itself, exactly as if it had connected directly;
tc-server never lends its own (superuser) role to a client's lookup, and brokers need no proxy-role setup.

The exception is a client that authenticated with a TLS certificate: its private key stays with the client, so
no connection of tc-server's can authenticate as it. With --upstream-proxy-auth-plugin set, tc-server connects
for such a client as a Pulsar proxy does: with the proxy credentials (a role the brokers list in proxyRoles)
and the client's role in ``original_principal``, which the brokers then authorize, the proxy role too.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import structlog

from tc_server.auth.broker_client import BrokerClientCredentials
from tc_server.client import (
    ClientError,
    ConnectionClosed,
    ConnectionFailed,
    Endpoint,
    HandshakeRefused,
    PulsarConnection,
    RequestTimedOut,
    open_connection,
)
from tc_server.config import ConfigError
from tc_server.logs import LogLimiter
from tc_server.metrics import Metrics
from tc_server.wire import (
    DEFAULT_MAX_FRAME_SIZE,
    MESSAGE_SIZE_FRAME_PADDING,
    Command,
    Connect,
    Error,
    Lookup,
    LookupResponse,
    LookupType,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    ServerError,
    command_name,
    encode_command,
)

log = structlog.get_logger("tc_server.upstream")

# ForwardingSession's key for its connection to the upstream (whichever of its URLs answered); the
# brokers that redirects name are keyed by URL.
PRIMARY = "upstream"

# An upstream connection holding more than this that its broker has not read is given up (the broker is
# not reading; its forwards fail with a typed answer). Three of the largest frames a broker takes
# (5 MiB + 10 KiB): a broker that reads at all keeps well below it.
MAX_UNSENT_BYTES = 16 * 1024 * 1024

# The commands of a client's service-URL connection that go to the upstream broker: request and answer,
# each under the client's request id (docs/client-behaviour.md, "One service URL"). Any other command
# not the coordinator's is refused (ClientConnection._forward_or_refuse).
FORWARDED_COMMANDS = frozenset({"PARTITIONED_METADATA", "LOOKUP", "GET_TOPICS_OF_NAMESPACE", "GET_SCHEMA",
                                "GET_OR_CREATE_SCHEMA"})

# A client follows at most this many LOOKUP redirects (ClientConfigurationData.maxLookupRedirects).
MAX_LOOKUP_REDIRECTS = 20
# A broker a lookup named is carried to for this long after the last lookup that named it (Upstream).
LEARNED_BROKER_TTL_S = 3600.0
# Past this many learned brokers, the expired ones are dropped before another is learned.
MAX_LEARNED_BROKERS = 1024

# How producer/consumer connections reach the broker a LOOKUP names (config.LOOKUP_CONNECTION_MODES;
# README, "One service URL"):
#   upstream: as the broker answered (`proxy_through_service_url`): through tc-server when it says so
#   direct:   clients connect to the broker themselves (they can reach it)
#   proxy:    every producer/consumer connection goes through tc-server (clients cannot reach brokers)


async def follow_lookup(
    conn: PulsarConnection,
    cmd: Lookup,
    connection_to: Callable[[str], Awaitable[PulsarConnection]],
    *,
    use_tls: bool,
    request_id_for: Callable[[PulsarConnection], int] | None = None,
) -> tuple[Command, bytes]:
    """Send LOOKUP on ``conn`` and follow REDIRECT answers to the brokers they name (at most
    MAX_LOOKUP_REDIRECTS, as a client does). Returns the last answer and its frame: CONNECT, FAILED,
    an ERROR, a REDIRECT without a URL to follow, or a FAILED of our own past the limit or for an answer
    naming a broker URL that does not parse.

    The one implementation of following lookups: client lookups forwarded by :class:`ForwardingSession`
    (the client's request id on the client's own connections) and tc-server's own lookups for
    delivering decisions (``request_id_for``: a fresh id on each pooled connection).
    Every broker gets ``cmd`` with only ``request_id`` and ``authoritative`` changed: the client's
    advertised_listener_name and properties go to the broker a redirect names as much as to the first
    (without them it answers with the default listener's URL).
    Raises ClientError (ConnectionFailed, ConnectionClosed, HandshakeRefused)."""
    request = cmd
    for _ in range(MAX_LOOKUP_REDIRECTS + 1):
        if request_id_for is not None:
            request = replace(request, request_id=request_id_for(conn))
        answer, frame = await conn.request_frame(encode_command(request), request.request_id)
        if not isinstance(answer, LookupResponse) or answer.response is LookupType.FAILED:
            return answer, frame
        # Neither tc-server nor the client could connect to a URL that does not parse: the lookup has
        # failed, and the client is told why rather than left without an answer.
        for url in (answer.broker_service_url, answer.broker_service_url_tls):
            try:
                if url:
                    Endpoint.parse(url)
            except ValueError as exc:
                return _failed_lookup(cmd, ServerError.MetadataError,
                                      f"{cmd.topic}: the broker's lookup answer names a broker URL that does "
                                      f"not parse: {exc}")
        if answer.response is not LookupType.REDIRECT:
            return answer, frame
        target = answer.broker_service_url_tls if use_tls else answer.broker_service_url
        if not target:
            return answer, frame
        if use_tls and not target.startswith("pulsar+ssl://"):
            # Its TLS URL field naming a plain URL: the client's credentials would cross it in the clear.
            return _failed_lookup(cmd, ServerError.MetadataError,
                                  f"{cmd.topic}: the broker's lookup answer redirects to {target}, which is not a "
                                  "pulsar+ssl:// URL, while the upstream speaks TLS")
        conn = await connection_to(target)
        request = replace(request, authoritative=answer.authoritative)
    return _failed_lookup(cmd, ServerError.MetadataError, f"{cmd.topic}: more than {MAX_LOOKUP_REDIRECTS} "
                                                          "lookup redirects")


def _failed_lookup(cmd: Lookup, error: ServerError, message: str) -> tuple[Command, bytes]:
    failed = LookupResponse(cmd.request_id, LookupType.FAILED, error=error, message=message)
    return failed, encode_command(failed)


class Upstream:
    """What every connection shares: the upstream URLs (the first that answers is used, the next one on
    failure), the brokers that LOOKUP answers named (the only ones tc-server carries connections to),
    and the metrics."""

    def __init__(self, urls: list[str], *, request_timeout_s: float, connection_mode: str,
                 metrics: Metrics, keepalive_s: float, ssl_context: ssl.SSLContext | None = None,
                 proxy_credentials: BrokerClientCredentials | None = None) -> None:
        if not urls:
            raise ValueError("an upstream needs at least one URL")
        self.urls = list(urls)
        self.request_timeout_s = request_timeout_s
        self.keepalive_s = keepalive_s
        self.connection_mode = connection_mode
        self.ssl_context = ssl_context
        # --upstream-proxy-auth-*: what tc-server presents as a Pulsar proxy for a TLS-certificate client.
        self.proxy_credentials = proxy_credentials
        self.metrics = metrics
        # Failed forwards and given-up connections are logged at most once per kind and second: every
        # client's requests fail together when a broker is down (tc_server_forwarded_requests_total counts each).
        self.log_limiter = LogLimiter(interval_s=1.0)
        self._preferred = 0
        # HOST:PORT -> the URL to carry a client's connection to, for every broker a LOOKUP answer named
        # (and the upstream itself, as configured): clients name the broker in CONNECT's
        # proxy_to_broker_url as HOST:PORT, without a scheme.
        self._brokers: dict[str, str] = {host_port(url): url for url in self.urls}
        self._configured = frozenset(self._brokers)
        # When a lookup last named each learned broker (time.monotonic()); the upstream URLs never expire.
        # A broker not named for LEARNED_BROKER_TTL_S is forgotten: brokers' addresses (pod IPs) change
        # with restarts and are given to other pods, to which clients' credentials must not be carried.
        self._named_at: dict[str, float] = {}
        # HOST:PORT of brokers a lookup named without a TLS URL while the upstream is TLS: never carried to.
        self._without_tls: set[str] = set()
        for url in self.urls:
            metrics.upstream_up.labels(url).set(0)

    def note_broker(self, url: str | None, url_tls: str | None) -> None:
        """Remember a broker a LOOKUP answer named by its plain and TLS URLs: clients may then ask us to
        carry connections there, naming either HOST:PORT. With a TLS upstream both lead to the TLS URL
        (a client that speaks plain TCP to tc-server names the plain one), and a broker without one is
        not remembered: its connections would carry the client's credentials in the clear."""
        now = time.monotonic()
        if self.ssl_context is not None:
            if url_tls and not url_tls.startswith("pulsar+ssl://"):
                url_tls = None  # a plain URL in the TLS field: as good as none (the credentials would be in clear)
            if url_tls:
                for named in (url, url_tls):
                    if named:
                        self._learn(host_port(named), url_tls, now)
            elif url:
                self._make_room(host_port(url), now)
                self._without_tls.add(host_port(url))
                self._named_at[host_port(url)] = now
            return
        for named in (url, url_tls):
            if named:
                self._learn(host_port(named), named, now)

    def _learn(self, address: str, url: str, now: float) -> None:
        self._make_room(address, now)
        self._brokers[address] = url
        self._named_at[address] = now

    def _make_room(self, address: str, now: float) -> None:
        """Keep at most MAX_LEARNED_BROKERS: the expired go first, then the longest unnamed (brokers'
        answers name the addresses, and they are not to grow this without bound)."""
        if address in self._named_at or len(self._named_at) < MAX_LEARNED_BROKERS:
            return
        self._forget_expired(now)
        if len(self._named_at) >= MAX_LEARNED_BROKERS:
            self._forget(min(self._named_at, key=self._named_at.__getitem__))

    def _forget_expired(self, now: float) -> None:
        for address, named_at in list(self._named_at.items()):
            if now - named_at >= LEARNED_BROKER_TTL_S:
                self._forget(address)

    def _forget(self, address: str) -> None:
        del self._named_at[address]
        self._without_tls.discard(address)
        if address not in self._configured:
            self._brokers.pop(address, None)

    def proxy_target(self, proxy_to_broker_url: str) -> str | None:
        """The URL to carry a client's connection to, or None when no lookup answer named that broker
        within LEARNED_BROKER_TTL_S (the upstream URLs themselves always)."""
        address = host_port(proxy_to_broker_url)
        named_at = self._named_at.get(address)
        if named_at is not None and time.monotonic() - named_at >= LEARNED_BROKER_TTL_S:
            self._forget_expired(time.monotonic())
        return self._brokers.get(address)

    def named_without_tls(self, proxy_to_broker_url: str) -> bool:
        """Whether a lookup named that broker without a TLS URL while the upstream speaks TLS."""
        return host_port(proxy_to_broker_url) in self._without_tls

    async def open(self, connect: Connect, as_proxy: bool = False) -> PulsarConnection:
        """A connection to the first upstream URL that answers, with the client's credentials.

        Raises the last ConnectionFailed when none takes a connection, HandshakeRefused
        when one refuses the client's credentials (another URL of the same cluster would refuse them too)."""
        last: ClientError | None = None
        for attempt in range(len(self.urls)):
            index = (self._preferred + attempt) % len(self.urls)
            url = self.urls[index]
            try:
                conn = await self.connect_to(url, connect, as_proxy)
            except ConnectionFailed as exc:
                last = exc
                self.metrics.upstream_up.labels(url).set(0)
                continue
            except HandshakeRefused as exc:
                if not exc.of_credentials:
                    # This broker refuses connections (its connection limit, which all clients' upstream
                    # connections, coming from this one address, reach sooner): a failed connection, as a
                    # client connected to it would see (retried; counted as unreachable). The next URL.
                    last = ConnectionFailed(url, f"CONNECT refused: {exc.error.name}: {exc.server_message}")
                    self.metrics.upstream_up.labels(url).set(0)
                    continue
                # The broker answered: it is up, and refused this client's credentials (the alert rules
                # read the gauge as the broker's reachability).
                self.metrics.upstream_up.labels(url).set(1)
                raise
            self._preferred = index
            self.metrics.upstream_up.labels(url).set(1)
            return conn
        assert last is not None
        raise last

    def given_up(self, url: str) -> None:
        """A connection to upstream ``url`` was given up (its broker stopped answering or reading): the
        next :meth:`open` tries the other URLs first. A hung broker may still accept connections and
        answer CONNECT, so "the first that answers" would pick it again."""
        self.metrics.upstream_up.labels(url).set(0)
        if self.urls[self._preferred] == url:
            self._preferred = (self._preferred + 1) % len(self.urls)

    async def connect_to(self, url: str, connect: Connect, as_proxy: bool = False) -> PulsarConnection:
        """``as_proxy``: ``connect`` is proxy_connect's (the TLS context presents the proxy's certificate)."""
        # Keep-alive as a client's own connection has it: an idle connection to a broker that stopped
        # answering is closed by the second tick, not kept for the next request to time out on.
        return await open_connection(url, connect, ssl_context=self.ssl_context_for(as_proxy),
                                     timeout_s=self.request_timeout_s, keepalive_s=self.keepalive_s)

    def proxies_for(self, method: str | None) -> bool:
        """Whether a client that authenticated to tc-server with ``method`` (None: authentication is off) has
        its requests forwarded as a Pulsar proxy's (proxy_connect): a TLS certificate, with proxy credentials set."""
        return method == "tls" and self.proxy_credentials is not None

    def proxy_connect(self, client_connect: Connect, role: str) -> Connect:
        """The CONNECT a Pulsar proxy sends for a client of ``role`` (brokers, with authenticateOriginalAuthData
        off as by default, take original_principal from a proxy role): the proxy credentials, read now, and
        the client's role and method; no original_auth_data (a certificate travels in no field)."""
        credentials = self.proxy_credentials
        assert credentials is not None, "proxies_for said no"
        try:
            auth_data = credentials.auth_data()  # a file: token, read again (rotated)
        except ConfigError as exc:
            raise ConnectionFailed("--upstream-proxy-auth-params", str(exc)) from None
        return replace(client_connect, auth_method_name=credentials.method, auth_data=auth_data,
                       proxy_to_broker_url=None, original_principal=role, original_auth_method="tls",
                       original_auth_data=None)

    def ssl_context_for(self, as_proxy: bool, url: str | None = None,
                        plain_upstream_context: ssl.SSLContext | None = None) -> ssl.SSLContext | None:
        """The TLS context of a connection to a broker on a client's behalf: the upstream's, which presents no
        certificate, or as a proxy (``as_proxy``) the proxy credentials' when their plugin is TLS. ``url`` and
        ``plain_upstream_context``: a relay to a ``pulsar+ssl://`` broker URL behind a plain upstream, which
        takes that context (None: no TLS)."""
        context = self.ssl_context
        if context is None and url is not None and url.startswith("pulsar+ssl://"):
            context = plain_upstream_context
        if context is None:
            return None
        credentials = self.proxy_credentials
        if as_proxy and credentials is not None and credentials.ssl_context is not None:
            return credentials.ssl_context
        return context


class ForwardingSession:
    """The upstream side of one client connection: its connections to brokers (opened lazily with the
    client's credentials) and the requests it forwarded that have not been answered yet."""

    def __init__(self, upstream: Upstream, client_connect: Connect, reply: Callable[[bytes], None],
                 credentials_expired: Callable[[], None] | None = None, proxied: bool = False,
                 proxy_for: str | None = None, client_tls: bool = False,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._upstream = upstream
        # The largest frame the client takes: the max_message_size tc-server's CONNECTED announced, plus the
        # padding (the Java client's decoder closes its whole connection on a longer one).
        self._max_frame_size = max_frame_size
        self._client_tls = client_tls  # the client speaks TLS to tc-server: it reads lookup answers' TLS URLs
        # The role of a TLS-certificate client whose requests go as a Pulsar proxy's (Upstream.proxies_for):
        # the proxy credentials are tc-server's, so the client is never asked for fresh ones.
        self._proxy_for = proxy_for
        # Called when a broker refuses the client's credentials after it had taken them (expired): the
        # client connection asks the client for fresh ones (refresh_credentials brings them here).
        self._credentials_expired = credentials_expired if proxy_for is None else None
        self._admitted = False  # a broker took the client's credentials once
        # Asked for fresh credentials before any broker took them (see _failure): once, so that credentials
        # that are simply wrong end in AuthenticationError rather than in a retry without end.
        self._asked_before_admission = False
        flags = client_connect.feature_flags
        self._client_refreshes = bool(flags and flags.supports_auth_refresh)
        self._connect = connect_for_broker(client_connect, proxied)
        self._reply = reply
        # Open connections by broker URL, the primary (to whichever upstream URL answered) under
        # PRIMARY, and the openings under way by the same keys: one at a time per key, however many
        # forwards wait for it.
        self._connections: dict[str, PulsarConnection] = {}
        self._opening: dict[str, asyncio.Task[PulsarConnection]] = {}
        # The client's request ids being forwarded: a broker's answer is matched to its request by id alone.
        self._forwarding: set[int] = set()
        self._closed = False

    async def forward(self, cmd: Command, frame: bytes) -> None:
        """Forward one request and write the answer (or a typed error) back; never raises."""
        name = command_name(cmd)
        request_id = getattr(cmd, "request_id", None)
        assert request_id is not None  # only FORWARDED_COMMANDS with their request id come here (connection.py)
        if request_id in self._forwarding:
            # The answers to two requests of one id cannot be told apart: the first would have waited out
            # the request timeout while the second took its answer. Refused at once, naming the problem.
            self._upstream.metrics.forwarded_total.labels(name, "RequestIdInUse").inc()
            self._reply(encode_command(error_answer(cmd, request_id, ServerError.NotAllowedError,
                                                     f"request id {request_id} is already in use by a request "
                                                     "not answered yet")))
            return
        self._forwarding.add(request_id)
        started = time.perf_counter()
        outcome = "ok"
        try:
            async with asyncio.timeout(self._upstream.request_timeout_s):
                if isinstance(cmd, Lookup):
                    answer = await self._lookup(cmd)
                else:
                    decoded, answer = await (await self._primary_connection()).request_frame(frame, request_id)
                    answer = _keeping_the_connection(decoded, answer)
            if len(answer) > self._max_frame_size:
                # A broker with a larger maxMessageSize (a pattern consumer's topic list, a large schema): relayed,
                # the client's decoder failed its whole connection to tc-server, coordinators' handlers included,
                # on every retry (a review).
                outcome = "AnswerTooLarge"
                message = (f"the broker's answer to {name} is {len(answer)} bytes, more than this connection's "
                           f"frames may be ({self._max_frame_size} bytes: tc-server's --max-message-size plus "
                           f"{MESSAGE_SIZE_FRAME_PADDING}); set tc-server's --max-message-size to the brokers' "
                           "maxMessageSize")
                self._refuse(cmd, request_id, name, ServerError.UnknownError, message)
                return
        except (ClientError, TimeoutError) as exc:
            outcome = type(exc).__name__
            error, message = self._failure(exc)
            self._refuse(cmd, request_id, name, error, message)
            return
        except Exception:  # noqa: BLE001 - a bug here must not leave the client waiting out its timeout
            outcome = "InternalError"
            if (left_out := self._upstream.log_limiter.allow(f"forward {name}:internal")) is not None:
                log.exception("forwarding failed", command=name, request_id=request_id,
                              left_out_since_last_line=left_out)
            self._reply(encode_command(error_answer(cmd, request_id, ServerError.UnknownError,
                                                     f"tc-server could not forward {name} (its log says why)")))
            return
        finally:
            self._forwarding.discard(request_id)
            self._upstream.metrics.forwarded_seconds.labels(name).observe(time.perf_counter() - started)
            self._upstream.metrics.forwarded_total.labels(name, outcome).inc()
        self._reply(answer)

    def _refuse(self, cmd: Command, request_id: int, name: str, error: ServerError, message: str) -> None:
        """Answer the client's forwarded request with ``error``, logged at most once per interval and kind."""
        if (left_out := self._upstream.log_limiter.allow(f"forward {name}:{error.name}")) is not None:
            log.info("forwarded request failed", command=name, request_id=request_id, error=error.name,
                     message=message, left_out_since_last_line=left_out)
        self._reply(encode_command(error_answer(cmd, request_id, error, message)))

    async def _lookup(self, cmd: Lookup) -> bytes:
        """LOOKUP, following redirects here (the client may not reach the broker a redirect names; a
        Pulsar proxy does the same), and answering in the configured connection mode."""
        answer, frame = await follow_lookup(await self._primary_connection(), cmd, self._connection_to,
                                            use_tls=self._upstream.ssl_context is not None)
        if not isinstance(answer, LookupResponse) or answer.response is not LookupType.CONNECT:
            return _keeping_the_connection(answer, frame)
        self._upstream.note_broker(answer.broker_service_url, answer.broker_service_url_tls)
        mode = self._upstream.connection_mode
        proxied = {"direct": False, "proxy": True}.get(mode, answer.proxy_through_service_url)
        if not proxied and self._client_tls and not answer.broker_service_url_tls:
            # --lookup-connections direct sends the client to the broker, over TLS, which this one does not speak:
            # the Java client failed every producer and consumer with a NullPointerException on the missing URL.
            return encode_command(LookupResponse(
                cmd.request_id, LookupType.FAILED, error=ServerError.NotAllowedError,
                message=f"broker {answer.broker_service_url} has no TLS URL, and --lookup-connections direct sends "
                        "this TLS client to it: set --lookup-connections upstream or proxy on tc-server (it then "
                        "carries the client's connection), or give the brokers a TLS port"))
        if proxied and answer.broker_service_url and not answer.broker_service_url_tls:
            # A broker without a TLS port, reached through this service URL: a client that speaks TLS to
            # tc-server reads the TLS URL alone, only to name the broker in proxy_to_broker_url (the Java
            # client failed on the missing one: NullPointerException in every producer and consumer). Its
            # HOST:PORT leads the relay to the broker as the plain URL's does (Upstream.proxy_target); a TLS
            # upstream still refuses it (the credentials would go in the clear: note_broker).
            address = host_port(answer.broker_service_url)
            return encode_command(replace(answer, proxy_through_service_url=True,
                                          broker_service_url_tls=f"pulsar+ssl://{address}"))
        if proxied == answer.proxy_through_service_url:
            return frame
        return encode_command(replace(answer, proxy_through_service_url=proxied))

    async def _primary_connection(self) -> PulsarConnection:
        return await self._connection(PRIMARY, lambda: self._upstream.open(self._broker_connect(),
                                                                           self._proxy_for is not None))

    async def _connection_to(self, url: str) -> PulsarConnection:
        return await self._connection(url, lambda: self._upstream.connect_to(url, self._broker_connect(),
                                                                             self._proxy_for is not None))

    def _broker_connect(self) -> Connect:
        """The CONNECT of a new connection to a broker: the client's, or as its proxy with the proxy
        credentials read again (a token file rotated since is picked up)."""
        if self._proxy_for is None:
            return self._connect
        return self._upstream.proxy_connect(self._connect, self._proxy_for)

    async def _connection(self, key: str, open_: Callable[[], Awaitable[PulsarConnection]]) -> PulsarConnection:
        # A loop: a forward that waited for an opening checks the fresh connection as any other does.
        # Returned unchecked, every waiter wrote to it at once, and a broker that reads nothing was
        # left with all their bytes (up to the whole burst) however low MAX_UNSENT_BYTES is.
        while True:
            conn = self._connections.get(key)
            if conn is not None and conn.is_usable:
                stalled = self._stalled(conn)
                if stalled is None:
                    return conn
                self._give_up(key, conn, stalled)
            if self._closed:
                raise ConnectionClosed(key, "the client's connection is closed")
            opening = self._opening.get(key)
            if opening is None:
                opening = self._opening[key] = asyncio.create_task(self._open(key, open_))
                # Retrieved here: the forwards that waited may all have given up (their deadline passed).
                opening.add_done_callback(lambda task: task.cancelled() or task.exception())
            # Shielded: a forward whose deadline passes stops waiting, but the opening goes on for the
            # others (and is ended by close(): open_connection closes what it half-opened when cancelled).
            opened = await asyncio.shield(opening)
            if not opened.is_usable:
                return opened  # closed as soon as opened: the request fails typed, no second opening

    async def _open(self, key: str, open_: Callable[[], Awaitable[PulsarConnection]]) -> PulsarConnection:
        try:
            conn = await open_()
        finally:
            del self._opening[key]
        self._admitted = True
        conn.set_listener(self._unsolicited)
        conn.auth_data_source = self._client_auth_data
        self._connections[key] = conn
        # Forgotten once closed: a long-lived client connection redirected to many brokers (their pods' IPs
        # change) kept every closed one for its lifetime.
        conn.closed.add_done_callback(lambda _: self._forget(key, conn))
        return conn

    def _forget(self, key: str, conn: PulsarConnection) -> None:
        if self._connections.get(key) is conn:
            del self._connections[key]

    def _stalled(self, conn: PulsarConnection) -> str | None:
        """Why ``conn``'s broker is taken for hung, or None. Timed-out forwards stop waiting but their
        requests stay sent: without this, every later request would time out on the same connection, and
        what a broker does not read would pile up in its write buffer for good."""
        if conn.unsent_bytes > MAX_UNSENT_BYTES:
            return f"the broker is not reading: {conn.unsent_bytes} bytes wait to be sent"
        # Twice the request timeout, not once: a broker may hold one lookup for seconds (a bundle moving
        # between brokers) while the next is on its way; giving up at one timeout failed that next one
        # too, answered in time, and marked the URL down for every client.
        # And only while a request waits, or after two in a row went unanswered: a connection idle since its one
        # unanswered request (an hour later, say) is tried again before its broker is taken for hung.
        silent_s = conn.owed_answer_for()
        if silent_s >= 2 * self._upstream.request_timeout_s and (conn.awaited_requests
                                                                 or conn.unanswered_requests >= 2):
            return f"the broker has owed answers for {silent_s:.1f} s without sending any"
        return None

    def _give_up(self, key: str, conn: PulsarConnection, why: str) -> None:
        # Requests still waiting on it fail now, with a typed answer each (forward's ConnectionClosed).
        del self._connections[key]
        conn.abort(f"given up: {why}")
        if key == PRIMARY:
            self._upstream.given_up(conn.url)
        if (left_out := self._upstream.log_limiter.allow("upstream connection given up")) is not None:
            log.warning("upstream connection given up", url=conn.url, reason=why, left_out_since_last_line=left_out)

    def refresh_credentials(self, auth_data: bytes | None) -> None:
        """The client refreshed its credentials with tc-server: connections opened from now on carry
        them, and the open ones answer their broker's refresh challenge with them, so a broker that
        checks expiry keeps serving the client's forwarded requests (docs/security.md)."""
        self._connect = replace(self._connect, auth_data=auth_data)

    def _client_auth_data(self) -> bytes:
        """What a broker's refresh challenge is answered with: the client's credentials, or the proxy's."""
        if self._proxy_for is not None:
            assert self._upstream.proxy_credentials is not None
            return self._upstream.proxy_credentials.auth_data()
        return self._connect.auth_data or b""

    def _unsolicited(self, cmd: Command, frame: bytes) -> None:
        # Dropped: an answer with a request id nobody waits for is late (the client already got a
        # timeout error), and a lookup connection has nothing a broker would push (those go to producers'
        # and consumers' connections). Passed on, a broker's pushes piled up toward a client that does not
        # read, without bound.
        if (left_out := self._upstream.log_limiter.allow(f"unsolicited {command_name(cmd)}")) is not None:
            log.info("dropping a broker's frame nobody asked for", command=command_name(cmd),
                     request_id=getattr(cmd, "request_id", None), left_out_since_last_line=left_out)

    def _failure(self, exc: BaseException) -> tuple[ServerError, str]:
        where = f"upstream broker {' / '.join(self._upstream.urls)}"
        if isinstance(exc, HandshakeRefused) and not exc.of_credentials:
            # Not the client's fault, and not final: NotAllowedError would fail the client's operation for
            # good, ServiceNotReady make the Java client close its connection to tc-server. A client
            # connected to the broker itself would see a failed connection, and retry.
            return ServerError.MetadataError, (f"{where} refused the connection: {exc.error.name}: "
                                               f"{exc.server_message}; retry")
        if isinstance(exc, HandshakeRefused) and self._proxy_for is not None:
            return exc.error, (f"{where} refused tc-server's proxy credentials (--upstream-proxy-auth-params; its "
                               f"role must be in the brokers' proxyRoles) for client {self._proxy_for[:64]!r}: "
                               f"{exc.server_message}")
        if isinstance(exc, HandshakeRefused):
            if exc.error is ServerError.AuthenticationError and self._admitted:
                # Taken before, refused now: expired (a broker checks expiry, and drops connections
                # whose refresh fails). Not AuthenticationError, which fails the client's operation for
                # good, while the fresh credentials asked for now make the retry work.
                if self._credentials_expired is not None:
                    self._credentials_expired()
                return ServerError.MetadataError, (f"{where} refused the client's credentials, which it had taken "
                                                   f"before ({exc.server_message}); fresh ones were asked of the "
                                                   "client: retry")
            if (exc.error is ServerError.AuthenticationError and not self._admitted and self._client_refreshes
                    and not self._asked_before_admission and self._credentials_expired is not None):
                # Never taken, but maybe expired since the client connected: a client's service-URL connection
                # lives as long as the client, and its first forward (its first producer) may come hours
                # later. The client refreshes only when asked: ask once.
                self._asked_before_admission = True
                self._credentials_expired()
                return ServerError.MetadataError, (f"{where} refused the client's credentials ({exc.server_message});"
                                                   " fresh ones were asked of the client: retry")
            return exc.error, f"{where} refused the client's credentials: {exc.server_message}"
        if isinstance(exc, TimeoutError | RequestTimedOut):
            return ServerError.MetadataError, (
                f"{where} did not answer within {self._upstream.request_timeout_s} s (--request-timeout-s)")
        return ServerError.MetadataError, f"{where} is unavailable: {exc}"

    def close(self) -> None:
        self._closed = True
        for opening in self._opening.values():
            opening.cancel()
        # Aborted, not closed: no answer can reach the client any more, and a broker that stopped
        # reading would keep a closing connection open, with its unsent bytes, for good.
        for conn in self._connections.values():
            conn.abort("the client's connection is closed")


def _keeping_the_connection(answer: Command, frame: bytes) -> bytes:
    """A broker's answer to a forwarded request as the client should get it:
    ServiceNotReady becomes MetadataError (both retried by the clients), because the Java client closes
    the whole connection on the first (ClientCnx.checkServerError), and the connection to tc-server
    carries the client's coordinator handlers (docs/pulsar-protocol.md §1). A broker says it routinely:
    a bundle unloading, a broker starting."""
    if isinstance(answer, LookupResponse | PartitionedMetadataResponse | Error) \
            and answer.error is ServerError.ServiceNotReady:
        # ERROR too: a GET_TOPICS_OF_NAMESPACE or GET_SCHEMA refused so reached the client unchanged.
        message = f"{answer.message or ''} (the broker answered ServiceNotReady)".lstrip()
        return encode_command(replace(answer, error=ServerError.MetadataError, message=message))
    return frame


def error_answer(cmd: Command, request_id: int, error: ServerError, message: str) -> Command:
    """The answer refusing a request that is no transaction request, as its client expects it."""
    # Lookups and partition metadata answer with their own typed response, as a broker does; anything
    # else with ERROR, which every client matches against its pending request by id. Not
    # ServiceNotReady for lookups: it makes the Java client close the whole connection, coordinator
    # handlers included (docs/pulsar-protocol.md §1).
    if isinstance(cmd, Lookup):
        return LookupResponse(request_id, LookupType.FAILED, error=error, message=message)
    if isinstance(cmd, PartitionedMetadata):
        return PartitionedMetadataResponse(request_id, error=error, message=message)
    return Error(request_id, error, message)


def connect_for_broker(client_connect: Connect, proxied: bool) -> Connect:
    """The client's CONNECT as a broker should see it, forwarded or relayed: its credentials and version, not
    the proxy fields. A Pulsar proxy's connection (``proxied``, --proxy-roles) keeps the client it names:
    brokers list the proxy's role in their proxyRoles too, and authorize that client, as for the proxy's own
    connections to them (a broker refuses a proxy role that names none). Anyone else's original_* fields go:
    a broker that honoured them would take the client for whomever it named."""
    if proxied:
        return replace(client_connect, proxy_to_broker_url=None)
    return replace(client_connect, proxy_to_broker_url=None, original_principal=None, original_auth_data=None,
                   original_auth_method=None)


def host_port(url: str) -> str:
    """``pulsar://h:p``, ``pulsar+ssl://h:p`` and a bare ``h:p`` (what clients put in proxy_to_broker_url)
    all become ``h:p``."""
    return url.split("://", 1)[-1].rstrip("/")
