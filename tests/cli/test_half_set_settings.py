"""Settings that do nothing without another one. tc-server warns when authentication settings are set with
authentication off ("these settings do nothing", app.start_app), and refuses --tls-listen without its files;
but the other half-set combinations start silently, and the operator believes they are in force."""

from __future__ import annotations

from pathlib import Path

from tests.cli.run_as_operator import start_outcome
from tests.support.server_process import free_port


def mentions(outcome, *names: str) -> bool:
    """The start was refused, or a warning was logged, naming one of ``names``."""
    if outcome.code not in (None, 0):  # its own output, not the launcher's "---- start <argv>" line
        said = "\n".join(line for line in outcome.output.splitlines() if not line.startswith("---- start"))
        return any(name in said for name in names)
    return any(name in str(line) for line in outcome.warnings() for name in names)


def test_tls_files_and_mtls_without_a_tls_port_are_not_silently_ignored(tmp_path: Path) -> None:
    # An operator asks for mutual TLS and forgets --tls-listen (and --admin-tls): tc-server serves plain
    # pulsar:// and plain HTTP only, reads none of the files (they do not even exist here), and says nothing.
    outcome = start_outcome(tmp_path, "--tls-cert-file", str(tmp_path / "missing.pem"),
                            "--tls-key-file", str(tmp_path / "missing.key"),
                            "--tls-trust-certs-file", str(tmp_path / "missing-ca.pem"),
                            "--tls-require-trusted-client-cert")
    assert mentions(outcome, "tls_listen", "tls-listen", "TLS_LISTEN", "admin_tls", "admin-tls"), outcome.output


def test_broker_credentials_without_the_plugin_are_not_silently_dropped(tmp_path: Path) -> None:
    # The parameters without the plugin: tc-server connects to the brokers with no credentials at all
    # (broker_client.broker_client_credentials: kind "none"), so brokers with authorization refuse every
    # END_TXN_ON_* and no decision is ever delivered; nothing at start says why.
    outcome = start_outcome(tmp_path, "--upstream-url", f"pulsar://127.0.0.1:{free_port()}",
                            "--broker-client-auth-params", "token:eyJhbGciOiJIUzI1NiJ9.e30.x")
    assert mentions(outcome, "broker_client_auth_plugin", "broker-client-auth-plugin",
                    "BROKER_CLIENT_AUTH_PLUGIN"), outcome.output


def test_pulsars_authentication_disabled_plugin_is_no_credentials_not_a_refusal() -> None:
    # brokerClientAuthenticationPlugin's default in Pulsar's broker.conf, which a copied broker.conf or a chart's
    # values carry: refused at start once the plugin was checked without --upstream-url too.
    from tc_server.auth.broker_client import DISABLED_PLUGIN, broker_client_credentials
    from tc_server.config import load_settings

    assert load_settings(flags={"broker_client_auth_plugin": DISABLED_PLUGIN}, environ={})
    with_upstream = load_settings(flags={"broker_client_auth_plugin": DISABLED_PLUGIN,
                                         "upstream_url": "pulsar://broker:6650"}, environ={})
    assert broker_client_credentials(with_upstream).method == "none"
