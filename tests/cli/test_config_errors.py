"""Settings a person can get wrong are refused at start with one line naming the setting (tc_server/config.py),
never a traceback and never accepted to fail later."""

from __future__ import annotations

import json
import re

import pytest

from tc_server.cli import main
from tc_server.config import ConfigError, load_settings


def settings_from(**env: str):
    return load_settings(environ={f"TC_SERVER_{name.upper()}": value for name, value in env.items()})


@pytest.mark.parametrize(("name", "value", "message"), [
    ("advertised_url", "pulsar://h:99999", "expected HOST:PORT"),
    # What pulsar://$(POD_IP):6660 becomes on an IPv6 cluster.
    ("advertised_url", "pulsar://fd00::5:6660", "an IPv6 address must be in brackets, as in [fd00::5]:6660"),
    ("advertised_url", "pulsar://h:0", "port 0"),
    ("advertised_url", "pulsar://h:6650/path", "without a path"),
    ("advertised_url", "pulsar://h:6650?x=1", "without a path"),
    ("advertised_url", "pulsar+ssl://h:6651", "must be pulsar://HOST:PORT"),
    ("advertised_url_tls", "pulsar+ssl://h:99999", "expected HOST:PORT"),
    ("advertised_url_tls", "pulsar+ssl://fd00::5:6661", "an IPv6 address must be in brackets"),
    ("advertised_url_tls", "pulsar+ssl://h:0", "port 0"),
    ("upstream_url", "pulsar://b:0", "port 0"),
    ("upstream_url", "pulsar://b:6650/admin", "without a path"),
    ("upstream_url", "pulsar://b", "expected HOST:PORT"),
    ("upstream_url", "http://b:8080", "must be pulsar://HOST:PORT or pulsar+ssl://HOST:PORT"),
    ("oxia_address", "oxia:0", "port 0"),
    ("oxia_address", ":6648", "no host"),
    ("oxia_address", "fd00::7:6648", "an IPv6 address must be in brackets"),
])
def test_a_bad_address_is_a_configuration_error(name: str, value: str, message: str) -> None:
    env = {name: value}
    if name == "advertised_url_tls":  # it needs a TLS listener, which needs its files
        env |= {"tls_listen": "127.0.0.1:6651", "tls_cert_file": "c.pem", "tls_key_file": "k.pem"}
    with pytest.raises(ConfigError, match=f"^{name}: .*{re.escape(message)}"):
        settings_from(**env)


@pytest.mark.parametrize("name", ["advertised_url", "upstream_url"])
@pytest.mark.parametrize("url", ["pulsar://tc:s3cr3t@b:6650", "http://tc:s3cr3t@b:6650", "pulsar://tc:s3cr3t@b:6650/x",
                                 "tc:s3cr3t@b:6650"])
def test_credentials_in_a_url_are_refused_without_quoting_them(name: str, url: str) -> None:
    # Before, a URL with another scheme or a path was refused for that, quoting it, password and all.
    with pytest.raises(ConfigError, match=f"^{name}: user:password@ is not supported") as raised:
        settings_from(**{name: url})
    assert "s3cr3t" not in str(raised.value)


def test_a_config_file_not_in_utf8_is_a_configuration_error(tmp_path) -> None:
    # A Latin-1 comment (an editor's default on some desktops): before, UnicodeDecodeError escaped as a
    # traceback from `run` and from the image's HEALTHCHECK.
    config = tmp_path / "tc-server.toml"
    config.write_bytes(b'# r\xe9glages du coordinateur\ncluster = "prod"\n')
    with pytest.raises(ConfigError, match="tc-server.toml: not UTF-8"):
        load_settings(environ={}, config_file=str(config))


@pytest.mark.parametrize("setting", ["broker_client_auth_params", "token_secret_key"])
def test_a_secret_setting_of_the_wrong_toml_type_is_refused_without_quoting_it(tmp_path, setting: str) -> None:
    # A TOML inline table (the shape of Pulsar's JSON parameters) was quoted in full, token and all.
    config = tmp_path / "tc-server.toml"
    config.write_text(f'{setting} = {{ token = "s3cr3t" }}\n')
    with pytest.raises(ConfigError, match=f"^{setting} .*expected a string, got a dict") as raised:
        load_settings(environ={}, config_file=str(config))
    assert "s3cr3t" not in str(raised.value)


