"""Security settings are checked at start, with a message naming the setting (tc_server/config.py,
tc_server/auth/service.py), and a broker's provider class names are accepted as they are."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from tc_server.app import start_app
from tc_server.auth.service import AuthenticationService, provider_methods
from tc_server.config import ConfigError, Settings, load_settings
from tests.security.pki import TestCa


def settings(**env: str):
    return load_settings(environ={f"TC_SERVER_{name.upper()}": value for name, value in env.items()})


@pytest.mark.parametrize("env, message", [
    ({"authentication_providers": "token"}, "token needs token_secret_key or token_public_key"),
    ({"authentication_providers": "kerberos"}, "unknown authentication provider 'kerberos'"),
    ({"authentication_providers": "tls"}, "tls needs a TLS port"),
    # Without the clients' CA the server asks nobody for a certificate: the method could prove no one.
    ({"authentication_providers": "tls", "admin_tls": "true", "tls_cert_file": "s.pem", "tls_key_file": "s.key"},
     "tls needs tls_trust_certs_file"),
    ({"token_secret_key": "data:;base64,AAAA", "token_public_key": "data:;base64,AAAA"}, "both set"),
    ({"listen": ""}, "plain listener off) needs tls_listen"),
    ({"tls_listen": "127.0.0.1:6651"}, "needs tls_cert_file and tls_key_file"),
    ({"tls_require_trusted_client_cert": "true"}, "needs tls_trust_certs_file"),
    ({"advertised_url_tls": "pulsar://h:1"}, "must be pulsar+ssl://HOST:PORT"),
    ({"token_auth_claim": ""}, "must not be empty"),
])
def test_inconsistent_security_settings_stop_the_start(env, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        settings(**env)


def test_broker_class_names_are_accepted():
    broker_conf = ("org.apache.pulsar.broker.authentication.AuthenticationProviderToken, "
                   "org.apache.pulsar.broker.authentication.AuthenticationProviderTls,token")
    assert provider_methods(broker_conf) == ["token", "tls"]


def test_a_key_file_that_cannot_be_read_is_named(tmp_path):
    missing = tmp_path / "nope.key"
    with pytest.raises(ConfigError, match=f"token_secret_key: cannot read {missing}"):
        AuthenticationService.from_settings(settings(authentication_providers="token",
                                                     token_secret_key=f"file://{missing}"))


def test_a_public_key_that_is_no_key_is_named(tmp_path):
    junk = tmp_path / "public.key"
    junk.write_bytes(b"\x30\x03\x02\x01\x00")
    with pytest.raises(ConfigError, match="token_public_key: not an RSA or EC public key"):
        AuthenticationService.from_settings(settings(authentication_providers="token",
                                                     token_public_key=f"file://{junk}"))


def test_superuser_roles_are_a_comma_separated_list():
    service = AuthenticationService.from_settings(settings(superuser_roles=" ops, tc-admin ,,"))
    assert service.superusers == {"ops", "tc-admin"}
    assert not service.enabled and service.authenticate("none", None) is None  # type: ignore[arg-type]


async def test_settings_that_need_authentication_are_named_when_it_is_off(tmp_path):
    # Superuser roles, proxy roles or a token key without --authentication-providers were taken silently:
    # the operator believed authentication on, and every client was let in as nobody in particular.
    settings = replace(Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", store="memory",
                                data_dir=str(tmp_path)), superuser_roles="admin", proxy_roles="proxy").validate()
    with capture_logs() as logged:
        app = await start_app(settings)
        await app.stop()
    (warning,) = [line for line in logged if line["event"].startswith("authentication is off (no --authentication")]
    assert warning["settings"] == ["--superuser-roles", "--proxy-roles"]


@pytest.mark.parametrize("admin_tls", [False, True])
async def test_tls_as_the_only_method_with_a_plain_admin_port_is_named(tmp_path, admin_tls):
    # No request on a plain-HTTP admin port can carry a credential the tls method takes: every /admin/v3
    # request was 401, the superusers' included, without a word at the start.
    ca = TestCa(tmp_path)
    server = ca.issue("localhost", "server", server=True)
    settings = replace(Settings(listen="127.0.0.1:0", admin_listen="127.0.0.1:0", store="memory",
                                data_dir=str(tmp_path / "data")), authentication_providers="tls",
                       superuser_roles="ops", tls_listen="127.0.0.1:0", tls_cert_file=str(server.cert_file),
                       tls_key_file=str(server.key_file), tls_trust_certs_file=str(ca.cert_file),
                       admin_tls=admin_tls).validate()
    with capture_logs() as logged:
        app = await start_app(settings)
        await app.stop()
    warned = [line for line in logged if line["event"].startswith("the admin API can authenticate nobody")]
    assert len(warned) == (0 if admin_tls else 1), warned
