"""Values load_settings accepts although they cannot do what the operator meant."""

from __future__ import annotations

from pathlib import Path

import pytest

from tc_server.config import ConfigError, load_settings
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
