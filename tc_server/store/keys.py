"""Key rules shared by the in-process backends, written once so memory and embedded agree."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tc_server.store.api import SEQUENCE_DIGITS, exact_index_range

if TYPE_CHECKING:
    from tc_server.store.api import MetadataStore


def is_child(key: str, prefix: str) -> bool:
    """True if ``key`` is directly under ``prefix`` (no further ``/``): the scan_prefix filter."""
    return key.startswith(prefix) and "/" not in key[len(prefix):]


async def index_has_by_scan(store: MetadataStore, index_name: str, secondary_key: str, *,
                            partition_key: str | None = None) -> bool:
    """``MetadataStore.index_has`` of the in-process backends (their ``index_has``): their scans cost no
    round trip. Reads the whole range, not just its first record: the few records of one secondary key,
    and no scan is left open."""
    found = False
    async for _ in store.scan_index(index_name, *exact_index_range(secondary_key), partition_key=partition_key):
        found = True
    return found


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
