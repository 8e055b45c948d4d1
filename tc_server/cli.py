"""``tc-server``: ``run`` the coordinator, ``export`` a snapshot of the store for the audit job,
``healthcheck`` the image's HEALTHCHECK.

Every setting of tc_server.config.Settings is a flag of ``run`` (``--data-dir``), an environment
variable (``TC_SERVER_DATA_DIR``) and a key of the TOML file given by ``--config``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from tc_server import __version__
from tc_server.config import ENV_PREFIX, SETTING_NAMES, ConfigError, Settings, load_settings, settings_from_json
from tc_server.healthcheck import HEALTHCHECK_SETTINGS, check_health
from tc_server.logs import configure_command_logging
from tc_server.store import STORE_KINDS, store_kinds_help

# Net new container objects between two youngest-generation collections of Python's cyclic GC
# (CPython's default: 700). At 700, a server with ~256 requests in flight collected ~100 times a
# second, and the request objects alive at each collection were promoted until a full collection
# (every store object walked) ran every second; at 10,000 a steady load frees about as much as it
# allocates and collections become rare, while cyclic garbage still goes within 10,000 objects.
# Memory store, 30 s retention, 300,000 pairs: 53 full collections -> 1, and CPU per pair with GC
# running stayed at the first rounds' level (docs/performance.md, "Memory store under sustained load").
GC_YOUNG_THRESHOLD = 10_000

HELP = {
    "listen": "HOST:PORT for Pulsar clients",
    "admin_listen": "HOST:PORT for /metrics, /healthz, /readyz and /admin/v3/transactions",
    "advertised_url": "pulsar://HOST:PORT handed to clients in LOOKUP answers (default: from --listen)",
    "store": "metadata store: " + store_kinds_help(),
    "data_dir": "directory of the embedded store",
    "coordinators": "number of coordinator partitions (stored once; every instance must agree)",
    "workers": "worker processes on this machine (1: one process). N > 1: this process supervises N workers "
               "(restarted when one dies); coordinator i is led by worker i mod N; worker k also listens on "
               "--listen's port + 1 + k (its advertised URL) and serves admin on --admin-listen's port + 1 + k; "
               "on the embedded store each has its own store under --data-dir, which records N",
    "default_txn_timeout_ms": "timeout of a txn whose client asks for 0",
    "max_txn_timeout_ms": "largest timeout a client may ask for (larger: NotAllowedError)",
    "gc_retention_s": "how long ended txn headers are kept before GC deletes them",
    "gc_interval_s": "how often the GC pass runs (on the leader of coordinator 0)",
    "timeout_sweep": "abort open txns at their deadline and write again decision events that failed (disable only "
                     "to inspect stuck txns: neither happens then)",
    "max_active_transactions_per_coordinator": "open transactions per coordinator before NEW_TXN is answered "
                                               "NotAllowedError (broker.conf maxActiveTransactionsPerCoordinator; "
                                               "0: no limit)",
    "max_open_transactions_per_principal": "open transactions of one authenticated role across the coordinators "
                                           "this instance leads, with its decided ones whose brokers have not "
                                           "all acknowledged, before its NEW_TXN is answered NotAllowedError "
                                           "(0: no limit; without authentication there is no role and no limit). "
                                           "Default 5000: half of one coordinator's default cap, so one role cannot "
                                           "fill a coordinator and starve the others there",
    "max_undelivered_decisions": "decided transactions whose brokers have not all acknowledged, across the "
                                 "coordinators this instance leads, before NEW_TXN is answered NotAllowedError "
                                 "to the roles that owe some (all, without authentication; each holds ~6 KB "
                                 "until they have; 0: no limit)",
    "max_undelivered_participants": "topics and subscriptions being told a decision their brokers have not "
                                    "acknowledged yet, across the coordinators this instance leads, before NEW_TXN "
                                    "is answered NotAllowedError to the roles that owe some (all, without "
                                    "authentication; each holds ~5 KB until its broker has; 0: no limit)",
    "max_participants_per_transaction": "topics and subscriptions one transaction may name (ADD_PARTITION_TO_TXN, "
                                        "ADD_SUBSCRIPTION_TO_TXN) before its next ADD naming a new one is answered "
                                        "NotAllowedError (0: no limit)",
    "id_block_size": "txn ids reserved per store round trip",
    "keepalive_s": "PING idle clients (and the brokers of forwarded requests) this often; drop those that do "
                   "not answer by the next tick",
    "max_message_size": "max_message_size announced in CONNECTED: the largest message a client may send through "
                        "to the brokers (the frames tc-server decodes itself are bounded by --max-frame-size)",
    "request_timeout_s": "a request not finished by then is answered TransactionCoordinatorNotFound",
    "max_requests_in_flight": "requests in flight on all connections before the server stops reading "
                              "new ones until some finish (back-pressure, not an error)",
    "max_connections": "client connections at once; past it a new one is closed at once (logged, counted in "
                       "tc_server_connections_refused_total)",
    "max_connections_per_address": "client connections at once from one remote address; past it as --max-connections",
    "max_frame_size": "largest frame a client may send, in bytes, its 4-byte size field included as brokers "
                      "count it (TC commands are small; producers' payloads never pass the frame decoder); a "
                      "larger one closes the connection",
    "max_buffered_input_bytes": "input all connections may buffer together; past it a connection growing a "
                                "large unfinished frame is closed",
    "upstream_url": "pulsar://HOST:PORT[,HOST:PORT...] (or pulsar://HOST:PORT,pulsar://HOST:PORT; pulsar+ssl:// "
                    "alike) of brokers that get every request that is not the coordinator's (lookups, partition "
                    "metadata, schemas); the first that answers is used",
    "lookup_connections": "how producers/consumers reach the broker a forwarded lookup names: upstream (as "
                          "the broker says), direct (clients connect to brokers), proxy (always through tc-server)",
    "participant_wait_s": "END_TXN answers once every participant broker acknowledged the decision, or after "
                          "this many seconds (delivery goes on; keep it below the clients' 30 s operation timeout)",
    "delivery_max_in_flight": "END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION requests in flight to all brokers",
    "delivery_max_in_flight_per_broker": "END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION requests in flight per broker",
    "cluster": "value of the cluster label on metrics",
    "oxia_address": "HOST:PORT of the Oxia server (--store oxia)",
    "oxia_namespace": "Oxia namespace",
    "oxia_session_timeout_ms": "Oxia session timeout; bounds failover time of leadership",
    "log_format": "auto (console on a TTY, else JSON), json or console",
    "log_level": "debug, info, warning or error",
    "authentication_providers": "comma-separated authentication methods clients must use: token, tls "
                                "(or the brokers' AuthenticationProvider class names); empty: off",
    "token_secret_key": "HS256/384/512 key: data:;base64,KEY, file:///path (raw bytes) or KEY in base64",
    "token_public_key": "RS*/PS*/ES* public key (DER or PEM): data:;base64,KEY, file:///path or KEY in base64",
    "token_auth_claim": "the token claim that holds the role",
    "token_audience_claim": "the token claim that holds the audience (checked when --token-audience is set)",
    "token_audience": "tokens must name this audience (empty: not checked)",
    "superuser_roles": "comma-separated roles that may end or extend any txn and use the admin API",
    "proxy_roles": "comma-separated roles of Pulsar proxies: their connections act as the client the proxy "
                   "names (CONNECT's original_principal), which must be given",
    "authentication_refresh_check_s": "how often expiring credentials are checked; expired ones are "
                                      "challenged (AUTH_CHALLENGE), then the connection is closed",
    "authenticate_metrics_endpoint": "/metrics needs an authenticated role too (probes stay open)",
    "tls_listen": "HOST:PORT of the pulsar+ssl:// listener (empty: none); an empty --listen turns the plain one off",
    "advertised_url_tls": "pulsar+ssl://HOST:PORT handed to clients in LOOKUP answers (default: from --tls-listen)",
    "tls_cert_file": "PEM certificate (chain) of the TLS listener and HTTPS admin port",
    "tls_key_file": "PEM private key of --tls-cert-file",
    "tls_trust_certs_file": "PEM CA bundle client certificates must chain to (mTLS, the tls method)",
    "tls_require_trusted_client_cert": "refuse TLS handshakes without a trusted client certificate",
    "tls_cert_refresh_check_s": "how often the TLS files are checked; changed files are loaded for new connections",
    "admin_tls": "serve the admin port over HTTPS with the --tls-* certificate",
    "broker_client_auth_plugin": "credentials toward brokers: org.apache.pulsar.client.impl.auth.AuthenticationToken "
                                 "or ...AuthenticationTls (empty: none)",
    "broker_client_auth_params": "token:JWT or file:///path (token plugin); tlsCertFile:/path,tlsKeyFile:/path (TLS)",
    "broker_client_tls_trust_certs": "PEM CA bundle for pulsar+ssl:// brokers (empty: the system's CAs)",
    "broker_client_tls_hostname_verification": "check that a broker's certificate names its host (brokers' "
                                               "own client does not by default)",
    "upstream_proxy_auth_plugin": "credentials tc-server presents as a Pulsar proxy (a role in the brokers' "
                                  "proxyRoles) for the forwarded requests of clients that authenticated with a TLS "
                                  "certificate; plugin as --broker-client-auth-plugin (empty: forwarded as the "
                                  "client, without its certificate)",
    "upstream_proxy_auth_params": "as --broker-client-auth-params, for --upstream-proxy-auth-plugin",
}


# The settings `tc-server export` reads (open_configured_store), each a flag of export too.
EXPORT_SETTINGS = ("store", "data_dir", "oxia_address", "oxia_namespace", "oxia_session_timeout_ms",
                   "request_timeout_s")

# The settings `tc-server upgrade-store` reads.
UPGRADE_SETTINGS = ("store", "data_dir")

# --help's placeholder for the values whose name does not end in what they are (_metavar).
METAVARS = {
    "listen": "HOST:PORT", "admin_listen": "HOST:PORT", "tls_listen": "HOST:PORT", "oxia_address": "HOST:PORT",
    "advertised_url": "URL", "advertised_url_tls": "URL", "upstream_url": "URL",
    "lookup_connections": "MODE", "cluster": "NAME", "broker_client_tls_trust_certs": "FILE",
    "max_message_size": "BYTES", "max_frame_size": "BYTES",
}


def _metavar(name: str, default: Any) -> str:
    """The placeholder of a flag's value in --help: the last word of the setting's name (DIR, FILE, KEY),
    a number's unit (MS, S, BYTES, else N), or METAVARS. A number named by its last word read as a name to
    give (`--max-connections-per-address ADDRESS`), and `--advertised-url-tls TLS` as a switch's value."""
    if name in METAVARS:
        return METAVARS[name]
    last = name.rpartition("_")[2]
    if isinstance(default, int | float):
        return {"ms": "MS", "s": "S", "bytes": "BYTES"}.get(last, "N")
    return last.upper()


