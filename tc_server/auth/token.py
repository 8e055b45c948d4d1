"""The ``token`` method: JSON Web Tokens as Pulsar's AuthenticationProviderToken accepts them.

- HS256/384/512 with a secret key (``--token-secret-key``), RS*/PS* with an RSA public key and ES*
  with an EC public key (``--token-public-key``); which algorithms a key admits is decided from the key,
  as the broker's JWT library does (a 256-bit secret signs HS256 only, a P-256 key ES256 only).
- The role is the ``sub`` claim, or the claim ``--token-auth-claim`` names (a list: its first string).
- ``exp`` and ``nbf`` are enforced with no leeway; ``iat`` is not checked (neither does the broker).
- ``--token-audience``: the ``--token-audience-claim`` (``aud``) must be that string or a list holding it.

The token arrives as CONNECT's ``auth_data`` or as an ``Authorization: Bearer`` header (RFC 6750).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_der_public_key, load_pem_public_key

from tc_server.auth.api import Authenticated, AuthenticationData, AuthenticationFailed
from tc_server.config import ConfigError

METHOD = "token"
# The smallest HMAC key for each algorithm (RFC 7518 §3.2): the broker refuses a token whose
# algorithm needs a longer key than the one configured, and refuses to start below 256 bits.
_HMAC_MIN_KEY_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
_RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
# jjwt, a broker's JWT library, refuses RSA keys shorter than this (WeakKeyException).
MIN_RSA_KEY_BITS = 2048
_EC_ALGORITHM_BY_CURVE = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
# What the JWT library checks for us; the role and audience claims are read below, as the broker
# reads them (a missing or non-string ``sub`` is our error, not the library's).
_DECODE_OPTIONS: Any = {
    "verify_signature": True, "verify_exp": True, "verify_nbf": True, "verify_iat": False,
    "verify_aud": False, "verify_iss": False, "verify_sub": False, "verify_jti": False, "require": [],
}


class TokenProvider:
    method = METHOD

    def __init__(self, key: Any, algorithms: Sequence[str], role_claim: str = "sub",
                 audience: str | None = None, audience_claim: str = "aud") -> None:
        self._key = key
        self._algorithms = list(algorithms)
        self._role_claim = role_claim
        self._audience = audience
        self._audience_claim = audience_claim

    @classmethod
    def with_secret_key(cls, secret: bytes, **claims: Any) -> TokenProvider:
        """Raises ConfigError for a key shorter than 256 bits (the broker refuses those too)."""
        algorithms = [alg for alg, size in _HMAC_MIN_KEY_BYTES.items() if len(secret) >= size]
        if not algorithms:
            raise ConfigError(f"token_secret_key: the key has {len(secret) * 8} bits; HS256 needs at least 256")
        return cls(secret, algorithms, **claims)

    @classmethod
    def with_public_key(cls, material: bytes, **claims: Any) -> TokenProvider:
        """``material`` is DER (what ``pulsar tokens create-key-pair`` writes) or PEM. Raises ConfigError."""
        try:
            key = load_pem_public_key(material) if material.lstrip().startswith(b"-----") \
                else load_der_public_key(material)
        except (ValueError, TypeError):
            raise ConfigError("token_public_key: not an RSA or EC public key (X.509 SubjectPublicKeyInfo, "
                              "DER or PEM)") from None
        if isinstance(key, rsa.RSAPublicKey):
            if key.key_size < MIN_RSA_KEY_BITS:
                # A broker (jjwt) refuses every token checked with such a key (WeakKeyException); taken here,
                # anyone who factors it signs any role, superusers included.
                raise ConfigError(f"token_public_key: the RSA key has {key.key_size} bits; RS256 and the other "
                                  f"RSA algorithms need at least {MIN_RSA_KEY_BITS}, as a Pulsar broker does")
            return cls(key, _RSA_ALGORITHMS, **claims)
        if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name in _EC_ALGORITHM_BY_CURVE:
            return cls(key, [_EC_ALGORITHM_BY_CURVE[key.curve.name]], **claims)
        raise ConfigError(f"token_public_key: unsupported key type {type(key).__name__} "
                          "(RSA, or EC on P-256, P-384 or P-521)")

    @property
    def algorithms(self) -> list[str]:
        return list(self._algorithms)

    def authenticate(self, data: AuthenticationData) -> Authenticated:
        if data.command_data is not None:
            token = data.command_data.decode("utf-8", errors="replace")
        elif data.bearer_token is not None:
            token = data.bearer_token
        else:
            raise AuthenticationFailed("no token credentials passed")
        token = token.strip()
        if not token:
            raise AuthenticationFailed("blank token")
        claims = self._verify(token)
        role = self._role(claims)
        self._check_audience(claims)
        return Authenticated(role=role, method=METHOD, expires_at_ms=_expiry_ms(claims.get("exp")))

    def _verify(self, token: str) -> dict[str, Any]:
        # Our own messages: the library's can quote parts of the token.
        try:
            claims = jwt.decode(token, self._key, algorithms=self._algorithms, options=_DECODE_OPTIONS)
        except jwt.ExpiredSignatureError:
            raise AuthenticationFailed("token expired") from None
        except jwt.ImmatureSignatureError:
            raise AuthenticationFailed("token not valid yet (nbf is in the future)") from None
        except jwt.InvalidSignatureError:
            raise AuthenticationFailed("token signature does not verify with the configured key") from None
        except jwt.InvalidAlgorithmError:
            raise AuthenticationFailed(
                f"token signed with an algorithm the configured key does not admit "
                f"(admits {', '.join(self._algorithms)})") from None
        except jwt.InvalidKeyError:
            raise AuthenticationFailed("token does not fit the configured key") from None
        except jwt.PyJWTError:
            raise AuthenticationFailed("malformed token (not a signed JWT)") from None
        if not isinstance(claims, dict):
            raise AuthenticationFailed("malformed token (claims are not a JSON object)")
        return claims

    def _role(self, claims: dict[str, Any]) -> str:
        value = claims.get(self._role_claim)
        if isinstance(value, list) and value and isinstance(value[0], str):
            value = value[0]
        if not isinstance(value, str) or not value:
            raise AuthenticationFailed(f"token has no role: claim {self._role_claim!r} is missing or not a string")
        return value

    def _check_audience(self, claims: dict[str, Any]) -> None:
        if self._audience is None:
            return
        value = claims.get(self._audience_claim)
        if value is None:
            raise AuthenticationFailed(f"token has no audience claim {self._audience_claim!r}")
        audiences = value if isinstance(value, list) else [value]
        if self._audience not in audiences:
            raise AuthenticationFailed(f"token audience does not include this coordinator ({self._audience!r})")


def _expiry_ms(exp: Any) -> int | None:
    """The ``exp`` claim in epoch ms, or None without one. A number, or a string of one, as PyJWT accepts
    it (and enforces it at CONNECT): a string ``exp`` read as "none" left the connection unchecked after
    the token expired."""
    if isinstance(exp, bool) or exp is None:
        return None
    try:
        return int(float(exp) * 1000)
    except (TypeError, ValueError, OverflowError):
        return None
