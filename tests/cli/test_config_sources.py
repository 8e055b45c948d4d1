"""tc_server/config.py promises "Errors name the setting and where its value came from, so a typo in a
compose file is found at start". The type errors do ("workers (from environment TC_SERVER_WORKERS): ..."),
but every refusal of Settings.validate() (ranges, addresses, combinations) names the setting only: with a
ConfigMap, a TOML file and a CMD in play, the operator cannot tell which one to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tc_server.config import ConfigError, load_settings
from tests.cli.run_as_operator import clean_env, tc_server

# (setting, a value validate() refuses)
REFUSED = [
    ("coordinators", "0"),
    ("listen", "6650"),
    ("log_level", "INFO"),
    ("max_txn_timeout_ms", "-1"),
]


@pytest.mark.parametrize(("name", "value"), REFUSED)
def test_a_refused_value_from_the_environment_names_the_variable(name: str, value: str) -> None:
    variable = f"TC_SERVER_{name.upper()}"
    with pytest.raises(ConfigError) as raised:
        load_settings(environ={variable: value})
    assert variable in str(raised.value), str(raised.value)


@pytest.mark.parametrize(("name", "value"), REFUSED)
def test_a_refused_value_from_the_file_names_the_file(tmp_path: Path, name: str, value: str) -> None:
    config = tmp_path / "tc-server.toml"
    config.write_text(f'{name} = "{value}"\n')
    with pytest.raises(ConfigError) as raised:
        load_settings(environ={}, config_file=str(config))
    assert str(config) in str(raised.value), str(raised.value)


@pytest.mark.parametrize(("name", "value"), REFUSED)
def test_a_refused_value_from_a_flag_names_the_flag(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(flags={name: value}, environ={})
    assert f"--{name.replace('_', '-')}" in str(raised.value), str(raised.value)


def test_run_says_which_source_holds_the_bad_value(tmp_path: Path) -> None:
    # The file says 16, the environment (a ConfigMap) 0: env wins, and the message must say it was env.
    config = tmp_path / "tc-server.toml"
    config.write_text("coordinators = 16\n")
    done = tc_server(["run", "--config", str(config)], clean_env(TC_SERVER_COORDINATORS="0"))
    assert done.returncode == 2, done.stderr
    assert "TC_SERVER_COORDINATORS" in done.stderr, done.stderr
