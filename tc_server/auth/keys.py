"""Key material and secrets from settings, read the way brokers read ``tokenSecretKey`` and
``tokenPublicKey`` (AuthTokenUtils.readKeyFromUrl): ``data:;base64,<key>``, ``file:///path`` (the
raw bytes of the file), or else the key itself in base64.

Errors name the setting and the problem, never the value: these settings hold secrets.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from urllib.parse import unquote_to_bytes, urlsplit

from tc_server.config import ConfigError


def read_key(setting: str, value: str) -> bytes:
    """The key bytes a ``data:``, ``file:`` or base64 setting names. Raises ConfigError."""
    value = value.strip()
    if value.startswith("data:"):
        return _data_url(setting, value)
    if value.startswith("file:"):
        return _file_url(setting, value)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{setting}: not a data: URL, a file: URL or base64 key material") from None


def read_secret_text(setting: str, value: str) -> str:
    """A secret given inline or as ``file:///path`` (the file's text, surrounding whitespace removed,
    so a trailing newline of ``echo token > file`` does not count). Raises ConfigError."""
    if value.startswith("file:"):
        try:
            return _file_url(setting, value).decode("utf-8", errors="strict").strip()
        except UnicodeDecodeError:
            # Not the traceback of a start (exit 1) but the setting's one line (exit 2), like every other bad file.
            raise ConfigError(f"{setting}: the file it names is not UTF-8 text") from None
    return value


def file_url_path(setting: str, value: str) -> Path:
    """``file:///a/b`` and ``file:/a/b`` name /a/b (as java.net.URI does). Raises ConfigError for a path that is
    not UTF-8 once its %-escapes are decoded, or that holds a NUL (no file has such a name)."""
    parts = urlsplit(value)
    try:
        path = unquote_to_bytes(parts.path).decode()
    except UnicodeDecodeError:
        raise ConfigError(f"{setting}: the file: URL's path is not UTF-8 once its %-escapes are decoded") from None
    if "\0" in path:
        raise ConfigError(f"{setting}: the file: URL's path holds a NUL byte")
    return Path(path)


def _file_url(setting: str, value: str) -> bytes:
    path = file_url_path(setting, value)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path}: {exc.strerror}") from None


def _data_url(setting: str, value: str) -> bytes:
    # RFC 2397: data:[<mediatype>][;base64],<data>
    header, sep, payload = value[len("data:"):].partition(",")
    if not sep:
        raise ConfigError(f"{setting}: a data: URL needs a ',' before the key (data:;base64,<key>)")
    if header.endswith(";base64"):
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{setting}: the data: URL's key is not valid base64") from None
    return unquote_to_bytes(payload)
