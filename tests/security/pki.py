"""Key material for the security tests, generated per test with ``cryptography`` and PyJWT: nothing is
committed. What `pulsar tokens create-secret-key` / `create-key-pair` / `create` and an openssl CA
would produce (docs/security.md shows those commands).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


def data_url(raw: bytes) -> str:
    """The ``data:;base64,`` form brokers (and tc-server) read key settings in."""
    return "data:;base64," + base64.b64encode(raw).decode()


def public_der(private_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    """X.509 SubjectPublicKeyInfo, DER: what ``pulsar tokens create-key-pair`` writes as the public key."""
    return private_key.public_key().public_bytes(serialization.Encoding.DER,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)


def make_token(key: Any, algorithm: str, subject: str | None = "alice", *, expires_in_s: float | None = 3600,
               **claims: Any) -> str:
    """A signed JWT; ``expires_in_s`` None: no ``exp`` (what ``pulsar tokens create`` makes by default)."""
    body: dict[str, Any] = dict(claims)
    if subject is not None:
        body["sub"] = subject
    if expires_in_s is not None:
        body["exp"] = int(time.time() + expires_in_s)
    return jwt.encode(body, key, algorithm=algorithm)


@dataclass
class Issued:
    """A certificate and its key, written as PEM files."""

    cert_file: Path
    key_file: Path
    certificate: x509.Certificate


class TestCa:
    """A throw-away certificate authority that signs server and client certificates."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, name: str = "tc-server test CA") -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_file = directory / f"{name.replace(' ', '-')}.pem"
        self.cert_file.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, file_stem: str, *, server: bool = False, pkcs8_key: bool = True,
              valid_days: float = 1) -> Issued:
        """A leaf certificate valid for ``valid_days`` from now; ``server`` adds the loopback names a client
        verifies."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tc-server tests"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        cert_file = self.directory / f"{file_stem}.cert.pem"
        key_file = self.directory / f"{file_stem}.key.pem"
        # Written whole, then renamed over the old file: a reader never sees half a certificate.
        _replace(cert_file, certificate.public_bytes(serialization.Encoding.PEM))
        # PKCS#8: the form the Java client's AuthenticationTls reads.
        _replace(key_file, key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8 if pkcs8_key else serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption()))
        return Issued(cert_file, key_file, certificate)


def _replace(path: Path, content: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(content)
    temporary.replace(path)