@pytest.mark.parametrize("value", ["pulsar://[fd00::5]:6660", "pulsar://10.1.2.3:6660", "pulsar://tc-server-0:6650"])
def test_good_advertised_urls_are_accepted(value: str) -> None:
    assert settings_from(advertised_url=value).advertised_url == value


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_a_bad_advertised_url_stops_run_with_one_line(capsys: pytest.CaptureFixture[str], log_format: str) -> None:
    # In the log's format: a JSON log pipeline that takes JSON lines only dropped the plain line, and with
    # it the reason a container did not start.
    assert main(["run", "--advertised-url", "pulsar://h:99999", "--log-format", log_format]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    said = err.strip() if log_format == "console" else json.loads(err)["event"]
    assert said.startswith("tc-server: configuration error: advertised_url: "), err


@pytest.mark.parametrize(("value", "urls"), [
    # Pulsar's serviceUrl form: one scheme, several hosts (what the --upstream-url help shows).
    ("pulsar://b1:6650,b2:6650", ["pulsar://b1:6650", "pulsar://b2:6650"]),
    ("pulsar://b1:6650,pulsar://b2:6650", ["pulsar://b1:6650", "pulsar://b2:6650"]),
    ("pulsar+ssl://b1:6651, b2:6651", ["pulsar+ssl://b1:6651", "pulsar+ssl://b2:6651"]),
    ("pulsar://127.0.0.1:6650,pulsar-broker:6650,[fd00::9]:6650",
     ["pulsar://127.0.0.1:6650", "pulsar://pulsar-broker:6650", "pulsar://[fd00::9]:6650"]),
    # As Pulsar's clients take them, in one form: any case of scheme, a slash after the port.
    ("PULSAR+SSL://b1:6651/,Pulsar+SSL://b2:6651", ["pulsar+ssl://b1:6651", "pulsar+ssl://b2:6651"]),
])
def test_upstream_url_takes_both_multi_host_forms(value: str, urls: list[str]) -> None:
    assert settings_from(upstream_url=value).upstream_urls == urls


def test_upstream_url_needs_a_scheme_first() -> None:
    with pytest.raises(ConfigError, match=r"^upstream_url: must be pulsar://HOST:PORT or pulsar\+ssl://HOST:PORT"):
        settings_from(upstream_url="b1:6650,pulsar://b2:6650")


@pytest.mark.parametrize(("name", "value"), [
    ("keepalive_s", "1e-9"), ("request_timeout_s", "0.0001"), ("keepalive_s", "0.09"),
    ("gc_interval_s", "0"), ("authentication_refresh_check_s", "0.01"), ("tls_cert_refresh_check_s", "0.001"),
])
def test_timers_below_a_tenth_of_a_second_are_refused(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"^{name}: must be a number of seconds of at least 0.1 "):
        settings_from(**{name: value})


def test_a_tenth_of_a_second_is_accepted() -> None:
    assert settings_from(keepalive_s="0.1", request_timeout_s="0.1").request_timeout_s == 0.1


@pytest.mark.parametrize("name", ["cluster", "data_dir", "oxia_namespace"])
def test_empty_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=f"^{name}: must not be empty"):
        settings_from(**{name: ""})


def test_a_misspelled_environment_variable_is_named_with_the_closest_setting() -> None:
    with pytest.raises(ConfigError, match=r"^environment: unknown setting TC_SERVER_LISTN \(did you mean "
                                          r"TC_SERVER_LISTEN\?\)"):
        load_settings(environ={"TC_SERVER_LISTN": "0.0.0.0:6651"})
    with pytest.raises(ConfigError, match=r"unknown setting TC_SERVER_NONSENSE \(tc-server run --help"):
        load_settings(environ={"TC_SERVER_NONSENSE": "1"})


def test_a_misspelled_toml_key_is_named_with_the_closest_setting(tmp_path) -> None:
    config = tmp_path / "tc-server.toml"
    config.write_text('advertized_url = "pulsar://h:6650"\n')
    with pytest.raises(ConfigError, match=r"unknown setting 'advertized_url' \(did you mean advertised_url\?\)"):
        load_settings(environ={}, config_file=str(config))


