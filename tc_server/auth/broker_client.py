"""The credentials tc-server presents when it connects to a broker, configured as a broker configures
its own internal client: ``--broker-client-auth-plugin`` and ``--broker-client-auth-params`` (brokers'
``brokerClientAuthenticationPlugin`` / ``brokerClientAuthenticationParameters``) and
``--broker-client-tls-trust-certs`` (``brokerClientTrustCertsFilePath``) for ``pulsar+ssl://`` brokers.

- ``org.apache.pulsar.client.impl.auth.AuthenticationToken`` (or ``token``): params ``token:<jwt>``,
  ``file:///path`` (read again for every CONNECT and refresh, so a rotated token file is picked up, as
  the Java client does), ``env:NAME``, or the token itself.
- ``org.apache.pulsar.client.impl.auth.AuthenticationTls`` (or ``tls``): params
  ``tlsCertFile:/path,tlsKeyFile:/path`` or the JSON object with those keys; the certificate is
  presented in the TLS handshake and CONNECT names the method ``tls`` with empty data.
- empty: no credentials (method ``none``).
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from tc_server.auth.keys import file_url_path, read_secret_text
from tc_server.client.connection import ClientAuth
from tc_server.config import ConfigError

log = structlog.get_logger("tc_server.broker_client")

if TYPE_CHECKING:
    from tc_server.config import Settings

TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"  # noqa: S105 - a class name
TLS_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationTls"
# Pulsar's own default for brokerClientAuthenticationPlugin (ServiceConfiguration): no credentials. A copied
# broker.conf or chart values carry it.
DISABLED_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationDisabled"
PLUGIN_NAMES = {TOKEN_PLUGIN: "token", "token": "token", TLS_PLUGIN: "tls", "tls": "tls", DISABLED_PLUGIN: "none"}


@dataclass(frozen=True)
class BrokerClientCredentials:
    """What a client CONNECT to a broker needs: ``method`` is ``auth_method_name``, :meth:`auth_data`
    the ``auth_data`` bytes (also the answer to an AUTH_CHALLENGE), and ``ssl_context`` the context for
    ``pulsar+ssl://`` brokers (None: use the system's default CAs)."""

    method: str = "none"
    _data: Callable[[], bytes] = field(default=lambda: b"", repr=False)
    ssl_context: ssl.SSLContext | None = None

    def auth_data(self) -> bytes:
        """Fresh credentials (a ``file:`` token is read again). Raises ConfigError if it cannot be read."""
        return self._data()

    def client_auth(self) -> ClientAuth:
        """CONNECT's credentials, read now: ``connect_command(credentials.client_auth())``. Set the
        connection's ``auth_data_source`` to :meth:`auth_data` so that a refresh challenge is answered
        with a freshly read token too."""
        return ClientAuth(self.method, self.auth_data())


def broker_client_plugin_kind(plugin: str, setting: str = "broker_client_auth_plugin") -> str:
    """``token``, ``tls`` or ``none`` (empty) for --broker-client-auth-plugin (or ``setting``, the other plugin
    setting); raises ConfigError for another plugin (checked at start by Settings.validate)."""
    plugin = plugin.strip()
    if plugin and plugin not in PLUGIN_NAMES:
        raise ConfigError(f"{setting}: unknown plugin {plugin!r} (known: {TOKEN_PLUGIN}, {TLS_PLUGIN}, "
                          f"{DISABLED_PLUGIN})", setting)
    return PLUGIN_NAMES.get(plugin, "none")


def broker_client_credentials(settings: Settings) -> BrokerClientCredentials:
    """tc-server's own (--broker-client-auth-plugin / -params): participant delivery. Raises ConfigError naming
    the setting that is wrong (never quoting a secret)."""
    return _credentials(settings, "broker_client_auth")


def upstream_proxy_credentials(settings: Settings) -> BrokerClientCredentials | None:
    """What tc-server presents as a Pulsar proxy (--upstream-proxy-auth-plugin / -params) when it forwards the
    requests of a client that authenticated with a TLS certificate, naming that client in CONNECT's
    original_principal; None when not set. Raises ConfigError as broker_client_credentials does."""
    if broker_client_plugin_kind(settings.upstream_proxy_auth_plugin, "upstream_proxy_auth_plugin") == "none":
        return None
    return _credentials(settings, "upstream_proxy_auth")


