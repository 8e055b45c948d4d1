"""The server's TLS context (Pulsar ``pulsar+ssl://`` listener and HTTPS admin port), reloaded when
its certificate, key or trusted-CA file changes, as brokers do every ``tlsCertRefreshCheckDurationSec``.

asyncio and aiohttp take one ``ssl.SSLContext`` when the server starts. That context's SNI callback
(OpenSSL calls it for every ClientHello, with or without a server name) moves each new connection onto
the newest context, whose certificate and CA store then serve the handshake; connections already
open keep the certificate they were made with.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import ssl
import time
import warnings
from dataclasses import dataclass

import structlog
from cryptography import x509
from cryptography.utils import CryptographyDeprecationWarning

from tc_server.config import ConfigError, Settings

log = structlog.get_logger("tc_server.tls")


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    # CA bundle that client certificates must chain to; empty: client certificates are not asked for.
    trust_certs_file: str = ""
    # Refuse a handshake without a trusted client certificate (broker: tlsRequireTrustedClientCertOnConnect).
    require_client_cert: bool = False


# The attribute of each server context built by ServerTlsContext: the generation of the trust file it trusts.
_TRUST_GENERATION = "tc_server_trust_generation"


def _content(path: str | None) -> bytes | None:
    """A file's bytes, None when there is none or it cannot be read (a reload of it then fails anyway)."""
    if not path:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError:
        return None


def build_server_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context from the files. Raises ConfigError naming the file and the problem."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # No session tickets (all of TLS 1.3's resumption, and TLS 1.2's stateless one): a reload swaps the
    # context per handshake (ServerTlsContext), but tickets stay valid under the first context's keys,
    # and a resumed session's client certificate is not checked against the CAs again. A client that
    # resumed a session after its CA left the trust file would still be authenticated by it. What
    # remains is TLS 1.2's session-id cache, whose entries expire 300 s after the handshake.
    context.options |= ssl.OP_NO_TICKET
    context.num_tickets = 0
    try:
        context.load_cert_chain(files.cert_file, files.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls_cert_file / tls_key_file ({files.cert_file}, {files.key_file}): "
                          f"cannot load the certificate and its key: {_reason(exc)}") from None
    if files.trust_certs_file:
        try:
            context.load_verify_locations(cafile=files.trust_certs_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tls_trust_certs_file ({files.trust_certs_file}): "
                              f"cannot load the CA certificates: {_reason(exc)}") from None
        # Optional by default, as brokers: token clients connect over TLS without a certificate.
        context.verify_mode = ssl.CERT_REQUIRED if files.require_client_cert else ssl.CERT_OPTIONAL
    return context


# PEM blocks, and the labels under which OpenSSL reads a server's own certificate (PEM_read_bio_X509_AUX, behind
# load_cert_chain): a TRUSTED CERTIFICATE block is the certificate followed by its trust settings.
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.DOTALL)
_CERTIFICATE_LABELS = frozenset({b"CERTIFICATE", b"X509 CERTIFICATE", b"TRUSTED CERTIFICATE"})


def certificate_not_after_s(cert_file: str) -> float | None:
    """When the certificate OpenSSL serves from ``cert_file`` (its first certificate block) expires, in Unix
    seconds; None, with a warning, when this second reading of the file fails (a form OpenSSL takes and
    ``cryptography`` does not, e.g. BER): the expiry is a metric, never a reason to refuse a start or a
    renewed certificate."""
    try:
        with open(cert_file, "rb") as f:
            der = first_certificate_der(f.read())
        with warnings.catch_warnings():  # e.g. a negative serial number, which says nothing about the expiry
            warnings.simplefilter("ignore", CryptographyDeprecationWarning)
            certificate = x509.load_der_x509_certificate(der)
        return certificate.not_valid_after_utc.timestamp()
    except (OSError, ValueError) as exc:
        log.warning("cannot read the TLS certificate's expiry; tc_server_tls_certificate_expiry_timestamp_seconds "
                    "is not exported for it", cert_file=cert_file, error=str(exc)[:200])
        return None


def first_certificate_der(pem: bytes) -> bytes:
    """The DER of the first certificate block of ``pem``, without the trust settings a TRUSTED CERTIFICATE
    block adds after it. Raises ValueError."""
    blocks = [body for label, body in _PEM_BLOCK.findall(pem) if label in _CERTIFICATE_LABELS]
    if not blocks:
        raise ValueError("no certificate block")
    der = base64.b64decode(blocks[0])
    if len(der) < 2 or der[0] != 0x30:
        raise ValueError("not a DER SEQUENCE")
    if der[1] < 0x80:
        return der[:2 + der[1]]
    octets = der[1] & 0x7F
    return der[:2 + octets + int.from_bytes(der[2:2 + octets], "big")]


