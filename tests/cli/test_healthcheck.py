"""``tc-server healthcheck`` (the image's HEALTHCHECK) asks /healthz where the settings put the admin port;
tests/deploy/test_live.py runs it against real servers on [::], over HTTPS and with mTLS."""

from __future__ import annotations

import pytest

from tc_server.cli import main
from tc_server.config import Settings
from tc_server.healthcheck import health_url


@pytest.mark.parametrize(("admin_listen", "url"), [
    ("0.0.0.0:8080", "http://127.0.0.1:8080/healthz"),
    ("[::]:8090", "http://[::1]:8090/healthz"),  # the loopback of the address's own family
    ("[fd00::1]:8090", "http://[fd00::1]:8090/healthz"),
    ("10.1.2.3:8080", "http://10.1.2.3:8080/healthz"),
    (":8080", "http://127.0.0.1:8080/healthz"),
])
def test_the_url_follows_admin_listen(admin_listen: str, url: str) -> None:
    assert health_url(Settings(admin_listen=admin_listen)) == url


def test_admin_tls_is_asked_over_https() -> None:
    assert health_url(Settings(admin_tls=True)) == "https://127.0.0.1:8080/healthz"


def test_a_configuration_error_is_unhealthy_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TC_SERVER_ADMIN_LISTEN", "nowhere")
    assert main(["healthcheck"]) == 1  # Docker: 1 is unhealthy, 2 is reserved
    err = capsys.readouterr().err
    assert err.startswith("tc-server healthcheck: configuration error: admin_listen: ") and err.count("\n") == 1
