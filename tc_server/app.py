"""Wiring: settings → store → coordinator → Pulsar listener + admin HTTP, and their orderly stop."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass

import structlog

from tc_server.admin.http import HttpServer
from tc_server.admin.routes import AdminRoutes
from tc_server.config import ENV_PREFIX, Settings, parse_hostport
from tc_server.coordinator.coordinator import CoordinatorConfig, TransactionCoordinator
from tc_server.coordinator.partition import PartitionConfig
from tc_server.metrics import Metrics
from tc_server.server.connection import ServerContext
from tc_server.server.dispatch import Dispatcher
from tc_server.server.handshake import NoAuthentication
from tc_server.server.listener import PulsarListener
from tc_server.store import open_store
from tc_server.store.api import MetadataStore
from tc_server.wire import MESSAGE_SIZE_FRAME_PADDING

log = structlog.get_logger("tc_server")


@dataclass
class App:
    settings: Settings
    store: MetadataStore
    coordinator: TransactionCoordinator
    listener: PulsarListener
    admin: HttpServer
    metrics: Metrics

    async def stop(self) -> None:
        """Stop accepting, drain requests in flight, step down, close the store; one log line."""
        await self.admin.stop()
        await self.listener.stop()
        await self.coordinator.stop()
        await self.store.close()
        log.info("stopped")


def cannot_bind(setting: str, address: str, exc: OSError) -> OSError:
    """A bind failure that names the address and the setting that chose it; the CLI prints it after
    "cannot start: " (e.g. ``address already in use: 0.0.0.0:6650 (--listen / TC_SERVER_LISTEN)``)."""
    reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
    return OSError(f"{reason}: {address} (--{setting.replace('_', '-')} / {ENV_PREFIX}{setting.upper()})")


def advertised_url_for(host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"pulsar://{host}:{port}"


async def open_configured_store(settings: Settings) -> MetadataStore:
    if settings.store == "oxia":
        return await open_store(
            "oxia", data_dir=settings.data_dir, address=settings.oxia_address,
            namespace=settings.oxia_namespace, session_timeout_ms=settings.oxia_session_timeout_ms,
            request_timeout_s=settings.request_timeout_s,
        )
    return await open_store(settings.store, data_dir=settings.data_dir)


async def start_app(settings: Settings, store: MetadataStore | None = None) -> App:
    """Start everything; raises ConfigError/ParallelismMismatch/OSError with a message for the user."""
    metrics = Metrics(settings.cluster)
    if settings.store == "memory":
        log.warning("the memory store keeps nothing across a restart: transaction ids start again at 0; "
                    "use it for tests only")
    store = store if store is not None else await open_configured_store(settings)
    coordinator: TransactionCoordinator | None = None
    try:
        host, port = parse_hostport(settings.listen)
        # The context's dispatcher is set once the coordinator exists; nothing is accepted before.
        context = ServerContext(
            dispatcher=None,  # type: ignore[arg-type]
            metrics=metrics,
            authenticator=NoAuthentication(),
            keepalive_s=settings.keepalive_s,
            max_message_size=settings.max_message_size,
            max_frame_size=settings.max_message_size + MESSAGE_SIZE_FRAME_PADDING,
            max_in_flight=settings.max_requests_in_flight,
        )
        listener = PulsarListener(context, host, port)
        try:
            bound = listener.bind()
        except OSError as exc:
            raise cannot_bind("listen", settings.listen, exc) from exc
        advertised = settings.advertised_url or advertised_url_for(host, bound)
        config = CoordinatorConfig(
            partitions=settings.coordinators,
            advertised_url=advertised,
            partition=PartitionConfig(
                default_timeout_ms=settings.default_txn_timeout_ms,
                max_timeout_ms=settings.max_txn_timeout_ms,
                id_block_size=settings.id_block_size,
            ),
            gc_retention_s=settings.gc_retention_s,
            gc_interval_s=settings.gc_interval_s,
            timeout_sweep=settings.timeout_sweep,
        )
        coordinator = TransactionCoordinator(store, config, metrics)
        await coordinator.start()
        context.dispatcher = Dispatcher(coordinator, metrics, settings.request_timeout_s)
        await listener.start()
        admin_host, admin_port = parse_hostport(settings.admin_listen)
        admin = HttpServer(AdminRoutes(coordinator, metrics), admin_host, admin_port)
        try:
            await admin.start()
        except OSError as exc:
            raise cannot_bind("admin_listen", settings.admin_listen, exc) from exc
    except BaseException:
        if coordinator is not None:  # it campaigns in the background: stop it before its store goes
            await coordinator.stop()
        await store.close()
        raise
    log.info("started", store=settings.store, coordinators=settings.coordinators, advertised_url=advertised)
    return App(settings, store, coordinator, listener, admin, metrics)


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then stop gracefully."""
    app = await start_app(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await app.stop()
