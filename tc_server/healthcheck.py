"""``tc-server healthcheck``: GET /healthz of the tc-server these settings describe, for the image's
HEALTHCHECK (exit code 0: healthy, 1: not).

It reads the settings it needs (HEALTHCHECK_SETTINGS) as ``run`` does, from the environment and the file
``TC_SERVER_CONFIG`` names, and takes them as flags too, so the check follows --admin-listen (a wildcard
address is asked on the loopback address of its family) and --admin-tls. Flags given after ``run`` are
not seen: a container that sets these by flags gives them to ``tc-server healthcheck`` too. The other
settings are neither read nor checked (config.load_settings ``only``): ``run`` may have got them as flags.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

from tc_server.config import ConfigError, Settings, parse_hostport, url_host

# What this check reads: the admin address, and whether and how it speaks TLS (admin_probe_tls_context).
HEALTHCHECK_SETTINGS = ("admin_listen", "admin_tls", "tls_cert_file", "tls_key_file", "tls_require_trusted_client_cert")

# Docker's HEALTHCHECK --timeout in the Dockerfile is 3 s; the interpreter's start takes part of it.
HEALTH_TIMEOUT_S = 2.0

# An admin port on [::] is asked at [::1], the loopback of its own family (it answers at 127.0.0.1 too:
# tc_server/server/sockets.py binds "::" for both families).
_LOOPBACK_OF_WILDCARD = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


def admin_base_url(settings: Settings, port_offset: int = 0) -> str:
    """``http(s)://HOST:PORT`` of the admin port these settings describe, as a process on this host asks it
    (a wildcard address as the loopback address of its family); ``port_offset``: a worker's admin port
    (tc_server/workers.py, port + 1 + k)."""
    host, port = parse_hostport(settings.admin_listen)
    host = url_host(_LOOPBACK_OF_WILDCARD.get(host, host))
    return f"{'https' if settings.admin_tls else 'http'}://{host}:{port + port_offset}"


def health_url(settings: Settings) -> str:
    return admin_base_url(settings) + "/healthz"


def admin_probe_tls_context(settings: Settings) -> ssl.SSLContext | None:
    """How this host's own tc-server admin port is asked for its probes (this command, and a supervisor
    asking its workers' /readyz): None over HTTP."""
    if not settings.admin_tls:
        return None
    # The certificate names the service, not the loopback address asked here, and nothing but this
    # server's liveness and readiness is read (no credentials are sent): its certificate is not verified.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if settings.tls_require_trusted_client_cert:
        # The admin port then refuses a handshake without a trusted client certificate: the server's own
        # is presented, so it must be one the trusted CAs accept as a client certificate. `run` refuses
        # the setting without them; the healthcheck may have been given it alone.
        if not (settings.tls_cert_file and settings.tls_key_file):
            raise ConfigError("tls_require_trusted_client_cert: the admin port asks for a client certificate: "
                              "give tls_cert_file and tls_key_file (the server's own)",
                              "tls_require_trusted_client_cert")
        context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    return context


def check_health(settings: Settings, timeout_s: float = HEALTH_TIMEOUT_S) -> str | None:
    """None when /healthz answers 200; otherwise why not, in one line."""
    url = health_url(settings)
    # No proxy: the probe asks this host's own admin port. urlopen took http_proxy / https_proxy from the
    # environment, and a container with a corporate proxy there was unhealthy for good (a review).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                         urllib.request.HTTPSHandler(context=admin_probe_tls_context(settings)))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ssl.SSLError) as exc:  # URLError is an OSError
        return f"{url}: {getattr(exc, 'reason', exc)}"
    return None if status == 200 else f"{url} answered {status}"
