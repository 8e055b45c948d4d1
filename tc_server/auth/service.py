"""The configured providers and superuser roles, as a broker's AuthenticationService: the method a
client names picks the provider; authentication is on when at least one provider is configured.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from tc_server.auth import tls, token
from tc_server.auth.api import Authenticated, AuthenticationData, AuthenticationFailed, AuthenticationProvider
from tc_server.auth.keys import read_key
from tc_server.config import ConfigError

if TYPE_CHECKING:
    from tc_server.config import Settings

# Short names, and the class names a broker's ``authenticationProviders`` lists, so a broker's
# setting can be copied as is.
PROVIDER_NAMES = {
    "token": token.METHOD,
    "org.apache.pulsar.broker.authentication.AuthenticationProviderToken": token.METHOD,
    "tls": tls.METHOD,
    "org.apache.pulsar.broker.authentication.AuthenticationProviderTls": tls.METHOD,
}
# A client-chosen method name is quoted in errors; keep what a client can make us log short.
_MAX_QUOTED = 64


def split_list(text: str) -> list[str]:
    """``"a, b,,c"`` → ``["a", "b", "c"]``: the comma-separated lists of broker settings."""
    return [item.strip() for item in text.split(",") if item.strip()]


def provider_methods(text: str) -> list[str]:
    """The methods a ``--authentication-providers`` value names. Raises ValueError naming an unknown one."""
    methods: list[str] = []
    for name in split_list(text):
        if name not in PROVIDER_NAMES:
            raise ValueError(f"unknown authentication provider {name!r} (known: token, tls)")
        if PROVIDER_NAMES[name] not in methods:
            methods.append(PROVIDER_NAMES[name])
    return methods


class AuthenticationService:
    def __init__(self, providers: Iterable[AuthenticationProvider] = (), superusers: Iterable[str] = (),
                 proxy_roles: Iterable[str] = ()) -> None:
        self._providers = {provider.method: provider for provider in providers}
        self.superusers = frozenset(superusers)
        self.proxy_roles = frozenset(proxy_roles)

    @classmethod
    def from_settings(cls, settings: Settings) -> AuthenticationService:
        """Read the keys the settings name. Raises ConfigError naming the setting."""
        providers: list[AuthenticationProvider] = []
        for method in provider_methods(settings.authentication_providers):
            if method == token.METHOD:
                providers.append(_token_provider(settings))
            else:
                providers.append(tls.TlsProvider())
        return cls(providers, split_list(settings.superuser_roles), split_list(settings.proxy_roles))

    @property
    def enabled(self) -> bool:
        return bool(self._providers)

    @property
    def methods(self) -> list[str]:
        return sorted(self._providers)

    def authenticate(self, method: str | None, data: AuthenticationData) -> Authenticated | None:
        """The identity a CONNECT proves, or None when authentication is off (everyone connects as
        nobody, as a broker with authentication disabled). Raises AuthenticationFailed."""
        if not self._providers:
            return None
        provider = self._providers.get(method or "")
        if provider is None:
            # As a broker without an anonymous role: "none", "" and unknown methods are refused.
            quoted = repr((method or "")[:_MAX_QUOTED])
            raise AuthenticationFailed(
                f"authentication method {quoted} is not accepted here (accepted: {', '.join(self.methods)})")
        return provider.authenticate(data)

    def authenticate_http(self, authorization: str | None, peer_certificate: bytes | None) -> Authenticated:
        """The identity of an admin request: an ``Authorization: Bearer`` token, else a TLS client
        certificate. Raises AuthenticationFailed (the caller answers 401)."""
        if authorization is not None:
            scheme, _, credentials = authorization.strip().partition(" ")
            if scheme.lower() != "bearer" or not credentials.strip():
                raise AuthenticationFailed("the Authorization header is not 'Bearer <token>'")
            provider = self._providers.get(token.METHOD)
            if provider is None:
                raise AuthenticationFailed("token authentication is not enabled here")
            return provider.authenticate(AuthenticationData(bearer_token=credentials.strip()))
        provider = self._providers.get(tls.METHOD)
        if provider is not None and peer_certificate is not None:
            return provider.authenticate(AuthenticationData(peer_certificate=peer_certificate))
        raise AuthenticationFailed("authentication required: send 'Authorization: Bearer <token>'"
                                   + (" or a client certificate" if tls.METHOD in self._providers else ""))

    def is_superuser(self, role: str | None) -> bool:
        return role is not None and role in self.superusers

    def is_proxy_role(self, role: str | None) -> bool:
        return role is not None and role in self.proxy_roles


def _token_provider(settings: Settings) -> token.TokenProvider:
    claims = {
        "role_claim": settings.token_auth_claim,
        "audience": settings.token_audience or None,
        "audience_claim": settings.token_audience_claim,
    }
    if settings.token_secret_key:
        return token.TokenProvider.with_secret_key(read_key("token_secret_key", settings.token_secret_key), **claims)
    if settings.token_public_key:
        return token.TokenProvider.with_public_key(read_key("token_public_key", settings.token_public_key), **claims)
    raise ConfigError("authentication_providers: token needs token_secret_key or token_public_key")
