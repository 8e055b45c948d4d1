"""Values load_settings accepts although they cannot do what the operator meant."""

from __future__ import annotations

from pathlib import Path

import pytest

from tc_server.app import advertised_url_for
from tc_server.config import ConfigError, load_settings, parse_hostport
from tests.cli.run_as_operator import start_outcome


@pytest.mark.parametrize("name", ["cluster", "data_dir", "oxia_namespace"])
@pytest.mark.parametrize("value", [" ", "\t"])
def test_blank_names_are_refused_as_empty_ones_are(name: str, value: str) -> None:
    # validate(): "An empty cluster is an absent `cluster` label (dashboards filter on it), an empty data_dir
    # the working directory, an empty namespace not the brokers' one" -- checked with bool(), so a blank
    # (a YAML `TC_SERVER_CLUSTER: " "`, a templated value that came out empty) passes.
    with pytest.raises(ConfigError, match=f"^{name}"):
        load_settings(environ={f"TC_SERVER_{name.upper()}": value})


def test_an_advertised_wildcard_address_is_refused_or_warned(tmp_path: Path) -> None:
    # Copying --listen into --advertised-url: LOOKUP then sends every client to 0.0.0.0, which a client on
    # another host reads as itself. Derived from a wildcard --listen, tc-server warns ("clients on other
    # hosts cannot reach"); set explicitly to one, it says nothing.
    outcome = start_outcome(tmp_path, "--advertised-url", "pulsar://0.0.0.0:6650")
    refused = outcome.code not in (None, 0)
    warned = any("advertised" in str(line).lower() for line in outcome.warnings())
    assert refused or warned, outcome.output


def test_a_config_file_with_a_utf8_byte_order_mark_is_read_or_named(tmp_path: Path) -> None:
    # Windows editors (Notepad, PowerShell's Out-File -Encoding utf8) write UTF-8 with a BOM. The file is
    # UTF-8, yet the refusal reads "Invalid statement (at line 1, column 1)" with nothing on the cause.
    config = tmp_path / "tc-server.toml"
    config.write_bytes(b'\xef\xbb\xbfcluster = "prod"\n')
    try:
        settings = load_settings(environ={}, config_file=str(config))
    except ConfigError as exc:
        assert "BOM" in str(exc) or "byte order mark" in str(exc).lower(), str(exc)
    else:
        assert settings.cluster == "prod"


@pytest.mark.parametrize(("setting", "value", "says"), [
    ("--broker-client-auth-params", "file://{not_utf8}", "the file it names is not UTF-8 text"),
    ("--broker-client-auth-params", "file:///tmp/%ff", "path is not UTF-8 once its %-escapes are decoded"),
    ("--broker-client-auth-params", "file:///tmp/a%00b", "path holds a NUL byte"),
    ("--token-secret-key", "file:///tmp/%ff", "path is not UTF-8 once its %-escapes are decoded"),
    ("--token-public-key", "file:///tmp/x%00", "path holds a NUL byte"),
])
def test_a_file_setting_that_cannot_be_read_as_named_is_one_line_not_a_traceback(
        tmp_path: Path, setting: str, value: str, says: str) -> None:
    # A token file that is not UTF-8, or a file: URL whose path decodes to no file name, ended the start with a
    # traceback and exit 1, where every other bad file is one line naming the setting and exit 2 (a review).
    not_utf8 = tmp_path / "token"
    not_utf8.write_bytes(b"\xff\xfe\x00bad")
    flags = [setting, value.format(not_utf8=not_utf8)]
    if setting == "--broker-client-auth-params":
        flags += ["--upstream-url", "pulsar://127.0.0.1:1", "--broker-client-auth-plugin", "token"]
    else:
        flags += ["--authentication-providers", "token"]
    outcome = start_outcome(tmp_path, *flags)
    assert outcome.code == 2, outcome.output
    assert "Traceback" not in outcome.output, outcome.output
    name = setting.removeprefix("--").replace("-", "_")
    assert f"tc-server: configuration error: {name}: " in outcome.output and says in outcome.output, outcome.output


@pytest.mark.parametrize(("listen", "url"), [("[::1]:6650", "pulsar://[::1]:6650"), ("[0::0]:6650", "pulsar://127.0.0.1:6650"),
                                           ("0.0.0.0:6650", "pulsar://127.0.0.1:6650"), ("h:6650", "pulsar://h:6650")])
def test_the_url_handed_out_for_a_listener_is_one_clients_can_split(listen: str, url: str) -> None:
    # Without --advertised-url, LOOKUP named pulsar://::1:PORT (no client can split it), and the wildcard
    # spelled [0::0] itself, without the warning the other spellings of every address get (a review).
    assert advertised_url_for(*parse_hostport(listen)) == url
