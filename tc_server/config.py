"""Settings: defaults < TOML file < environment < command-line flags, validated once at start.

Every setting has one name used three ways: the flag ``--data-dir``, the environment variable
``TC_SERVER_DATA_DIR`` and the TOML key ``data_dir``. Errors name the setting and where its value came
from, so a typo in a compose file is found at start, not at the first request.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ENV_PREFIX = "TC_SERVER_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names the setting."""


def parse_hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass(frozen=True)
class Settings:
    listen: str = "0.0.0.0:6650"
    admin_listen: str = "0.0.0.0:8080"
    # The URL clients are sent to in LOOKUP answers; derived from --listen when not set.
    advertised_url: str = ""
    store: str = "embedded"
    data_dir: str = "./data"
    coordinators: int = 16
    default_txn_timeout_ms: int = 60_000
    max_txn_timeout_ms: int = 3_600_000
    gc_retention_s: int = 900
    gc_interval_s: int = 300
    # 0 disables the timeout sweep (used by the audit end-to-end test to leave a txn stuck).
    timeout_sweep: bool = True
    id_block_size: int = 1000
    keepalive_s: float = 30.0
    max_message_size: int = 5_242_880
    request_timeout_s: float = 10.0
    # Requests in flight across all connections before the server stops reading (back-pressure).
    max_requests_in_flight: int = 65_536
    cluster: str = "standalone"
    oxia_address: str = "127.0.0.1:6648"
    oxia_namespace: str = "default"
    oxia_session_timeout_ms: int = 15_000
    log_format: str = "auto"
    log_level: str = "info"

    def validate(self) -> Settings:
        def check(ok: bool, name: str, why: str) -> None:
            if not ok:
                raise ConfigError(f"{name}: {why} (got {getattr(self, name)!r})")

        for name in ("listen", "admin_listen", "oxia_address"):
            try:
                parse_hostport(getattr(self, name))
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}") from None
        if self.advertised_url:
            parts = urlsplit(self.advertised_url)
            check(parts.scheme == "pulsar" and bool(parts.hostname) and parts.port is not None,
                  "advertised_url", "must be pulsar://HOST:PORT")
        check(self.store in ("memory", "embedded", "oxia"), "store", "must be memory, embedded or oxia")
        check(1 <= self.coordinators <= 1024, "coordinators", "must be between 1 and 1024")
        check(self.default_txn_timeout_ms > 0, "default_txn_timeout_ms", "must be positive")
        check(self.max_txn_timeout_ms >= self.default_txn_timeout_ms, "max_txn_timeout_ms",
              "must be at least default_txn_timeout_ms")
        check(self.gc_retention_s >= 0, "gc_retention_s", "must be >= 0")
        check(self.gc_interval_s > 0, "gc_interval_s", "must be positive")
        check(self.id_block_size >= 1, "id_block_size", "must be >= 1")
        check(self.keepalive_s > 0, "keepalive_s", "must be positive")
        check(self.max_message_size > 0, "max_message_size", "must be positive")
        check(self.request_timeout_s > 0, "request_timeout_s", "must be positive")
        check(self.max_requests_in_flight >= 1, "max_requests_in_flight", "must be >= 1")
        check(2_000 <= self.oxia_session_timeout_ms <= 300_000, "oxia_session_timeout_ms",
              "must be between 2000 and 300000 (Oxia's limits)")
        check(self.log_format in ("auto", "json", "console"), "log_format", "must be auto, json or console")
        check(self.log_level in ("debug", "info", "warning", "error"), "log_level",
              "must be debug, info, warning or error")
        return self


SETTING_NAMES = tuple(f.name for f in fields(Settings))
ENV_NAMES = {ENV_PREFIX + name.upper(): name for name in SETTING_NAMES}


def _coerce(name: str, raw: Any, source: str) -> Any:
    kind = type(getattr(Settings(), name))
    converters: dict[type, Callable[[Any], Any]] = {int: int, float: float, str: str, bool: _to_bool}
    if kind in (int, float) and isinstance(raw, bool):
        raise ConfigError(f"{name} (from {source}): expected a number, got the boolean {raw!r}")
    try:
        return converters[kind](raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{name} (from {source}): cannot read {raw!r} as {kind.__name__}: {exc}") from None


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
) -> Settings:
    """Merge the sources and validate. Raises :class:`ConfigError` naming the bad setting."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    path = config_file or environ.get(CONFIG_ENV)
    if path:
        try:
            doc = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        for key, raw in doc.items():
            name = key.replace("-", "_")
            if name not in SETTING_NAMES:
                raise ConfigError(f"config file {path}: unknown setting {key!r}")
            values[name] = _coerce(name, raw, f"config file {path}")
    for env_name, name in ENV_NAMES.items():
        if env_name in environ:
            values[name] = _coerce(name, environ[env_name], f"environment {env_name}")
    for key, raw in (flags or {}).items():
        if raw is not None:
            values[key] = _coerce(key, raw, f"--{key.replace('_', '-')}")
    return replace(Settings(), **values).validate()
