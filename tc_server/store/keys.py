"""Key rules shared by the in-process backends, written once so memory and embedded agree."""

from __future__ import annotations

import time

from tc_server.store.api import SEQUENCE_DIGITS


def is_child(key: str, prefix: str) -> bool:
    """True if ``key`` is directly under ``prefix`` (no further ``/``): the scan_prefix filter."""
    return key.startswith(prefix) and "/" not in key[len(prefix):]


def sequence_suffix(key: str, prefix: str) -> int | None:
    """The number of a sequential key ``prefix-%020d``, or None if ``key`` is not one.

    Oxia (db_sequences.go) takes the highest key below ``prefix-<max>`` and adds the delta; only
    keys of exactly that shape count, so ``prefix-00000000000000000007/x`` is not a sequence key.
    """
    head = prefix + "-"
    if not key.startswith(head):
        return None
    digits = key[len(head):]
    if len(digits) != SEQUENCE_DIGITS or not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)


def sequence_upper_bound(prefix: str) -> str:
    """A key above every ``prefix-%020d`` key (``:`` sorts right after ``9``)."""
    return prefix + "-" + ":"


def now_ms() -> int:
    return int(time.time() * 1000)
