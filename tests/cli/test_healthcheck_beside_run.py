"""The image's HEALTHCHECK (`tc-server healthcheck`) reads the settings from the environment, as `run` does,
but not `run`'s flags. The README says that matters only when the admin port is configured by flags; yet it
validates *every* setting and refuses unknown TC_SERVER_* variables, so a healthy server whose other settings
are partly flags is reported unhealthy forever."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.run_as_operator import clean_env, started, tc_server
from tests.support.server_process import free_port
from tests.support.waiting import wait_for


def healthy_admin(server) -> None:
    try:
        wait_for(lambda: server.status("/healthz") == 200, "/healthz 200", step_s=0.2)
    except AssertionError as exc:
        pytest.fail(f"{exc}\n{server.log_tail()}")


def healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`tc-server healthcheck`, tried up to three times as Docker's HEALTHCHECK retries: one try's 2 s bound
    can run out on a loaded machine, while a refusal of the settings fails every try."""
    for _ in range(3):
        done = tc_server(["healthcheck"], env)
        if done.returncode == 0:
            break
    return done


def test_healthcheck_of_a_server_reading_its_broker_token_by_an_env_flag(tmp_path: Path) -> None:
    # docs/security.md: --broker-client-auth-params env:NAME, and config.py lets NAME carry the TC_SERVER_
    # prefix. Given as a flag of `run` (the Secret in the container's environment), the server runs.
    token_env = {"TC_SERVER_BROKER_TOKEN": "eyJhbGciOiJIUzI1NiJ9.e30.x"}
    flags = ["--upstream-url", f"pulsar://127.0.0.1:{free_port()}",
             "--broker-client-auth-plugin", "token", "--broker-client-auth-params", "env:TC_SERVER_BROKER_TOKEN"]
    with started(tmp_path, *flags, env=token_env) as (server, outcome):
        assert outcome.code is None, outcome.output
        healthy_admin(server)
        # Docker runs the HEALTHCHECK in the container's environment: the token variable and the admin address.
        admin = {"TC_SERVER_ADMIN_LISTEN": f"127.0.0.1:{server.admin_port}"}
        done = healthcheck(clean_env(**token_env, **admin))
    assert done.returncode == 0, done.stderr


def test_healthcheck_of_a_server_given_its_key_file_as_a_flag(tmp_path: Path) -> None:
    # Authentication on in the environment (a ConfigMap), the key file as a flag of `run` (CMD / args:).
    key = tmp_path / "secret.key"
    key.write_bytes(os.urandom(32))
    env = {"TC_SERVER_AUTHENTICATION_PROVIDERS": "token"}
    with started(tmp_path, "--token-secret-key", f"file://{key}", env=env) as (server, outcome):
        assert outcome.code is None, outcome.output
        healthy_admin(server)
        done = healthcheck(clean_env(**env, TC_SERVER_ADMIN_LISTEN=f"127.0.0.1:{server.admin_port}"))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("args", [["--admin-listen", "127.0.0.1:1"], ["--admin-tls"]])
def test_healthcheck_usage_errors_do_not_exit_with_dockers_reserved_code(args: list[str]) -> None:
    # healthcheck.py / cli._healthcheck: "Exit code 1 on any failure: Docker reads 1 as unhealthy and
    # reserves 2". The README tells whoever sets the admin port by flags to "give a matching --health-cmd";
    # the one that comes to mind passes the same flag to healthcheck, and argparse exits 2.
    done = tc_server(["healthcheck", *args], clean_env())
    assert done.returncode in (0, 1), (done.returncode, done.stderr)


def test_healthcheck_asks_its_own_admin_port_past_a_proxy_in_the_environment(tmp_path: Path) -> None:
    # urlopen took http_proxy from the environment: a container with a corporate proxy there asked the proxy
    # for 127.0.0.1's /healthz, and was unhealthy for good (a review). Here the proxy named refuses connections.
    with started(tmp_path) as (server, outcome):
        assert outcome.code is None, outcome.output
        healthy_admin(server)
        dead_proxy = f"http://127.0.0.1:{free_port()}"
        done = healthcheck(clean_env(TC_SERVER_ADMIN_LISTEN=f"127.0.0.1:{server.admin_port}",
                                     http_proxy=dead_proxy, HTTP_PROXY=dead_proxy))
    assert done.returncode == 0, done.stderr
