"""Wiring: settings → store → coordinator → Pulsar listener + admin HTTP, and their orderly stop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
import ssl
from dataclasses import dataclass, field

import structlog

from tc_server.admin.http import AdminServer
from tc_server.admin.routes import AdminRoutes, StartingRoutes
from tc_server.auth.broker_client import (
    broker_client_credentials,
    forwarding_tls_context,
    peer_tls_context,
    upstream_proxy_credentials,
)
from tc_server.auth.certificates import ServerTlsContext, server_tls_context
from tc_server.auth.service import AuthenticationService, provider_methods
from tc_server.backoff import Backoff
from tc_server.client import ConnectionPool, connect_command
from tc_server.config import ENV_PREFIX, Settings, ephemeral_port_range, is_wildcard, parse_hostport, url_host
from tc_server.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
from tc_server.coordinator.partition import PartitionConfig
from tc_server.metrics import Metrics
from tc_server.participants.delivery import BrokerDelivery
from tc_server.server.connection import ServerContext
from tc_server.server.dispatch import Dispatcher
from tc_server.server.listener import PulsarListener
from tc_server.server.upstream import Upstream, host_port
from tc_server.store import open_store
from tc_server.store.api import MetadataStore, StoreError, StoreUnavailableError
from tc_server.store.embedded import EmbeddedStore
from tc_server.workers import WorkerRole

log = structlog.get_logger("tc_server")

# A request in flight is answered within --request-timeout-s (its deadline fires up to a tick late,
# tc_server/server/deadlines.py): a stop waits that long for the answers, and this much more ...
DRAIN_MARGIN_S = 0.5
# ... but never longer than this: a worker's whole stop must fit the supervisor's WORKER_STOP_S (12 s)
# and a pod's termination grace (30 s), and clients of the connections being drained wait for it too.
DRAIN_MAX_S = 8.0


@dataclass
class App:
    settings: Settings
    store: MetadataStore
    coordinator: TransactionCoordinator
    context: ServerContext  # what the listeners' connections share (the dispatcher, limits, counts)
    listener: PulsarListener | None  # pulsar:// (None: --listen is empty)
    admin: AdminServer
    metrics: Metrics
    tls_listener: PulsarListener | None = None  # pulsar+ssl:// (--tls-listen)
    tls: ServerTlsContext | None = None
    tls_reload: asyncio.Task[None] | None = None
    broker_pool: ConnectionPool | None = None  # tc-server's own connections to brokers (delivery)
    # A worker's share of the service's ports (--workers): --listen's, then --tls-listen's.
    shared_listeners: list[PulsarListener] = field(default_factory=list)

    @property
    def listeners(self) -> list[PulsarListener]:
        own = [listener for listener in (self.listener, self.tls_listener) if listener is not None]
        return own + self.shared_listeners

    async def stop(self) -> None:
        """Stop accepting, answer the requests in flight (bounded), step down, close the store; one log line
        (after the signal's own, serve())."""
        # The Pulsar ports first, before anything is awaited: a client connecting from now on is refused
        # and goes to another instance at once, whatever holds up the rest of the stop.
        for listener in self.listeners:
            listener.stop_accepting()
        if self.tls_reload is not None:
            self.tls_reload.cancel()
        # An END_TXN waiting for its participants' acknowledgements would outlast the drain's bound and be
        # closed unanswered: it answers now (its decision is durable; delivery goes on until the coordinator
        # steps down below).
        self.context.dispatcher.stop_waiting_for_participants()
        self.admin.stopping()
        drain_s = min(self.settings.request_timeout_s + DRAIN_MARGIN_S, DRAIN_MAX_S)
        # With the default --request-timeout-s (10 s) the requests' own deadlines fall after the drain's
        # bound: a request the store held was closed unanswered. Their deadlines come at the bound instead.
        dispatcher = self.context.dispatcher
        expiry = asyncio.get_running_loop().call_later(drain_s - DRAIN_MARGIN_S, dispatcher.expire_requests)
        try:
            for listener in self.listeners:
                await listener.stop(drain_timeout_s=drain_s)
        finally:
            expiry.cancel()
        await self.coordinator.stop()
        await self.admin.stop()  # after the drain and the step-down: probes and scrapes are answered through them
        if self.broker_pool is not None:
            await self.broker_pool.close()
        await self.store.close()
        # What the limiter left out of the log since the last "request failed" lines (the requests a stalled
        # store held until the drain cut them, whose outcome is unknown) would otherwise be counted nowhere.
        left_out = dispatcher.failures_left_out()
        log.info("stopped", **({"request_failures_not_logged": left_out} if left_out else {}))


def cannot_bind(setting: str, address: str, exc: OSError, derived: str = "") -> OSError:
    """A bind failure that names the address and the setting that chose it; the CLI prints it after
    "cannot start: " (e.g. ``address already in use: 0.0.0.0:6650 (--listen / TC_SERVER_LISTEN)``).
    ``derived``: how the port follows from the setting (a worker's: ``worker 1: port + 2 of ``)."""
    # A name that does not resolve is a socket.gaierror, whose errno is no errno (os.strerror(-2)
    # would say "unknown error -2"): its own text says what happened.
    if isinstance(exc, socket.gaierror) or not exc.errno:
        reason = f"cannot resolve the host ({exc.strerror or exc})" if isinstance(exc, socket.gaierror) else str(exc)
    else:
        reason = os.strerror(exc.errno).lower()
    return OSError(f"{reason}: {address} ({derived}--{setting.replace('_', '-')} / {ENV_PREFIX}{setting.upper()})")


def worker_port_of(worker: WorkerRole | None) -> str:
    """How a worker's own ports follow from the settings, for bind errors (tc_server/workers.py)."""
    return "" if worker is None else f"worker {worker.index}: port + {1 + worker.index} of "


def advertised_url_for(host: str, port: int, scheme: str = "pulsar") -> str:
    """The URL LOOKUP hands out when none is set: the listen address, or 127.0.0.1 when that is every
    address (which only a client on this host can follow: said once at start)."""
    if is_wildcard(host):  # every spelling of it ("[0::0]" too)
        url = f"{scheme}://127.0.0.1:{port}"
        log.warning("no advertised URL set and listening on every address: LOOKUP names " + url + ", which "
                    "clients on other hosts cannot reach; set --advertised-url / TC_SERVER_ADVERTISED_URL "
                    "(resp. --advertised-url-tls)", advertised_url=url)
        return url
    return f"{scheme}://{url_host(host)}:{port}"  # an IPv6 address in brackets: pulsar://::1:6650 splits no way


async def open_configured_store(settings: Settings, *, read_only: bool = False) -> MetadataStore:
    """The store ``settings`` name. ``read_only`` (the audit export): the embedded store's file is read beside
    the tc-server that may be running on it, and nothing is written to it (EmbeddedStore.open)."""
    if settings.store == "oxia":
        return await open_store(
            "oxia", data_dir=settings.data_dir, address=settings.oxia_address,
            namespace=settings.oxia_namespace, session_timeout_ms=settings.oxia_session_timeout_ms,
            request_timeout_s=settings.request_timeout_s,
        )
    if settings.store == "embedded":
        # A write that would wait longer than half a request's time is refused, not queued (embedded.py).
        return await open_store("embedded", data_dir=settings.data_dir,
                                max_queue_delay_s=settings.request_timeout_s / 2, read_only=read_only)
    return await open_store(settings.store, data_dir=settings.data_dir)


# The wait between tries to reach an Oxia that did not answer at start: doubling from the first to the last.
STORE_RETRY_INITIAL_S = 0.5
STORE_RETRY_MAX_S = 10.0


@dataclass
class OpenedStore:
    """The store open_store_waiting opened, and the admin port that answered meanwhile (Oxia only), which
    start_app keeps answering (503, "starting") until the admin port proper takes its place: closed as soon
    as the store answered, the port was silent for as long as the coordinators took to start on a slow
    store, and the supervisor of --workers took a worker that was starting for hung."""

    store: MetadataStore
    waiting: AdminServer | None = None

    async def stop_waiting(self) -> None:
        if self.waiting is not None:
            await self.waiting.stop()
            self.waiting = None


async def open_store_waiting(settings: Settings, admin_tls: ServerTlsContext | None,
                             authentication: AuthenticationService, worker: WorkerRole | None = None) -> OpenedStore:
    """The configured store. An Oxia that does not answer (down, or not up yet) is tried again, with a
    warning each time, instead of ending the start: an Oxia outage during a rollout would crash-loop the
    process (restarted ever more slowly), and a sidecar's container that is not running takes its
    broker's pod out of its Service. Meanwhile the admin port answers /healthz 200 and /readyz 503 with
    the store's last error (StartingRoutes), and goes on answering until the admin port proper binds
    (OpenedStore). The embedded store's errors still end the start: a file that is damaged or locked stays so."""
    if settings.store != "oxia":
        return OpenedStore(await open_configured_store(settings))
    backoff = Backoff(STORE_RETRY_INITIAL_S, STORE_RETRY_MAX_S)
    routes = StartingRoutes(settings.cluster, settings.coordinators, admin_tls)
    routes.problem = f"metadata store: connecting to {settings.oxia_address}"
    # Bound before the first try, which an Oxia that takes connections and answers nothing holds for the
    # whole --request-timeout-s: a liveness probe meanwhile found no port, and restarted the container
    # every ~30 s while Oxia was down (the crash loop this wait exists to prevent).
    host, port = parse_hostport(settings.admin_listen)
    # Authenticated as the instance's own (--authenticate-metrics-endpoint: /metrics was open while it waited).
    waiting = AdminServer(routes, host, port, authentication=authentication,
                          authenticate_metrics=settings.authenticate_metrics_endpoint, tls=admin_tls)
    try:
        await waiting.start()
    except OSError as bind_error:
        raise cannot_bind("admin_listen", settings.admin_listen, bind_error, worker_port_of(worker)) from bind_error
    try:
        while True:
            try:
                store = await open_configured_store(settings)
            except StoreUnavailableError as exc:
                routes.problem = f"metadata store unreachable: {exc}"
                delay = backoff.next_delay()
                log.warning("the metadata store does not answer yet; trying again", store=settings.store,
                            address=settings.oxia_address, error=str(exc), retry_in_s=round(delay, 2))
                await asyncio.sleep(delay)
                continue
            routes.problem = "starting: the metadata store answered; the coordinators are being recovered"
            return OpenedStore(store, waiting)
    except BaseException:
        await waiting.stop()
        raise


# Descriptors besides client connections: the store's files, the admin port and its clients (at most
# admin/http.py MAX_CONNECTIONS, 128), broker connections, the interpreter's own.
RESERVED_DESCRIPTORS = 512


def connections_that_fit(max_connections: int) -> int:
    """Make room for --max-connections open sockets: raise the soft RLIMIT_NOFILE up to the hard one if
    needed; if even that is too few, lower the connection limit to what fits (one warning naming the
    setting). Past the descriptor limit accept() fails for every new socket, the probes' included, so
    the connection limit must be what refuses first (issue 15: ~20,000 connections exhausted them)."""
    need = max_connections + RESERVED_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft >= need:
        return max_connections
    fitting = max(1, soft - RESERVED_DESCRIPTORS)
    log.warning("max_connections lowered to fit the descriptor limit (ulimit -n)", max_connections=max_connections,
                lowered_to=fitting, descriptor_limit=soft)
    return fitting


async def start_app(settings: Settings, store: MetadataStore | None = None, worker: WorkerRole | None = None) -> App:
    """Start everything; raises ConfigError/ParallelismMismatch/OSError with a message for the user.

    ``worker``: this process is one worker of ``--workers N`` (tc_server/supervisor.py); ``settings`` are
    then its own (``worker.settings``: its port, admin port, URL and data directory)."""
    max_connections = connections_that_fit(settings.max_connections)
    metrics = Metrics(settings.cluster)
    if settings.store == "memory":
        log.warning("the memory store keeps nothing across a restart: every transaction and decision is lost; "
                    "use it for tests only")
    # Keys and certificates first: a bad file stops the start before anything is opened.
    authentication = AuthenticationService.from_settings(settings)
    tls = server_tls_context(settings)
    if tls is not None:
        metrics.tls_certificate_expiry.read = tls.expiry_samples
    if not authentication.enabled:
        # Settings that mean something only with authentication on: one who set them believes it is on.
        unused = [f"--{name.replace('_', '-')}" for name in ("superuser_roles", "proxy_roles", "token_secret_key",
                                                              "token_public_key", "authenticate_metrics_endpoint")
                  if getattr(settings, name)]
        if unused:
            log.warning("authentication is off (no --authentication-providers): these settings do nothing",
                        settings=unused)
    if settings.admin_listen and provider_methods(settings.authentication_providers) == ["tls"] \
            and not settings.admin_tls:
        # No request on a plain-HTTP admin port can carry a credential the one method takes.
        log.warning("the admin API can authenticate nobody: the only authentication method is tls and the admin "
                    "port is plain HTTP (set --admin-tls, or add the token method); /admin/v3 answers 401 to all"
                    + (", and /metrics too (--authenticate-metrics-endpoint)" if settings.authenticate_metrics_endpoint
                       else ""))
    if not authentication.enabled and parse_hostport(settings.admin_listen)[0] not in ("127.0.0.1", "::1", "localhost"):
        log.warning("authentication is off: whoever reaches the admin port may read and force-abort any "
                    "transaction (set --authentication-providers)", admin_listen=settings.admin_listen)
    low, high = ephemeral_port_range()
    for setting in ("listen", "admin_listen", "tls_listen"):
        address = getattr(settings, setting)
        if address and low <= parse_hostport(address)[1] <= high:
            log.warning("a port inside the host's ephemeral range: an outgoing connection may hold it when this "
                        "process restarts, which then fails with 'address already in use' (README, Several cores)",
                        setting=f"--{setting.replace('_', '-')}", address=address,
                        ephemeral_range=f"{low}-{high}", worker=None if worker is None else worker.index)
    # tc-server's own broker credential (a superuser role: brokers take END_TXN_ON_* from superusers only).
    broker_credentials = broker_client_credentials(settings) if settings.upstream_urls else None
    opened_store = OpenedStore(store) if store is not None else await open_store_waiting(
        settings, tls if settings.admin_tls else None, authentication, worker)
    store = opened_store.store
    if isinstance(store, EmbeddedStore):  # its group commits and its writer process, as metrics
        store.on_commit = metrics.store_batch_size.observe
        store.on_writer_lost = metrics.store_writer_lost.inc
    coordinator: TransactionCoordinator | None = None
    broker_pool: ConnectionPool | None = None
    listener: PulsarListener | None = None
    tls_listener: PulsarListener | None = None
    shared_listeners: list[PulsarListener] = []
    try:
        # Bound now (the advertised URL needs the port before the coordinator campaigns), started with the
        # server context once the coordinator exists: nothing is accepted before.
        advertised = ""
        if settings.listen:
            host, port = parse_hostport(settings.listen)
            listener = PulsarListener(host, port)
            try:
                bound = listener.bind()
            except OSError as exc:
                raise cannot_bind("listen", settings.listen, exc, worker_port_of(worker)) from exc
            advertised = settings.advertised_url or advertised_url_for(host, bound)
        advertised_tls = None
        if settings.tls_listen:
            assert tls is not None
            tls_host, tls_port = parse_hostport(settings.tls_listen)
            tls_listener = PulsarListener(tls_host, tls_port, ssl_context=tls.context)
            try:
                tls_bound = tls_listener.bind()
            except OSError as exc:
                raise cannot_bind("tls_listen", settings.tls_listen, exc, worker_port_of(worker)) from exc
            advertised_tls = settings.advertised_url_tls or advertised_url_for(tls_host, tls_bound, "pulsar+ssl")
        # TLS only: the leader record's brokerServiceUrl is the TLS URL too (nothing else is reachable).
        advertised = advertised or str(advertised_tls)
        if worker is not None:  # the ports every worker shares (SO_REUSEPORT), as the service's address
            tls_context = tls.context if tls is not None else None
            for setting, address, ssl_context in (("listen", worker.service_listen, None),
                                                  ("tls_listen", worker.service_listen_tls, tls_context)):
                if not address:
                    continue
                shared_host, shared_port = parse_hostport(address)
                shared = PulsarListener(shared_host, shared_port, ssl_context=ssl_context, reuse_port=True)
                shared_listeners.append(shared)
                try:
                    shared.bind()
                except OSError as exc:
                    raise cannot_bind(setting, address, exc) from exc
        config = CoordinatorConfig(
            partitions=settings.coordinators,
            advertised_url=advertised,
            advertised_url_tls=advertised_tls,
            partition=PartitionConfig(
                default_timeout_ms=settings.default_txn_timeout_ms,
                max_timeout_ms=settings.max_txn_timeout_ms,
                id_block_size=settings.id_block_size,
                max_active_txns=settings.max_active_transactions_per_coordinator,
                max_open_txns_per_principal=settings.max_open_transactions_per_principal,
                max_participants_per_txn=settings.max_participants_per_transaction,
                max_undelivered=settings.max_undelivered_decisions,
                max_undelivered_participants=settings.max_undelivered_participants,
            ),
            gc_retention_s=settings.gc_retention_s,
            gc_interval_s=settings.gc_interval_s,
            timeout_sweep=settings.timeout_sweep,
            campaign=worker.coordinators if worker is not None else None,
            static_leaders=worker.urls if worker is not None else {},
            static_tls_urls=worker.tls_urls if worker is not None else {},
            gc_coordinator=worker.gc_coordinator if worker is not None else 0,
        )
        delivery = None
        if broker_credentials is not None:
            # Decisions reach today's brokers (docs/participants.md); without an upstream the
            # participant records wait for an instance that has one.
            # A TLS context with a TLS upstream only (the pool refuses every plain URL given one,
            # Endpoint.with_tls: plain brokers were never told a decision), and always then: the credentials'
            # own when they have one (trust certificates set, a client certificate), else the system's CAs with
            # host names checked, as each connection made its own before. Without one, a pulsar:// URL a lookup
            # named in its TLS field was connected to in plain, tc-server's token in the clear (a review).
            broker_pool = ConnectionPool(
                connect_command(broker_credentials.client_auth()),
                ssl_context=(broker_credentials.ssl_context or ssl.create_default_context())
                if settings.upstream_tls else None,
                timeout_s=settings.request_timeout_s, auth_data_source=broker_credentials.auth_data,
                keepalive_s=settings.keepalive_s)
            delivery = BrokerDelivery(settings.upstream_urls, broker_pool, request_timeout_s=settings.request_timeout_s,
                                      max_in_flight=settings.delivery_max_in_flight,
                                      max_in_flight_per_broker=settings.delivery_max_in_flight_per_broker,
                                      metrics=metrics)
        coordinator = TransactionCoordinator(store, config, metrics, participant_sender=delivery)
        await coordinator.start()
        context = ServerContext(
            dispatcher=Dispatcher(coordinator, metrics, settings.request_timeout_s,
                                  participant_wait_s=settings.participant_wait_s),
            metrics=metrics,
            authenticator=authentication,
            authentication_refresh_check_s=settings.authentication_refresh_check_s,
            keepalive_s=settings.keepalive_s,
            max_message_size=settings.max_message_size,
            max_frame_size=settings.max_frame_size,
            max_buffered_input=settings.max_buffered_input_bytes,
            max_in_flight=settings.max_requests_in_flight,
            max_connections=max_connections,
            max_connections_per_address=settings.max_connections_per_address,
            upstream=Upstream(settings.upstream_urls, request_timeout_s=settings.request_timeout_s,
                              connection_mode=settings.lookup_connections, metrics=metrics,
                              ssl_context=forwarding_tls_context(settings), keepalive_s=settings.keepalive_s,
                              proxy_credentials=upstream_proxy_credentials(settings))
            if settings.upstream_urls else None,
            peer_ssl_context=peer_tls_context(settings),
            own_addresses=frozenset(
                host_port(url) for url in (advertised, advertised_tls, worker and worker.service_url,
                                           worker and worker.service_url_tls) if url),
            tls=tls,
        )
        for started in (listener, tls_listener, *shared_listeners):
            if started is not None:
                await started.start(context)
        admin_host, admin_port = parse_hostport(settings.admin_listen)
        routes = AdminRoutes(coordinator, metrics, other_admin_ports=worker.other_admin_ports if worker else None,
                             own_coordinators=worker.coordinators if worker else None)
        admin = AdminServer(routes, admin_host, admin_port, authentication=authentication,
                            authenticate_metrics=settings.authenticate_metrics_endpoint,
                            tls=tls if settings.admin_tls else None)
        await opened_store.stop_waiting()  # the port goes from the one to the other
        try:
            await admin.start()
        except OSError as exc:
            raise cannot_bind("admin_listen", settings.admin_listen, exc, worker_port_of(worker)) from exc
    except BaseException:
        await opened_store.stop_waiting()
        for opened in (listener, tls_listener, *shared_listeners):
            if opened is not None:  # release the ports (a listener that started drains nothing yet)
                await opened.stop(drain_timeout_s=0)
        if coordinator is not None:  # it campaigns in the background: stop it before its store goes
            await coordinator.stop()
        if broker_pool is not None:
            await broker_pool.close()
        await store.close()
        raise
    log.info("started", store=settings.store, coordinators=settings.coordinators, advertised_url=advertised,
             upstream=settings.upstream_url or None,
             worker=None if worker is None else worker.index, workers=None if worker is None else worker.count)
    tls_reload = asyncio.create_task(tls.run(settings.tls_cert_refresh_check_s), name="tls-reload") if tls else None
    return App(settings, store, coordinator, context, listener, admin, metrics, tls_listener, tls, tls_reload,
               broker_pool, shared_listeners)


# The signals that ask for the graceful stop: SIGHUP too, which a closing terminal sends (it killed the
# process with no stop at all: no drain, Oxia's leader records left to expire).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _on_stop_signal(stop: asyncio.Event, sig: signal.Signals, worker: WorkerRole | None) -> None:
    """The first SIGTERM, SIGINT or SIGHUP asks for the graceful stop; a second SIGTERM or SIGINT, while the start
    or the stop still waits (a store that does not answer holds a stop for up to ~26 s), ends the process at once:
    an operator pressing Ctrl-C again means it. That is a crash as kill -9 is one, which loses nothing
    acknowledged (every answer waited for its write); the embedded store's writer reads EOF and ends
    after its group, or is killed by the kernel if it is stopped or stalled (tc_server/parent_death.py).

    Not in a worker: one stop can signal it twice (systemd's KillMode=control-group or a pkill signals
    every process, then its supervisor signals it again), and the supervisor escalates itself (it kills
    a worker's process group at its bound or at its own second signal)."""
    if not stop.is_set():
        log.info("stopping", signal=sig.name, force=None if worker else "a second signal exits at once")
        stop.set()
        return
    if worker is not None:
        log.info("stop signal while stopping; the supervisor decides when to kill", signal=sig.name)
        return
    if sig is signal.SIGHUP:
        # A closing terminal sends its foreground job two (the shell passes its own on, and the kernel hangs
        # up the process group): not an operator insisting.
        log.info("hang-up while stopping: the stop goes on")
        return
    log.warning("second stop signal: exiting now, without finishing the stop", signal=sig.name)
    os._exit(128 + sig)


class StopFailed(Exception):
    """A step of the graceful stop failed on its environment (a system call, the store): the process ends
    without the steps after it. Said as such, not as a failure to start (which is what the same error during
    the start would be)."""

    @classmethod
    def of(cls, exc: BaseException) -> StopFailed:
        return cls(f"{type(exc).__name__}: {exc}")


async def serve(settings: Settings, worker: WorkerRole | None = None) -> None:
    """Run until SIGTERM, SIGINT or SIGHUP, then stop gracefully.

    The handlers come before the start, which can take a while (the store's lock, an Oxia cluster not
    answering yet): a signal meanwhile ends the start, closing what it opened, instead of killing the
    process with nothing logged or, as PID 1 (which has no default action for SIGTERM), being ignored."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, _on_stop_signal, stop, sig, worker)
    starting = asyncio.create_task(start_app(settings, worker=worker), name="start")
    stop_asked = asyncio.create_task(stop.wait(), name="stop-asked")
    try:
        await asyncio.wait((starting, stop_asked), return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()  # start_app closes what it opened
            await asyncio.wait((starting,))
            if starting.cancelled():
                log.info("stopped during the start")
                return
        app = starting.result()  # a failed start raises here
        await stop_asked
    finally:
        stop_asked.cancel()
    try:
        await app.stop()
    except (OSError, StoreError) as exc:
        raise StopFailed.of(exc) from exc
