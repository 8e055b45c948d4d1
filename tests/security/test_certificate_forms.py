"""Certificate files in the forms OpenSSL serves that a second parser reads differently: a TRUSTED CERTIFICATE
block (`openssl x509 -trustout`) and a BER length. tc-server serves them (start and reload) as OpenSSL does;
its certificate expiry (tc_server_tls_certificate_expiry_timestamp_seconds, read with `cryptography`) is the
served certificate's, or not exported when that reading fails, never a reason to refuse the files (a review
found all three broken by the expiry metric: the start refused, the renewal refused, the CA's expiry
exported)."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tc_server.app import start_app
from tc_server.auth.certificates import ServerTlsContext, TlsFiles
from tc_server.config import Settings
from tests.security.pki import Issued, TestCa

BASE = Settings(listen="", tls_listen="127.0.0.1:0", admin_listen="127.0.0.1:0", store="memory", coordinators=4,
                keepalive_s=30, log_format="json")

# X509_CERT_AUX with one trust setting, serverAuth: what `openssl x509 -trustout -addtrust serverAuth`
# appends to the certificate in a "TRUSTED CERTIFICATE" block (OpenSSL's PEM_read_bio_X509_AUX reads it, and
# SSL_CTX_use_certificate_chain_file, behind ssl.SSLContext.load_cert_chain, reads the leaf with it).
SERVER_AUTH_AUX = bytes.fromhex("300c300a06082b06010505070301")


def pem(tag: str, der: bytes) -> bytes:
    return ssl.DER_cert_to_PEM_cert(der).replace("CERTIFICATE", tag).encode()


def der(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.DER)


def trusted_pem(certificate: x509.Certificate) -> bytes:
    """The certificate as `openssl x509 -trustout -addtrust serverAuth` writes it."""
    return pem("TRUSTED CERTIFICATE", der(certificate) + SERVER_AUTH_AUX)


def ber_pem(certificate: x509.Certificate) -> bytes:
    """The certificate with its outer SEQUENCE's length in a longer form than DER's minimal one (BER, as some
    older CA software writes; OpenSSL reads BER, the signed tbsCertificate is untouched)."""
    raw = der(certificate)
    assert raw[0] == 0x30 and raw[1] & 0x80
    octets = raw[1] & 0x7F
    length = raw[2:2 + octets]
    return pem("CERTIFICATE", bytes([0x30, 0x80 | (octets + 1), 0]) + length + raw[2 + octets:])


VARIANTS = {"trusted_certificate_block": trusted_pem, "ber_encoding": ber_pem}


def openssl_loads(cert_file: Path, key_file: Path) -> None:
    """What tc-server's TLS context does with the files (build_server_context): it succeeds."""
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)


async def served_certificate(port: int, ca: TestCa) -> x509.Certificate:
    context = ssl.create_default_context(cafile=str(ca.cert_file))
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        return x509.load_der_x509_certificate(ssl_object.getpeercert(binary_form=True))
    finally:
        writer.close()


@pytest.fixture
def ca(tmp_path: Path) -> TestCa:
    return TestCa(tmp_path)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
async def test_a_certificate_file_openssl_serves_still_starts_the_server(variant: str, ca: TestCa,
                                                                         tmp_path: Path) -> None:
    server = ca.issue("localhost", "server", server=True)
    server.cert_file.write_bytes(VARIANTS[variant](server.certificate))
    openssl_loads(server.cert_file, server.key_file)  # the file is good: OpenSSL takes it
    app = await start_app(replace(BASE, data_dir=str(tmp_path / "data"), tls_cert_file=str(server.cert_file),
                                  tls_key_file=str(server.key_file)).validate())
    try:
        assert app.tls_listener is not None
        served = await served_certificate(app.tls_listener.port, ca)
        assert served.serial_number == server.certificate.serial_number
        (family,) = app.metrics.tls_certificate_expiry.collect()
        exported = [sample.value for sample in family.samples]
        # cryptography refuses BER: no expiry then (a warning says so), rather than a wrong one.
        expected = [] if variant == "ber_encoding" else [server.certificate.not_valid_after_utc.timestamp()]
        assert exported == expected
    finally:
        await app.stop()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_renewed_certificate_openssl_serves_is_reloaded(variant: str, ca: TestCa) -> None:
    server = ca.issue("localhost", "server", server=True)
    tls = ServerTlsContext(TlsFiles(str(server.cert_file), str(server.key_file)))
    renewed: Issued = ca.issue("localhost", "server", server=True, valid_days=30)  # same paths, new cert and key
    renewed.cert_file.write_bytes(VARIANTS[variant](renewed.certificate))
    openssl_loads(renewed.cert_file, renewed.key_file)
    # The old certificate stays in use (until it expires) while the renewal is refused at every check.
    assert tls.reload_if_changed(), "the renewed certificate was not loaded"


def test_the_expiry_exported_is_the_served_certificate_s(ca: TestCa) -> None:
    # The leaf as a TRUSTED CERTIFICATE block, then its CA's certificate (the chain): OpenSSL serves the leaf;
    # a reader of CERTIFICATE blocks alone skips the leaf's block and reads the CA's, which expires later.
    server = ca.issue("localhost", "server", server=True, valid_days=0.5)
    chain = trusted_pem(server.certificate) + ca.certificate.public_bytes(serialization.Encoding.PEM)
    server.cert_file.write_bytes(chain)
    openssl_loads(server.cert_file, server.key_file)
    tls = ServerTlsContext(TlsFiles(str(server.cert_file), str(server.key_file)))
    assert tls.not_after_s == server.certificate.not_valid_after_utc.timestamp(), (
        f"exported {tls.not_after_s} (the CA's: {ca.certificate.not_valid_after_utc.timestamp()}), "
        f"served leaf expires {server.certificate.not_valid_after_utc.timestamp()}")