class ServerTlsContext:
    """Hand :attr:`context` to the server; :meth:`run` checks the files every interval."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._stamp = self._file_stamp()
        self._trust = _content(files.trust_certs_file)  # before the context is built: see reload_if_changed
        self.context = build_server_context(files)
        # Of the certificate in use (tc_server_tls_certificate_expiry_timestamp_seconds; the alert rules warn
        # before it passes): a renewed file that cannot be loaded leaves it at the old one's. None: unknown.
        self.not_after_s = certificate_not_after_s(files.cert_file)
        self._current = self.context
        self.context.sni_callback = self._select
        self.reloads = 0
        self.reloaded_at_s = 0.0  # wall clock of the last reload (0: none yet)
        # The trust file's content and its generation: a reload whose trust file holds other certificates (not
        # merely a new modification time, as a Kubernetes Secret update gives) starts a new one. Each context
        # built is tagged with the generation it trusts (_TRUST_GENERATION), which its connections keep.
        self.trust_generation = 0
        setattr(self.context, _TRUST_GENERATION, 0)

    def expiry_samples(self) -> list[tuple[tuple[()], float]]:
        """The samples of tc_server_tls_certificate_expiry_timestamp_seconds: none while the expiry is unknown."""
        return [] if self.not_after_s is None else [((), self.not_after_s)]

    def _select(self, ssl_object: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> None:
        if self._current is not self.context:
            ssl_object.context = self._current

    def _file_stamp(self) -> tuple[tuple[int, int, int], ...]:
        stamps = []
        for path in (self.files.cert_file, self.files.key_file, self.files.trust_certs_file):
            try:
                st = os.stat(path) if path else None
            except OSError:
                st = None
            stamps.append((st.st_mtime_ns, st.st_size, st.st_ino) if st else (0, 0, 0))
        return tuple(stamps)

    def reload_if_changed(self) -> bool:
        """Build a new context if a file changed; True when the new one is in use. A file caught half
        written fails to load: the old context stays and the next check tries again."""
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return False
        # Read before the context is built from the file: should it change in between, the context trusts the
        # newer content under the older generation, and the next reload starts another, so its connections are
        # taken for stale (read after, they trusted the older content under the newer generation, kept for good).
        trust = _content(self.files.trust_certs_file)
        try:
            fresh = build_server_context(self.files)
        except ConfigError as exc:
            log.warning("TLS files changed but cannot be loaded; keeping the previous certificate", error=str(exc))
            return False
        if trust != self._trust:
            self._trust = trust
            self.trust_generation += 1
        setattr(fresh, _TRUST_GENERATION, self.trust_generation)
        self._stamp = stamp
        self._current = fresh
        self.not_after_s = certificate_not_after_s(self.files.cert_file)
        self.reloads += 1
        self.reloaded_at_s = time.time()
        log.info("TLS certificate reloaded", cert_file=self.files.cert_file)
        return True

    def verified_peer_certificate(self, ssl_object: ssl.SSLObject | None) -> bytes | None:
        """The client certificate (DER) the TLS layer verified on this connection, or None.

        A TLS 1.2 session resumed from the server's session cache skips the certificate check and keeps the
        certificate of its first handshake: after a reload whose trust file dropped that certificate's CA,
        a client could still prove its role that way for the cache's 5 minutes. A session from before the
        last reload therefore proves nothing (its client connects again with a full handshake). Session
        times have whole seconds: one made in the reload's second proves nothing either, though it may
        be just after it.

        Nor does a connection whose handshake trusted an earlier content of the trust file, resumed or not (the
        context it was made with tells): the admin port authenticates every request of a keep-alive connection
        from its certificate, and one whose CA the operator had removed stayed a superuser for as long as it
        sent a request every keep-alive interval (a review). See :meth:`stale`."""
        if ssl_object is None:
            return None
        certificate = ssl_object.getpeercert(binary_form=True)
        if certificate is None or self.stale(ssl_object):
            return None
        if ssl_object.session_reused and self.reloads:
            session = ssl_object.session
            if session is None or session.time <= int(self.reloaded_at_s):
                return None
        return certificate

    def stale(self, ssl_object: ssl.SSLObject) -> bool:
        """Whether the connection's handshake trusted another content of the trust file than the current."""
        return getattr(ssl_object.context, _TRUST_GENERATION, self.trust_generation) != self.trust_generation

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.reload_if_changed()


def server_tls_context(settings: Settings) -> ServerTlsContext | None:
    """The reloading TLS context of the pulsar+ssl:// listener and the HTTPS admin port, if either is on."""
    if not (settings.tls_listen or settings.admin_tls):
        return None
    return ServerTlsContext(TlsFiles(settings.tls_cert_file, settings.tls_key_file, settings.tls_trust_certs_file,
                                     settings.tls_require_trusted_client_cert))


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc)
