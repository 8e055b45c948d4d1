"""Settings: defaults < TOML file < environment < command-line flags, validated once at start.

Every setting has one name used three ways: the flag ``--data-dir``, the environment variable
``TC_SERVER_DATA_DIR`` and the TOML key ``data_dir``. Errors name the setting and where its value came
from, so a typo in a compose file is found at start, not at the first request.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tc_server.store import STORE_KINDS

# How producers and consumers reach the broker a forwarded LOOKUP names (tc_server/server/upstream.py).
LOOKUP_CONNECTION_MODES = ("upstream", "direct", "proxy")

ENV_PREFIX = "TC_SERVER_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names the setting. ``settings``: the ones to
    blame, in the order the message names them, whose sources load_settings adds to the message."""

    def __init__(self, message: str, *settings: str) -> None:
        super().__init__(message)
        self.settings = settings


# A host name (RFC 1123 labels); a host of digits and dots only must be an IPv4 address.
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"  # "_": Compose service names
_HOST_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")
_DOTTED_NUMBERS = re.compile(r"[0-9.]+")


def parse_hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or len(port) > 5 or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    host = host.strip("[]") or "0.0.0.0"
    if ":" in host or _DOTTED_NUMBERS.fullmatch(host):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IP address (in {text!r})") from None
    elif len(host) > 253 or not _HOST_NAME.fullmatch(host):
        raise ValueError(f"{host[:64]!r} is not a host name (in {text!r})")
    return host, int(port)


