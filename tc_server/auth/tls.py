"""The ``tls`` method: mutual TLS, the role is the client certificate's common name, as Pulsar's
AuthenticationProviderTls reads it (the first ``CN`` of the subject in RFC 2253 order, which lists the
most specific RDN first).

The certificate was already verified by the TLS layer against ``--tls-trust-certs-file``; an
unverified certificate never reaches here (the handshake fails), and no certificate means no role.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.x509.oid import NameOID

from tc_server.auth.api import Authenticated, AuthenticationData, AuthenticationFailed

METHOD = "tls"


def common_name(certificate_der: bytes) -> str | None:
    """The CN a broker takes as the role, or None. Raises ValueError for bytes that are no certificate."""
    certificate = x509.load_der_x509_certificate(certificate_der)
    for rdn in reversed(certificate.subject.rdns):
        for attribute in rdn:
            if attribute.oid == NameOID.COMMON_NAME and isinstance(attribute.value, str) and attribute.value:
                return attribute.value
    return None


class TlsProvider:
    method = METHOD

    def authenticate(self, data: AuthenticationData) -> Authenticated:
        if data.peer_certificate is None:
            raise AuthenticationFailed("tls authentication needs a client certificate signed by a trusted CA, "
                                       "over a TLS connection")
        try:
            role = common_name(data.peer_certificate)
        except ValueError:
            raise AuthenticationFailed("the client certificate cannot be read") from None
        if role is None:
            raise AuthenticationFailed("the client certificate has no common name (CN) to take the role from")
        return Authenticated(role=role, method=METHOD)
