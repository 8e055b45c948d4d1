"""What an operator reads -- the README's *Configuration* table, docs/security.md's table, `tc-server run
--help` -- against tc_server/config.py."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path

from tc_server.cli import build_parser
from tc_server.config import SETTING_NAMES, Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_flags() -> set[str]:
    """Flags that have a row of their own (`--flag` in the first cell) in a settings table of the docs."""
    found: set[str] = set()
    for path in DOCS:
        for line in path.read_text().splitlines():
            if line.startswith("| `--"):
                first_cell = line.strip("|").split("|")[0]
                found |= set(re.findall(r"`(--[a-z0-9-]+)`", first_cell))
    return found


def test_every_setting_has_a_row_with_its_default_in_the_docs() -> None:
    # README: "Every setting is a flag of `tc-server run`, an environment variable and a TOML key" followed by
    # the table; docs/security.md "has every setting" of security. log_level is not mentioned anywhere.
    missing = sorted(f"--{name.replace('_', '-')}" for name in SETTING_NAMES
                     if f"--{name.replace('_', '-')}" not in documented_flags())
    assert not missing, f"settings without a row (name, default, meaning) in README.md or docs/*.md: {missing}"


def run_actions() -> dict[str, argparse.Action]:
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if a.dest == "command"]  # noqa: SLF001
    assert isinstance(subparsers, argparse._SubParsersAction)  # noqa: SLF001
    return {a.dest: a for a in subparsers.choices["run"]._actions}  # noqa: SLF001


# Metavars `run --help` uses for values that are not numbers.
NON_NUMBER_METAVARS = {"ADDRESS", "PRINCIPAL", "BROKER", "COORDINATOR", "TRANSACTION", "FLIGHT",
                       "URL", "LISTEN", "DIR", "FILE", "ROLES", "KEY", "CLAIM"}


def test_number_settings_are_not_shown_as_taking_a_name() -> None:
    # The metavar is the last word of the setting's name (cli._add_setting_flags): the usage line reads
    # `--max-connections-per-address ADDRESS` (the same word as `--oxia-address ADDRESS`, a HOST:PORT),
    # `--max-open-transactions-per-principal PRINCIPAL`, `--delivery-max-in-flight-per-broker BROKER`.
    actions = run_actions()
    misleading = [f"--{f.name.replace('_', '-')} {actions[f.name].metavar}" for f in fields(Settings)
                  if type(f.default) in (int, float) and actions[f.name].metavar in NON_NUMBER_METAVARS]
    assert not misleading, f"numbers shown as names in `tc-server run --help`: {misleading}"


def test_the_tls_advertised_url_is_shown_as_a_url() -> None:
    assert run_actions()["advertised_url_tls"].metavar == "URL"  # shown as `--advertised-url-tls TLS`
