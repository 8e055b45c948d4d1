"""tc-server: a standalone Apache Pulsar transaction coordinator."""

# pyproject.toml's version (tests/test_version.py checks they agree): CONNECTED's server_version,
# tc_server_build_info and `tc-server --version` say it.
__version__ = "0.1.0"