def _ip_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` (as parse_hostport gives it) as an IP address; None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_wildcard(host: str) -> bool:
    """``host`` (as parse_hostport gives it) is every address of the machine: one to listen on, which a
    client on another host reads as itself."""
    address = _ip_address(host)
    return not host or (address is not None and address.is_unspecified)


def is_ip_address(host: str) -> bool:
    """``host`` (as parse_hostport gives it) is an address, not a name."""
    return _ip_address(host) is not None


def url_host(host: str) -> str:
    """``host`` as a URL or HOST:PORT writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT of a server to connect to or to hand to clients. Stricter than parse_hostport, which also
    reads listening addresses: the host must be given, an IPv6 address in brackets as URLs write it
    (clients cannot split ``fd00::5:6650``), and the port must not be 0 (only a listener can ask for
    "any free port")."""
    host, port = parse_hostport(text)
    bracketed = text.startswith("[")
    if not text.rpartition(":")[0]:
        raise ValueError(f"no host in {text!r}")
    if ":" in host and not bracketed:
        raise ValueError(f"an IPv6 address must be in brackets, as in [{host}]:{port} (got {text!r})")
    if bracketed and ":" not in host:
        raise ValueError(f"brackets are for IPv6 addresses only (got {text!r})")
    if port == 0:
        raise ValueError(f"port 0 in {text!r}: name the port the server listens on")
    return host, port


def canonical_url(url: str) -> str:
    """``url`` in the one form the code compares schemes and keys brokers by: the scheme in lower case, no
    slash after the port (Pulsar's clients take the scheme in any case, and a slash after the port)."""
    scheme, sep, address = url.partition("://")
    return f"{scheme.lower()}{sep}{address.removesuffix('/')}"


def speaks_tls(upstream_urls: Iterable[str]) -> bool:
    """The brokers behind these upstream URLs are reached over TLS: they are ``pulsar+ssl://`` (one scheme for
    all of them, checked at start)."""
    return any(url.startswith("pulsar+ssl://") for url in upstream_urls)


def parse_pulsar_url(url: str, schemes: tuple[str, ...]) -> tuple[str, str, int]:
    """(scheme, host, port) of ``SCHEME://HOST:PORT``, one of ``schemes`` (in any case, with or without a
    slash after the port: canonical_url). Raises ValueError saying what is wrong; a URL with credentials in
    it is not quoted."""
    scheme, sep, address = canonical_url(url).partition("://")
    forms = " or ".join(f"{name}://HOST:PORT" for name in schemes)
    if "@" in (address if sep else url):
        # Nothing reads credentials there (tc-server's own go in broker_client_auth_params), and the URL
        # is logged as it is. Checked first: the other refusals quote the URL.
        raise ValueError(f"user:password@ is not supported in a {scheme if sep else 'pulsar'}:// URL: give the "
                         "credentials in broker_client_auth_params")
    if not sep or scheme not in schemes:
        raise ValueError(f"must be {forms} (got {url!r})")
    if any(char in address for char in "/?#"):
        raise ValueError(f"must be {forms}, without a path, query or fragment (got {url!r})")
    try:
        host, port = parse_address(address)
    except ValueError as exc:
        raise ValueError(f"{exc} (in {url!r})") from None
    return scheme, host, port


def ephemeral_port_range() -> tuple[int, int]:
    """The host's range of local ports for outgoing connections (``ip_local_port_range``). A listening
    port inside it is free only while no outgoing connection holds it: a restart can find it taken."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


# The wire's and the ids' real ranges (issue 15): CONNECTED's max_message_size is an int32 and a frame
# carries the message plus MESSAGE_SIZE_FRAME_PADDING (10,240) bytes under a 32-bit size.
MAX_MESSAGE_SIZE = 2**31 - 1 - 10_240
# A block of ids is reserved per leadership term, out of a Java long's ids: a block this size is
# a few ms of NEW_TXN at any rate measured here, and 2^63 / 10^6 terms never run out.
MAX_ID_BLOCK_SIZE = 1_000_000
# Timeouts in ms are added to wall-clock ms and must stay a Java long; ten years is far beyond any
# transaction (Pulsar's own coordinator sets no maximum).
MAX_TIMEOUT_MS = 10 * 365 * 24 * 3600 * 1000
# Durations in seconds go to asyncio timers; a day bounds every interval a person would choose.
MAX_INTERVAL_S = 24 * 3600.0
# And a tenth of a second bounds them below: a shorter keepalive drops clients whose PONG is a round trip
# late, a shorter request timeout fails requests before a store write (an fsync, an Oxia round trip) can
# finish, and a shorter check loop wakes tens of times a second for nothing.
MIN_INTERVAL_S = 0.1
MAX_RETENTION_S = 10 * 365 * 24 * 3600
# A request in flight holds a task of a few KiB: ten million would be tens of GiB.
MAX_REQUESTS_IN_FLIGHT = 1_000_000
# Each connection is a file descriptor: a million is beyond any descriptor limit set in practice.
MAX_CONNECTIONS = 1_000_000
# Worker processes of one supervisor: far more than the cores of one machine would only add processes.
MAX_WORKERS = 256
# A CONNECT with a large token must still fit.
MIN_FRAME_SIZE = 64 * 1024


@dataclass(frozen=True)
class Settings:
    listen: str = "0.0.0.0:6650"
    admin_listen: str = "0.0.0.0:8080"
    # The URL clients are sent to in LOOKUP answers; derived from --listen when not set.
    advertised_url: str = ""
    store: str = "embedded"
    data_dir: str = "./data"
    coordinators: int = 16
    # Worker processes on this machine (tc_server/supervisor.py, README "Several cores"): 1 is one
    # process as before; N > 1 makes the started process a supervisor of N workers, coordinator i on
    # worker i mod N, each worker on --listen's port + 1 + k besides the shared --listen port.
    workers: int = 1
    default_txn_timeout_ms: int = 60_000
    # A day: Pulsar's coordinator has no maximum, and Flink's Pulsar sink and source ask for 3 h by default
    # (an hour refused them; a review's). The bound is there for a timeout typed wrong: an open txn holds its
    # brokers' readers back (the low watermark) until it ends.
    max_txn_timeout_ms: int = 86_400_000
    gc_retention_s: int = 900
    gc_interval_s: int = 300
    # 0 disables the timeout sweep (used by the audit end-to-end test to leave a txn stuck).
    timeout_sweep: bool = True
    id_block_size: int = 1000
    # Open txns per coordinator before NEW_TXN is refused (Pulsar's maxActiveTransactionsPerCoordinator;
    # 0: no limit). ~550 B each: 16 coordinators x 10,000 stay within the memory limit we ship (issue 15).
    max_active_transactions_per_coordinator: int = 10_000
    # Open txns of one authenticated principal across the coordinators this instance leads before its
    # NEW_TXN is refused (0: no limit; no authentication: no principal, no limit). 5,000: half of one
    # coordinator's default cap, so one role aiming all its txns at one coordinator cannot fill it and
    # refuse every other role there, and still far above what a client keeps open (its txn rate x txn
    # duration: 1,000/s x 5 s).
    max_open_transactions_per_principal: int = 5_000
    # Topics and subscriptions one txn may name (each held in memory until the decision reaches its
    # broker; 0: no limit). A txn on a 100-partition topic acked on a 100-partition subscription
    # names 200.
    max_participants_per_transaction: int = 10_000
    # Decided txns whose participants' brokers have not all acknowledged, across the coordinators this instance
    # leads, before NEW_TXN is refused (0: no limit). Each holds ~6 KB until they have: 10,000 is ~60 MB, and
    # the per-coordinator cap alone allowed 160,000 (a broker refusing every decision, e.g. tc-server's role not
    # authorized there, or a client naming topics no broker knows, grew them at the commit rate).
    max_undelivered_decisions: int = 10_000
    # Participants being told a decision they have not acknowledged yet, across the coordinators this instance
    # leads, before NEW_TXN is refused (0: no limit). Each is a delivery retrying on its own until its broker
    # acknowledges, ~5 KB with its records' bookkeeping (measured: 10,000 took 51 MiB): 20,000 is ~100 MiB. The
    # decisions' bound alone let a broker outage under txns of 200 participants hold 2 million (a review).
    max_undelivered_participants: int = 20_000
    keepalive_s: float = 30.0
    max_message_size: int = 5_242_880
    request_timeout_s: float = 10.0
    # Requests in flight across all connections before the server stops reading (back-pressure).
    # 4096: at the ~2,000 NEW_TXN/s a core serves, a request read behind a full bound waits about 2 s,
    # well inside --request-timeout-s; 65536 made floods time out everyone's requests (issue 15).
    max_requests_in_flight: int = 4096
    # Client connections, overall and per remote address (issue 15): past them a new connection is
    # closed at once. Each holds a descriptor and up to a frame of buffered input.
    max_connections: int = 4096
    max_connections_per_address: int = 1024
    # The largest frame a client may send: TC commands, lookups and CONNECT are small; producers'
    # payloads reach brokers through relay.py, never the frame decoder (issue 15).
    max_frame_size: int = 256 * 1024
    # Input buffered by all connections together (frames not yet complete or not yet served).
    max_buffered_input_bytes: int = 64 * 1024 * 1024
    # The front door (README "One service URL"): brokers that get every request that is not the
    # coordinator's, comma-separated (see upstream_urls); the first that answers is used, the next on failure.
    upstream_url: str = ""
    # How producers and consumers reach the broker a forwarded LOOKUP names: upstream | direct | proxy.
    lookup_connections: str = "upstream"
    # Decisions delivered to today's brokers (docs/participants.md): END_TXN answers once every
    # participant acknowledged, or after this long (below the Java client's 30 s operation timeout).
    participant_wait_s: float = 25.0
    # END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION in flight, overall and per broker (apache/pulsar#23550).
    delivery_max_in_flight: int = 1000
    delivery_max_in_flight_per_broker: int = 100
    cluster: str = "standalone"
    oxia_address: str = "127.0.0.1:6648"
    oxia_namespace: str = "default"
    oxia_session_timeout_ms: int = 15_000
    log_format: str = "auto"
    log_level: str = "info"
    # -- security (docs/security.md); names follow the broker's settings -----------------------
    # Comma-separated: token, tls (or the brokers' provider class names); empty: authentication off.
    authentication_providers: str = ""
    # data:;base64,<key>, file:///path or the key in base64, as brokers read tokenSecretKey/tokenPublicKey.
    token_secret_key: str = field(default="", repr=False)
    token_public_key: str = ""
    token_auth_claim: str = "sub"  # noqa: S105 - claim names, not secrets
    token_audience_claim: str = "aud"  # noqa: S105
    token_audience: str = ""
    superuser_roles: str = ""
    # Roles of Pulsar proxies: a connection proving one acts as CONNECT's original_principal (docs/security.md).
    proxy_roles: str = ""
    authentication_refresh_check_s: float = 60.0
    authenticate_metrics_endpoint: bool = False
    # HOST:PORT of the pulsar+ssl:// listener; empty: none. An empty --listen turns the plain one off.
    tls_listen: str = ""
    advertised_url_tls: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_trust_certs_file: str = ""
    tls_require_trusted_client_cert: bool = False
    tls_cert_refresh_check_s: float = 300.0
    admin_tls: bool = False
    # What tc-server presents to brokers (brokerClientAuthenticationPlugin / ...Parameters).
    broker_client_auth_plugin: str = ""
    broker_client_auth_params: str = field(default="", repr=False)
    broker_client_tls_trust_certs: str = ""
    broker_client_tls_hostname_verification: bool = False
    # What tc-server presents to brokers as a Pulsar proxy, for the forwarded requests of clients that
    # authenticated with a TLS certificate (which tc-server cannot present for them).
    upstream_proxy_auth_plugin: str = ""
    upstream_proxy_auth_params: str = field(default="", repr=False)

    @property
    def upstream_urls(self) -> list[str]:
        """One URL per broker. Both ``pulsar://b1:6650,b2:6650`` (Pulsar's serviceUrl form: a host
        without a scheme takes the one before it) and ``pulsar://b1:6650,pulsar://b2:6650`` are read."""
        urls: list[str] = []
        for item in filter(None, (part.strip() for part in self.upstream_url.split(","))):
            if urls and "://" not in item:
                item = f"{urls[-1].partition('://')[0]}://{item}"
            urls.append(canonical_url(item))
        return urls

    @property
    def upstream_tls(self) -> bool:
        """The brokers are reached over TLS (speaks_tls)."""
        return speaks_tls(self.upstream_urls)

    def validate(self, *, combinations: bool = True) -> Settings:
        """Raises ConfigError naming the setting. ``combinations=False``: each value on its own, none against
        another: load_settings(only=...) reads a few settings and leaves the rest at their defaults, not at
        what `run` was given."""
        def check(ok: bool, name: str, why: str) -> None:
            if not ok:
                raise ConfigError(f"{name}: {why} (got {getattr(self, name)!r})", name)

        for name in ("listen", "admin_listen", "tls_listen"):
            if name in ("listen", "tls_listen") and not getattr(self, name):
                continue  # that listener is off
            try:
                parse_hostport(getattr(self, name))
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}", name) from None
        try:
            parse_address(self.oxia_address)
        except ValueError as exc:
            raise ConfigError(f"oxia_address: {exc}", "oxia_address") from None
        self._validate_advertised("advertised_url", ("pulsar",))
        check(self.store in STORE_KINDS, "store", f"must be one of {', '.join(STORE_KINDS)}")
        # An empty cluster is an absent `cluster` label (dashboards filter on it), an empty data_dir the
        # working directory, an empty namespace not the brokers' one; a blank one (a YAML " ", a template
        # that came out empty) is no better.
        for name in ("cluster", "data_dir", "oxia_namespace"):
            check(bool(getattr(self, name).strip()), name, "must not be empty or blank")
        self._validate_url("upstream_url", self.upstream_urls, ("pulsar", "pulsar+ssl"))
        schemes = {url.split("://", 1)[0] for url in self.upstream_urls}
        # One scheme for all: a client's credentials go to whichever URL answers, and must not cross a
        # plain connection because the TLS one was down.
        check(len(schemes) <= 1, "upstream_url", "must be all pulsar:// or all pulsar+ssl:// URLs")
        check(self.lookup_connections in LOOKUP_CONNECTION_MODES, "lookup_connections",
              f"must be one of {', '.join(LOOKUP_CONNECTION_MODES)}")
        check(1 <= self.coordinators <= 1024, "coordinators", "must be between 1 and 1024")
        check(0 < self.default_txn_timeout_ms <= MAX_TIMEOUT_MS, "default_txn_timeout_ms",
              f"must be between 1 and {MAX_TIMEOUT_MS} (ten years)")
        check(self.max_txn_timeout_ms <= MAX_TIMEOUT_MS, "max_txn_timeout_ms",
              f"must be at most {MAX_TIMEOUT_MS} (ten years)")
        for name in ("keepalive_s", "request_timeout_s", "gc_interval_s", "authentication_refresh_check_s",
                     "tls_cert_refresh_check_s"):
            value = getattr(self, name)
            check(math.isfinite(value) and MIN_INTERVAL_S <= value <= MAX_INTERVAL_S, name,
                  f"must be a number of seconds of at least {MIN_INTERVAL_S} and at most {MAX_INTERVAL_S:.0f}")
        check(self.gc_retention_s <= MAX_RETENTION_S, "gc_retention_s",
              f"must be at most {MAX_RETENTION_S} (ten years)")
        check(self.gc_retention_s >= 0, "gc_retention_s", "must be >= 0")
        check(0 <= self.max_active_transactions_per_coordinator <= MAX_REQUESTS_IN_FLIGHT * 100,
              "max_active_transactions_per_coordinator", "must be between 0 (no limit) and 100000000")
        check(0 <= self.max_open_transactions_per_principal <= MAX_REQUESTS_IN_FLIGHT * 100,
              "max_open_transactions_per_principal", "must be between 0 (no limit) and 100000000")
        check(0 <= self.max_participants_per_transaction <= MAX_REQUESTS_IN_FLIGHT * 100,
              "max_participants_per_transaction", "must be between 0 (no limit) and 100000000")
        check(0 <= self.max_undelivered_decisions <= MAX_REQUESTS_IN_FLIGHT * 100,
              "max_undelivered_decisions", "must be between 0 (no limit) and 100000000")
        check(0 <= self.max_undelivered_participants <= MAX_REQUESTS_IN_FLIGHT * 100,
              "max_undelivered_participants", "must be between 0 (no limit) and 100000000")
        check(1 <= self.id_block_size <= MAX_ID_BLOCK_SIZE, "id_block_size",
              f"must be between 1 and {MAX_ID_BLOCK_SIZE}")
        check(0 < self.max_message_size <= MAX_MESSAGE_SIZE, "max_message_size",
              f"must be between 1 and {MAX_MESSAGE_SIZE} (a 32-bit field, and a frame adds 10240 bytes)")
        check(1 <= self.max_requests_in_flight <= MAX_REQUESTS_IN_FLIGHT, "max_requests_in_flight",
              f"must be between 1 and {MAX_REQUESTS_IN_FLIGHT}")
        check(1 <= self.max_connections <= MAX_CONNECTIONS, "max_connections",
              f"must be between 1 and {MAX_CONNECTIONS}")
        check(MIN_FRAME_SIZE <= self.max_frame_size <= MAX_MESSAGE_SIZE + 10_240, "max_frame_size",
              f"must be between {MIN_FRAME_SIZE} and {MAX_MESSAGE_SIZE + 10_240} (a 32-bit frame size)")
        check(0 <= self.participant_wait_s <= 86_400, "participant_wait_s", "must be between 0 and 86400 s")
        check(1 <= self.delivery_max_in_flight <= 1_000_000, "delivery_max_in_flight", "must be between 1 and 1000000")
        check(1 <= self.delivery_max_in_flight_per_broker <= 1_000_000, "delivery_max_in_flight_per_broker",
              "must be between 1 and 1000000")
        check(2_000 <= self.oxia_session_timeout_ms <= 300_000, "oxia_session_timeout_ms",
              "must be between 2000 and 300000 (Oxia's limits)")
        check(self.log_format in ("auto", "json", "console"), "log_format", "must be auto, json or console")
        check(self.log_level in ("debug", "info", "warning", "error"), "log_level",
              "must be debug, info, warning or error")
        if not combinations:
            return self
        check(self.max_txn_timeout_ms >= self.default_txn_timeout_ms, "max_txn_timeout_ms",
              "must be at least default_txn_timeout_ms")
        check(1 <= self.max_connections_per_address <= self.max_connections, "max_connections_per_address",
              "must be between 1 and max_connections")
        check(self.max_frame_size <= self.max_buffered_input_bytes <= 2**40, "max_buffered_input_bytes",
              "must be at least max_frame_size (and at most 1 TiB)")
        self._validate_workers(check)
        self._validate_security()
        return self

    @staticmethod
    def _validate_url(name: str, urls: list[str], schemes: tuple[str, ...]) -> None:
        for url in urls:
            try:
                parse_pulsar_url(url, schemes)
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}", name) from None

    def _validate_advertised(self, name: str, schemes: tuple[str, ...]) -> None:
        """An advertised URL, when set: LOOKUP hands it to clients, which must be able to connect to it."""
        url = getattr(self, name)
        if not url:
            return
        self._validate_url(name, [url], schemes)
        # Copied from --listen: a client on another host reads 0.0.0.0 or [::] as itself.
        if is_wildcard(parse_pulsar_url(url, schemes)[1]):
            raise ConfigError(f"{name}: a wildcard address is for listening, clients cannot connect to it: "
                              f"advertise an address they reach (got {url!r})", name)

    def _validate_workers(self, check: Callable[[bool, str, str], None]) -> None:
        """--workers N > 1 derives each worker's ports from --listen, --tls-listen and --admin-listen (port +
        1 + k), so those must be fixed ports (README, "Several cores")."""
        check(1 <= self.workers <= MAX_WORKERS, "workers", f"must be between 1 and {MAX_WORKERS}")
        if self.workers == 1:
            return
        check(self.workers <= self.coordinators, "workers", "must be at most coordinators (each worker leads "
              "coordinators i with i mod workers = its index)")
        # --listen may be empty (the plain listener off) only beside --tls-listen; without either, the
        # message names --listen, the one most starts set.
        derived = ["admin_listen"]
        if self.listen or not self.tls_listen:
            derived.append("listen")
        if self.tls_listen:
            derived.append("tls_listen")
        for name in derived:
            port = parse_hostport(getattr(self, name))[1] if getattr(self, name) else 0
            check(port != 0, name, "must be a fixed port with --workers above 1 (worker k listens on its port + 1 + k)")
            check(port + self.workers <= 65535, name, f"its port + {self.workers} (the workers' ports) must be at "
                  "most 65535")
        # Ports 6650 (--listen) and 6651 (--tls-listen), as brokers use them, would collide: worker 0 takes
        # 6651 for --listen. Refused here rather than by a worker's bind, whose restarts would hide it.
        n = self.workers
        for i, first in enumerate(derived):
            for second in derived[i + 1:]:
                host_a, port_a = parse_hostport(getattr(self, first))
                host_b, port_b = parse_hostport(getattr(self, second))
                # Apart only as two different addresses: a name (localhost) may be the other's address.
                same_host = host_a == host_b or is_wildcard(host_a) or is_wildcard(host_b) or not (
                    is_ip_address(host_a) and is_ip_address(host_b))
                check(not (same_host and abs(port_a - port_b) <= n), second,
                      f"its ports {port_b}-{port_b + n} overlap {first}'s {port_a}-{port_a + n} (with --workers "
                      f"{n} each takes its port + 1 to + {n}): set them more than {n} apart")

    def _validate_security(self) -> None:
        """Shapes only: key files and certificates are read at start (tc_server/auth), and secret values
        are never quoted in a message."""
        from tc_server.auth.broker_client import broker_client_plugin_kind
        from tc_server.auth.service import provider_methods

        try:
            methods = provider_methods(self.authentication_providers)
        except ValueError as exc:
            raise ConfigError(f"authentication_providers: {exc}", "authentication_providers") from None
        if "token" in methods and not (self.token_secret_key or self.token_public_key):
            raise ConfigError("authentication_providers: token needs token_secret_key or token_public_key",
                              "authentication_providers")
        if self.token_secret_key and self.token_public_key:
            raise ConfigError("token_secret_key and token_public_key are both set: give one", "token_secret_key",
                              "token_public_key")
        for name in ("token_auth_claim", "token_audience_claim"):
            if not getattr(self, name):
                raise ConfigError(f"{name}: must not be empty", name)
        if "tls" in methods and not (self.tls_listen or self.admin_tls):
            raise ConfigError("authentication_providers: tls needs a TLS port (tls_listen or admin_tls)",
                              "authentication_providers")
        if "tls" in methods and not self.tls_trust_certs_file:
            # Without the CA, the server asks no client for a certificate: the method could prove nobody.
            raise ConfigError("authentication_providers: tls needs tls_trust_certs_file, the CA that signs the "
                              "clients' certificates", "authentication_providers")
        if not self.listen and not self.tls_listen:
            raise ConfigError("listen: empty (plain listener off) needs tls_listen", "listen")
        tls_port = "tls_listen" if self.tls_listen else "admin_tls" if self.admin_tls else ""
        if tls_port and not (self.tls_cert_file and self.tls_key_file):
            raise ConfigError(f"{tls_port}: needs tls_cert_file and tls_key_file", tls_port)
        if self.tls_require_trusted_client_cert and not self.tls_trust_certs_file:
            raise ConfigError("tls_require_trusted_client_cert: needs tls_trust_certs_file",
                              "tls_require_trusted_client_cert")
        for name in ("tls_cert_file", "tls_key_file", "tls_trust_certs_file", "tls_require_trusted_client_cert"):
            # Only the TLS ports read them: without one, the mTLS asked for would silently not be in force.
            if getattr(self, name) and not tls_port:
                raise ConfigError(f"{name}: does nothing without a TLS port: set tls_listen or admin_tls", name)
        self._validate_advertised("advertised_url_tls", ("pulsar+ssl",))
        if self.advertised_url_tls and not self.tls_listen:
            raise ConfigError("advertised_url_tls: needs tls_listen", "advertised_url_tls")
        kinds: dict[str, str] = {}
        for prefix in ("broker_client_auth", "upstream_proxy_auth"):
            plugin, params = f"{prefix}_plugin", f"{prefix}_params"
            kinds[prefix] = broker_client_plugin_kind(getattr(self, plugin), plugin)  # an unknown plugin: ConfigError
            if getattr(self, params).strip() and kinds[prefix] == "none":
                # Without a plugin they are never read, and the brokers are asked with no credentials at all.
                raise ConfigError(f"{params}: needs {plugin} (token or tls), which says how to present them", params)
        if self.upstream_proxy_auth_plugin.strip() and not self.upstream_urls:
            raise ConfigError("upstream_proxy_auth_plugin: does nothing without upstream_url (nothing is forwarded)",
                              "upstream_proxy_auth_plugin")
        if kinds["upstream_proxy_auth"] == "tls" and self.upstream_urls and not self.upstream_tls:
            # Its certificate goes in a TLS handshake, and a pulsar:// upstream has none: every forwarded
            # request of a certificate client would be refused.
            raise ConfigError("upstream_proxy_auth_plugin: the TLS plugin needs a pulsar+ssl:// upstream_url (its "
                              "certificate is presented in the TLS handshake)", "upstream_proxy_auth_plugin")


SETTING_NAMES = tuple(f.name for f in fields(Settings))
# The settings that hold a secret (kept out of the settings' repr): never quoted in an error either.
SECRET_SETTINGS = frozenset(f.name for f in fields(Settings) if not f.repr)
ENV_NAMES = {ENV_PREFIX + name.upper(): name for name in SETTING_NAMES}
# TC_SERVER_* variables that are not settings, yet not typos: the configuration file, and the test
# suite's knobs (tests/store/oxia_backends.py, tests/v5), which every server a test starts inherits.
OTHER_ENV_NAMES = frozenset({CONFIG_ENV, "TC_SERVER_TEST_OXIA_BIN", "TC_SERVER_JAVA21", "TC_SERVER_V5_OXIA_ADDRESS"})
# Kubernetes service links: the kubelet gives every pod of a namespace with a Service named tc-server
# (both manifests in deploy/kubernetes define one) TC_SERVER_SERVICE_HOST, TC_SERVER_PORT_6650_TCP, ...
_SERVICE_LINK = re.compile(
    ENV_PREFIX + r"(\w+_)?(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT_\d+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)")
# ... and TC_SERVER_PORT=tcp://IP:PORT, whose name alone could be a misspelled setting, so its value decides.
_SERVICE_LINK_URL = (re.compile(ENV_PREFIX + r"(\w+_)?PORT"), re.compile(r"(tcp|udp|sctp)://\S+"))
# Docker's legacy links (--link tc-server): TC_SERVER_NAME=/client/tc-server and TC_SERVER_ENV_<its env>.
_DOCKER_LINK = (re.compile(ENV_PREFIX + r"(\w+_)?ENV_\w+"), re.compile(ENV_PREFIX + r"(\w+_)?NAME"))


def settings_to_json(settings: Settings) -> bytes:
    """Every setting, resolved, as JSON: what a --workers supervisor hands each worker it starts (on its stdin)."""
    return json.dumps({name: getattr(settings, name) for name in SETTING_NAMES}).encode()


def settings_from_json(data: bytes) -> Settings:
    """The settings :func:`settings_to_json` wrote. Raises ConfigError when ``data`` is not such a text."""
    problem = "not a JSON object"
    try:
        values = json.loads(data)
        if isinstance(values, dict):
            return Settings(**values)
    except (ValueError, TypeError) as exc:
        problem = str(exc)
    raise ConfigError(f"the settings handed over by the supervisor cannot be read: {problem}")


def _is_service_link(env_name: str, value: str) -> bool:
    """A variable Kubernetes or Docker sets for a Service or link named tc-server, not a setting."""
    if _SERVICE_LINK.fullmatch(env_name) or _DOCKER_LINK[0].fullmatch(env_name):
        return True
    if _DOCKER_LINK[1].fullmatch(env_name) and value.startswith("/"):
        return True
    name_form, value_form = _SERVICE_LINK_URL
    return bool(name_form.fullmatch(env_name) and value_form.fullmatch(value))


def _unknown_setting(where: str, name: str) -> ConfigError:
    """A name that is no setting, with the closest one: a typo must stop the start, not be ignored.
    ``name`` is a TOML key or an environment variable; the closest setting is given in the same form."""
    env = name.startswith(ENV_PREFIX)
    bare = (name[len(ENV_PREFIX):] if env else name).lower().replace("-", "_")
    closest = difflib.get_close_matches(bare, [*SETTING_NAMES, *(["config"] if env else [])], n=1)
    if closest:
        hint = f"did you mean {ENV_PREFIX + closest[0].upper() if env else closest[0]}?"
    else:
        hint = "tc-server run --help lists the settings"
    return ConfigError(f"{where}: unknown setting {name if env else repr(name)} ({hint})")


def _coerce(name: str, raw: Any, source: str) -> Any:
    kind = type(getattr(Settings(), name))
    if name in SECRET_SETTINGS:
        # Named by its type, never quoted: a TOML inline table (Pulsar's JSON parameters' shape) held the
        # token, and the refusal went to stderr and the container log with it.
        raw_shown = f"a {type(raw).__name__}"
    else:
        raw_shown = repr(raw)
    converters: dict[type, Callable[[Any], Any]] = {int: int, float: float, str: str, bool: _to_bool}
    if kind in (int, float) and isinstance(raw, bool):
        raise ConfigError(f"{name} (from {source}): expected a number, got the boolean {raw_shown}")
    # TOML has types of its own, which str() and int() would mangle silently: superuser_roles = ["a", "b"]
    # read as the text "['a', 'b']" (no role ever matched), workers = 2.9 as 2.
    if kind is int and isinstance(raw, float) and not raw.is_integer():
        raise ConfigError(f"{name} (from {source}): expected a whole number, got {raw_shown}")
    if kind is str and isinstance(raw, list):
        if not all(isinstance(item, str) for item in raw):
            raise ConfigError(f"{name} (from {source}): a list must hold strings only, got {raw_shown}")
        raw = ",".join(raw)  # the comma-separated settings (superuser_roles, upstream_url, ...)
    elif kind is str and isinstance(raw, dict | bool | float):
        raise ConfigError(f"{name} (from {source}): expected a string, got {raw_shown}")
    try:
        return converters[kind](raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{name} (from {source}): cannot read {raw_shown} as {kind.__name__}: {exc}") from None


def _to_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def load_settings(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: str | None = None,
    only: Collection[str] | None = None,
) -> Settings:
    """Merge the sources and validate. Raises :class:`ConfigError` naming the bad setting and where its value
    came from.

    ``only``: the few settings a command beside ``run`` reads (healthcheck, export), from the same
    environment and file. The others keep their defaults and are neither read nor checked, nor are
    unknown TC_SERVER_* variables refused: ``run`` may have got the rest as flags, which that command does
    not see (a variable ``--broker-client-auth-params env:NAME`` names, a key file beside
    TC_SERVER_AUTHENTICATION_PROVIDERS)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def read(name: str, raw: Any, source: str) -> None:
        if only is None or name in only:
            values[name] = _coerce(name, raw, source)
            sources[name] = source

    path = config_file or environ.get(CONFIG_ENV)
    if path:
        try:
            # TOML is UTF-8, whatever the locale; "-sig": Windows editors (Notepad, PowerShell's Out-File)
            # begin it with a byte order mark, which tomllib reads as an invalid statement.
            doc = tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path}: not UTF-8 (byte {exc.start}), as TOML must be") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        except RecursionError:  # tomllib on arrays or tables nested thousands deep (a review's)
            raise ConfigError(f"config file {path}: nested too deeply to be a tc-server configuration") from None
        for key, raw in doc.items():
            name = key.replace("-", "_")
            if name not in SETTING_NAMES:  # the file is run's too, which refuses it: a typo wherever it is read
                raise _unknown_setting(f"config file {path}", key)
            read(name, raw, f"config file {path}")
    for env_name, raw in environ.items():
        if env_name in ENV_NAMES:
            read(ENV_NAMES[env_name], raw, f"environment {env_name}")
    if only is None:
        # The variable --broker-client-auth-params env:NAME reads the broker token from may carry the prefix
        # too (docs/security.md): it is named by a setting, so it is no typo.
        token_variables = set()
        for setting in ("broker_client_auth_params", "upstream_proxy_auth_params"):
            params = str((flags or {}).get(setting) or values.get(setting, "")).strip()
            if params.startswith("env:"):
                token_variables.add(params[len("env:"):])
        for env_name, raw in environ.items():
            if env_name.startswith(ENV_PREFIX) and env_name not in ENV_NAMES and env_name not in OTHER_ENV_NAMES \
                    and env_name not in token_variables and not _is_service_link(env_name, raw):
                raise _unknown_setting("environment", env_name)
    for key, raw in (flags or {}).items():
        if raw is not None:
            read(key, raw, f"--{key.replace('_', '-')}")
    try:
        return replace(Settings(), **values).validate(combinations=only is None)
    except ConfigError as exc:
        # Named by the setting alone, the value could be in the file, the environment (a ConfigMap) or a
        # flag (the CMD): where it came from, as _coerce says it, at the end so the message still begins
        # with the setting.
        given = [sources[name] for name in exc.settings if name in sources]
        if not given:
            raise
        raise ConfigError(f"{exc} (from {' and '.join(given)})", *exc.settings) from None