def _credentials(settings: Settings, prefix: str) -> BrokerClientCredentials:
    """The credentials of the settings ``<prefix>_plugin`` and ``<prefix>_params``."""
    setting = f"{prefix}_params"
    params = str(getattr(settings, setting)).strip()
    kind = broker_client_plugin_kind(getattr(settings, f"{prefix}_plugin"), f"{prefix}_plugin")
    context = _client_context(settings) if settings.broker_client_tls_trust_certs or kind == "tls" else None
    if kind == "token":
        read = _token_reader(params, setting)
        read()  # fail at start, not at the first CONNECT
        return BrokerClientCredentials("token", read, context)
    if kind == "tls":
        assert context is not None
        cert_file, key_file = _tls_params(params, setting)
        try:
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{setting}: cannot load the client certificate {cert_file} "
                              f"and key {key_file}: {getattr(exc, 'reason', None) or exc.strerror}") from None
        return BrokerClientCredentials("tls", lambda: b"", context)
    return BrokerClientCredentials("none", lambda: b"", context)


def _token_reader(params: str, setting: str) -> Callable[[], bytes]:
    if not params:
        raise ConfigError(f"{setting}: the token plugin needs token:<jwt> or file:///path")
    if params.startswith("token:"):
        value = params[len("token:"):].encode()
        return lambda: value
    if params.startswith("file:"):
        return lambda: read_secret_text(setting, params).encode()
    if params.startswith("env:"):
        name = params[len("env:"):]

        def from_env() -> bytes:
            if name not in os.environ:
                raise ConfigError(f"{setting}: environment variable {name} is not set")
            return os.environ[name].strip().encode()
        return from_env
    if params.lstrip().startswith("{"):
        # Pulsar's AuthenticationToken takes a JSON object {"token": "<jwt>"} too (a broker.conf's
        # brokerClientAuthenticationParameters often has this form); sent as is, brokers refused it and no
        # decision was ever delivered.
        try:
            doc = json.loads(params)
        except ValueError:
            doc = None
        if doc is not None:
            if not isinstance(doc, dict) or not isinstance(doc.get("token"), str):
                raise ConfigError(f'{setting}: the token plugin\'s JSON form is {{"token": "<jwt>"}}')
            token = doc["token"].encode()
            return lambda: token
    value = params.encode()
    return lambda: value


def _tls_params(params: str, setting: str) -> tuple[str, str]:
    values: dict[str, str] = {}
    if params.startswith("{"):
        try:
            doc = json.loads(params)
        except ValueError:
            raise ConfigError(f"{setting}: not valid JSON") from None
        if isinstance(doc, dict):
            values = {str(k): str(v) for k, v in doc.items()}
    else:
        for item in params.split(","):
            name, sep, value = item.partition(":")
            if sep:
                values[name.strip()] = value.strip()
    cert_file, key_file = values.get("tlsCertFile"), values.get("tlsKeyFile")
    if not cert_file or not key_file:
        raise ConfigError(f"{setting}: the TLS plugin needs tlsCertFile:/path,tlsKeyFile:/path")
    return _path(setting, cert_file), _path(setting, key_file)


def _path(setting: str, value: str) -> str:
    return str(file_url_path(setting, value)) if value.startswith("file:") else value


def forwarding_tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of the connections tc-server opens to brokers on a client's behalf (forwarded
    lookups and requests, relayed connections) when the upstream speaks TLS (a ``pulsar+ssl://``
    upstream URL), else None. The broker client's CA and host-name settings, but never tc-server's own
    client certificate: a client authenticates to the broker as itself, not as tc-server."""
    if not settings.upstream_tls:
        return None
    return _client_context(settings)


def peer_tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of relays for clients that came over TLS: to peer tc-server instances (the v5 SDK
    reaches a coordinator led elsewhere through the instance it is connected to), and to a broker's
    ``pulsar+ssl://`` URL behind a plain upstream (with a TLS upstream, forwarding_tls_context's). None
    without a TLS listener. The peers' certificates are the cluster's, checked as brokers' are
    (--broker-client-tls-trust-certs); never tc-server's own client certificate."""
    return _client_context(settings) if settings.tls_listen else None


def _client_context(settings: Settings) -> ssl.SSLContext:
    trust = settings.broker_client_tls_trust_certs
    try:
        context = ssl.create_default_context(cafile=trust or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"broker_client_tls_trust_certs ({trust}): cannot load the CA certificates: "
                          f"{getattr(exc, 'reason', None) or exc.strerror}") from None
    # Brokers' own client does not check host names by default (tlsHostnameVerificationEnabled=false):
    # advertised addresses are often pod IPs that no certificate names.
    context.check_hostname = settings.broker_client_tls_hostname_verification
    if not trust and not context.check_hostname:
        # A broker does the same, but tc-server carries more credentials than a broker: every forwarded
        # request carries its client's, and delivery tc-server's superuser token.
        log.warning("TLS to the brokers accepts any certificate a public CA issued, for any host: set "
                    "--broker-client-tls-trust-certs to the brokers' CA or turn on "
                    "--broker-client-tls-hostname-verification (clients' credentials and tc-server's own go "
                    "over these connections)")
    return context