@pytest.mark.parametrize("name", [
    # The test suite's knobs, which a server a test starts inherits (tests/store/oxia_backends.py, tests/v5).
    "TC_SERVER_TEST_OXIA_BIN", "TC_SERVER_JAVA21", "TC_SERVER_V5_OXIA_ADDRESS",
])
def test_variables_read_by_others_are_not_settings_and_not_refused(name: str) -> None:
    assert load_settings(environ={name: "/somewhere"}) == load_settings(environ={})


def test_docker_links_and_the_broker_token_variable_are_not_refused() -> None:
    # Docker's legacy --link variables, and the variable --broker-client-auth-params env:NAME names
    # (docs/security.md), whatever their prefix: they are no misspelled settings.
    links = {"TC_SERVER_NAME": "/client/tc-server", "TC_SERVER_ENV_TC_SERVER_LISTEN": "0.0.0.0:6650"}
    assert load_settings(environ=links) == load_settings(environ={})
    # (The plugin beside the parameters: without it they are refused, as they would be ignored.)
    token = {"TC_SERVER_BROKER_TOKEN": "eyJ...", "TC_SERVER_BROKER_CLIENT_AUTH_PARAMS": "env:TC_SERVER_BROKER_TOKEN",
             "TC_SERVER_BROKER_CLIENT_AUTH_PLUGIN": "token"}
    assert load_settings(environ=token).broker_client_auth_params == "env:TC_SERVER_BROKER_TOKEN"
    assert load_settings(environ={"TC_SERVER_BROKER_TOKEN": "eyJ..."},
                         flags={"broker_client_auth_params": "env:TC_SERVER_BROKER_TOKEN",
                                "broker_client_auth_plugin": "token"}) is not None
    with pytest.raises(ConfigError, match="unknown setting TC_SERVER_NAME"):
        load_settings(environ={"TC_SERVER_NAME": "tc-1"})  # not a link's value: a misspelled setting


def test_kubernetes_service_links_are_not_refused() -> None:
    # What the kubelet puts in every pod of a namespace holding a Service named tc-server (both manifests
    # define one) or tc-server-headless.
    links = {"TC_SERVER_SERVICE_HOST": "10.96.0.10", "TC_SERVER_SERVICE_PORT": "6650",
             "TC_SERVER_SERVICE_PORT_PULSAR": "6650", "TC_SERVER_SERVICE_PORT_TC_HTTP": "8080",
             "TC_SERVER_PORT": "tcp://10.96.0.10:6650", "TC_SERVER_PORT_6650_TCP": "tcp://10.96.0.10:6650",
             "TC_SERVER_PORT_6650_TCP_PROTO": "tcp", "TC_SERVER_PORT_6650_TCP_PORT": "6650",
             "TC_SERVER_PORT_6650_TCP_ADDR": "10.96.0.10", "TC_SERVER_HEADLESS_PORT": "tcp://10.96.0.11:6650"}
    assert load_settings(environ=links) == load_settings(environ={})
    # The shape of a service link is not a loophole for a misspelled setting.
    with pytest.raises(ConfigError, match="unknown setting TC_SERVER_ADMIN_PORT"):
        load_settings(environ={"TC_SERVER_ADMIN_PORT": "8081"})


def test_toml_lists_and_numbers_are_read_as_their_types_say(tmp_path) -> None:
    # str() made superuser_roles = ["admin", "ops"] the text "['admin', 'ops']" (no role ever matched,
    # and nothing said so), and int() made workers = 2.9 two.
    config = tmp_path / "tc-server.toml"
    config.write_text('superuser_roles = ["admin", "ops"]\nupstream_url = ["pulsar://b1:6650", "pulsar://b2:6650"]\n')
    settings = load_settings(environ={}, config_file=str(config))
    assert settings.superuser_roles == "admin,ops"
    assert settings.upstream_urls == ["pulsar://b1:6650", "pulsar://b2:6650"]
    for line, message in (("workers = 2.9", "workers .*expected a whole number, got 2.9"),
                          ("superuser_roles = [1, 2]", "superuser_roles .*a list must hold strings only"),
                          ("cluster = { name = 'a' }", "cluster .*expected a string"),
                          ("cluster = true", "cluster .*expected a string")):
        config.write_text(line + "\n")
        with pytest.raises(ConfigError, match=message):
            load_settings(environ={}, config_file=str(config))
    config.write_text("workers = 2.0\ncoordinators = 16\n")
    assert load_settings(environ={}, config_file=str(config)).workers == 2