def _add_setting_flags(parser: argparse.ArgumentParser, names: Sequence[str] = SETTING_NAMES) -> None:
    defaults = Settings()
    for name in names:
        flag = "--" + name.replace("_", "-")
        env = ENV_PREFIX + name.upper()
        default = getattr(defaults, name)
        text = f"{HELP.get(name, name)} [env {env}; default {default!r}]"
        if isinstance(default, bool):
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(flag, dest=name, default=None, metavar=_metavar(name, default), help=text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tc-server", description="Apache Pulsar transaction coordinator")
    parser.add_argument("--version", action="version", version=f"tc-server {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the coordinator")
    run.add_argument("--config", help=f"TOML file with settings [env {ENV_PREFIX}CONFIG]")
    # Set by the supervisor of --workers N on the processes it starts (tc_server/supervisor.py).
    run.add_argument("--worker-index", dest="worker_index", type=int, default=None, help=argparse.SUPPRESS)
    # Named --worker-*: "--super" must stay an abbreviation of --superuser-roles alone.
    run.add_argument("--worker-supervisor-pid", dest="supervisor_pid", type=int, default=None, help=argparse.SUPPRESS)
    # The supervisor hands the worker its settings on stdin (settings_to_json): a worker of a supervisor from before
    # this flag (a package upgraded in place under it) reads them as that one did.
    run.add_argument("--worker-settings-on-stdin", dest="settings_on_stdin", action="store_true",
                     help=argparse.SUPPRESS)
    _add_setting_flags(run)
    export = sub.add_parser("export", help="export transaction records to Parquet for tc-audit")
    export.add_argument("--config", help=f"TOML file with settings ({', '.join(EXPORT_SETTINGS)}; the others "
                        f"are not read) [env {ENV_PREFIX}CONFIG]")
    _add_setting_flags(export, EXPORT_SETTINGS)
    export.add_argument("--out", required=True, type=Path, help="output directory of the snapshot")
    export.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress line on stderr (default: when stderr is a TTY)")
    upgrade = sub.add_parser("upgrade-store", help="rewrite an embedded store made before 2026-11-30 into the "
                             "current shape of its file (fewer pages written per commit); run it with tc-server "
                             "stopped (README, Upgrades)")
    upgrade.add_argument("--config", help=f"TOML file with settings ({', '.join(UPGRADE_SETTINGS)}; the others are "
                         f"not read) [env {ENV_PREFIX}CONFIG]")
    _add_setting_flags(upgrade, UPGRADE_SETTINGS)
    health = sub.add_parser("healthcheck", help="exit 0 if /healthz answers 200 at the admin address these "
                            f"flags, the environment ({ENV_PREFIX}*) and {ENV_PREFIX}CONFIG give, else 1 (the "
                            "image's HEALTHCHECK; flags of run are not seen)")
    health.add_argument("--config", help=f"TOML file with settings ({', '.join(HEALTHCHECK_SETTINGS)}; the "
                        f"others are not read) [env {ENV_PREFIX}CONFIG]")
    _add_setting_flags(health, HEALTHCHECK_SETTINGS)
    return parser


def _settings(args: argparse.Namespace, only: Sequence[str] | None = None) -> Settings:
    """From the flags in ``args``, the environment and --config: every setting (``run``), or ``only`` those
    a command beside it reads (load_settings)."""
    flags: dict[str, Any] = {name: getattr(args, name, None) for name in (SETTING_NAMES if only is None else only)}
    return load_settings(flags=flags, config_file=args.config, only=only)


def _worker_settings() -> Settings:
    """A worker's settings, from its supervisor (on stdin). Raises ConfigError."""
    if sys.stdin.isatty():  # run by hand: it would wait for ever
        raise ConfigError("--worker-settings-on-stdin: stdin is a terminal; only the supervisor of --workers passes "
                          "this flag")
    return settings_from_json(sys.stdin.buffer.read())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        # argparse's usage error is 2, which Docker reserves: to a HEALTHCHECK any failure must be 1.
        if exc.code == 2 and argv[:1] == ["healthcheck"]:
            raise SystemExit(1) from None
        raise
    if args.command == "run":
        return _run(args, list(argv))
    if args.command == "healthcheck":
        return _healthcheck(args)
    if args.command == "upgrade-store":
        return _upgrade_store(args)
    return _export(args)


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    # Until the event loop's handlers take over (tc_server/app.py serve, tc_server/supervisor.py supervise),
    # SIGTERM (and SIGHUP) ends the start as Ctrl-C does, with a KeyboardInterrupt, rather than killing the
    # process with nothing logged or, as PID 1 (which has no default action for it), being ignored.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    try:
        return _start(args, argv)
    except KeyboardInterrupt:
        structlog.get_logger("tc_server").info("stopped during the start")
        return 0


def _log_format_of(args: argparse.Namespace) -> str:
    """--log-format as far as it can be read when the other settings cannot (a refusal says itself in it)."""
    try:
        return _settings(args, only=("log_format",)).log_format
    except ConfigError:
        return "auto"


def _start(args: argparse.Namespace, argv: list[str]) -> int:
    from tc_server.logs import say_refusal

    try:
        # A worker runs with the settings its supervisor resolved at its own start (handed over on stdin), not
        # with the flags, environment and file read again: restarted after the file was edited for the next
        # start (workers = 4 instead of 2), a worker opened a store of its own, led coordinators another worker
        # leads, and left others without a leader (a review).
        settings = _worker_settings() if args.settings_on_stdin else _settings(args)
    except ConfigError as exc:
        say_refusal(f"tc-server: configuration error: {exc}", _log_format_of(args))
        return 2
    from tc_server.app import StopFailed, serve
    from tc_server.coordinator.errors import ParallelismMismatch
    from tc_server.logs import configure_logging
    from tc_server.store.api import StoreError
    from tc_server.workers import WorkerCountMismatch, WorkerRole, check_worker_count

    configure_logging(settings.log_format, settings.log_level)
    gc.set_threshold(GC_YOUNG_THRESHOLD)  # the older generations keep CPython's defaults
    worker = None
    try:
        if args.worker_index is not None:
            from tc_server.supervisor import follow_supervisor

            follow_supervisor(args.supervisor_pid, settings.log_format)
            worker = WorkerRole.of(settings, args.worker_index)
            settings = worker.settings
            structlog.contextvars.bind_contextvars(worker=worker.index)  # on every log line
        else:
            check_worker_count(settings)
        if worker is None and settings.workers > 1:
            from tc_server.supervisor import supervise

            return int(_run_loop(supervise(settings, argv)))
        _run_loop(serve(settings, worker))
    # Every failure to start is one line naming the setting or the file, and exit code 2 (issue 15), in the
    # log's format (say_refusal).
    except (WorkerCountMismatch, ParallelismMismatch) as exc:
        say_refusal(f"tc-server: refusing to start: {exc}", settings.log_format)
        return 2
    except ConfigError as exc:  # key and certificate files are read at start
        say_refusal(f"tc-server: configuration error: {exc}", settings.log_format)
        return 2
    except StopFailed as exc:  # after serving: not a failure to start (exit 2 says a setting or file is wrong)
        say_refusal(f"tc-server: the stop did not finish: {exc}", settings.log_format)
        return 1
    except (OSError, StoreError) as exc:  # ports, the data directory, the database file, the store
        say_refusal(f"tc-server: cannot start: {exc}", settings.log_format)
        return 2
    return 0


def _run_loop(coro: Any) -> Any:
    """Run ``serve()`` or ``supervise()``. Once it has returned (stopped), a late SIGTERM or SIGINT (a
    pkill repeated, Ctrl-C pressed again as the stop ended) is ignored: it had killed the process by that
    signal after a clean stop, or raised the start's KeyboardInterrupt ("stopped during the start")."""
    import uvloop

    from tc_server.app import STOP_SIGNALS

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            try:
                return runner.run(coro)
            finally:
                for sig in STOP_SIGNALS:  # until the loop closes, which takes its handlers
                    runner.get_loop().add_signal_handler(sig, lambda: None)
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def _healthcheck(args: argparse.Namespace) -> int:
    """Exit code 1 on any failure: Docker reads 1 as unhealthy and reserves 2."""
    try:
        problem = check_health(_settings(args, HEALTHCHECK_SETTINGS))
    except ConfigError as exc:
        problem = f"configuration error: {exc}"
    if problem is not None:
        print(f"tc-server healthcheck: {problem}", file=sys.stderr)
        return 1
    return 0


def _export(args: argparse.Namespace) -> int:
    try:
        settings = _settings(args, EXPORT_SETTINGS)
    except ConfigError as exc:
        print(f"tc-server: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_command_logging()  # stdout is the count's line
    if not STORE_KINDS[settings.store].durable:
        # It lives in the memory of the tc-server that serves it: this process would open an empty one of its
        # own, whose export looks like a clean, empty store.
        print(f"tc-server: cannot export: the {settings.store} store lives inside the tc-server process that "
              "serves it, which another process cannot read: check --store / TC_SERVER_STORE", file=sys.stderr)
        return 2
    try:
        from tc_server.audit.export import export_snapshot
        from tc_server.audit.schema import REJECTS_JSONL
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "pyarrow":
            raise
        # The image and a plain `pip install tc-server` have the runtime dependencies only.
        print("tc-server: export needs pyarrow, which is not installed: install the audit extra "
              "(pip install 'tc-server[audit]') or export from a machine that has it", file=sys.stderr)
        return 2
    from tc_server.app import open_configured_store
    from tc_server.store.api import StoreError
    from tc_server.workers import SINGLE_STORE_FILE, WORKERS_FILE

    if settings.store == "embedded" and not (Path(settings.data_dir) / SINGLE_STORE_FILE).exists() \
            and not (Path(settings.data_dir) / WORKERS_FILE).exists():
        # Opening it would create an empty store, and its export would look like a clean, empty one.
        print(f"tc-server: cannot export: {settings.data_dir} holds no embedded store ({SINGLE_STORE_FILE}): "
              "check --data-dir / TC_SERVER_DATA_DIR", file=sys.stderr)
        return 2
    if settings.store == "embedded" and (Path(settings.data_dir) / WORKERS_FILE).exists():
        # --workers N keeps one store per worker (tc_server/workers.py); opening the directory itself
        # would create an empty store and export nothing.
        print(f"tc-server: {settings.data_dir} holds one store per worker of --workers: export each with "
              f"--data-dir {Path(settings.data_dir) / 'worker-<k>-of-<N>'}", file=sys.stderr)
        return 2

    async def go() -> dict[str, int]:
        # Read-only: the export runs beside the tc-server using the store, and changes nothing in its file.
        store = await open_configured_store(settings, read_only=True)
        try:
            return await export_snapshot(store, args.out, source=settings.store, show_progress=args.progress)
        finally:
            await store.close()

    try:
        # Not _run_loop: that one leaves SIGTERM and SIGINT ignored once the server has stopped, and a
        # caller in the same process (the tests) would pass the ignored SIGTERM on to every process it
        # starts afterwards (a JVM then never heard a stop).
        counts = asyncio.run(go())
    except StoreError as exc:
        print(f"tc-server: cannot export: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # --out not an empty directory (a re-run from cron), or a file: one line, as above
        print(f"tc-server: cannot export: {exc}", file=sys.stderr)
        return 2
    print(f"exported {counts['headers']:,} headers, {counts['ops']:,} ops, {counts['tc_seq']:,} tc-seq records "
          f"to {args.out}")
    if counts["rejects"]:
        print(f"{counts['rejects']:,} malformed records skipped; see {args.out / REJECTS_JSONL}", file=sys.stderr)
    return 0


def _upgrade_store(args: argparse.Namespace) -> int:
    """Each embedded store of --data-dir (the single process's, or every worker's of --workers N) rewritten
    into the current shape of its file, one line per store; 2 with a line naming the problem."""
    from tc_server.store.api import StoreError
    from tc_server.store.embedded import DB_FILENAME, rewrite_records_in_arrival_order
    from tc_server.workers import store_directories

    try:
        settings = _settings(args, UPGRADE_SETTINGS)
    except ConfigError as exc:
        print(f"tc-server: configuration error: {exc}", file=sys.stderr)
        return 2
    configure_command_logging()  # stdout is one line per store
    if settings.store != "embedded":
        print(f"tc-server: upgrade-store rewrites the embedded store's file; --store is {settings.store}, which "
              "needs no upgrade", file=sys.stderr)
        return 2
    data_dir = Path(settings.data_dir)
    stores = [directory for directory in store_directories(data_dir) if (directory / DB_FILENAME).is_file()]
    if not stores:
        print(f"tc-server: {data_dir} holds no embedded store ({DB_FILENAME}, or worker-<k>-of-<N>/{DB_FILENAME}): "
              "check --data-dir / TC_SERVER_DATA_DIR", file=sys.stderr)
        return 2
    for directory in stores:
        started = time.monotonic()
        try:
            upgraded = rewrite_records_in_arrival_order(directory)
        except StoreError as exc:
            print(f"tc-server: cannot upgrade: {exc}", file=sys.stderr)
            return 2
        file = directory / DB_FILENAME
        if upgraded is None:
            print(f"{file}: of the current shape already, unchanged")
            continue
        took = f"{time.monotonic() - started:.1f} s"
        if upgraded.records is None:
            print(f"{file}: of the current shape already; compacted" + (" (failed)" if upgraded.not_compacted else "")
                  + f" in {took}")
        else:
            print(f"{file}: {upgraded.records:,} records rewritten in arrival order in {took}")
        if upgraded.not_compacted is not None:
            # Upgraded all the same: the next stores are upgraded too, and the exit code says success.
            print(f"tc-server: {file} is upgraded but not compacted ({upgraded.not_compacted}): it keeps the earlier "
                  "table's free pages, which later writes reuse; run `tc-server upgrade-store` again with room for a "
                  "copy of the file to compact it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
