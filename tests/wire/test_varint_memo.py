"""The fast varint of the response encoders (a table for two bytes, a memo of the high bytes of txn ids:
issue 13) against the plain loop, at every boundary and over runs of ids at the clock's floor."""

from __future__ import annotations

import random

import pytest

from tc_server.wire.codec import registry

_BOUNDARIES = [0, 1, 127, 128, 129, 255, 256, 16383, 16384, 16385, (1 << 21) - 1, 1 << 21,
               (1 << 28) - 1, 1 << 28, (1 << 28) + 1, (1 << 28) + 127, (1 << 28) + 128, (1 << 35) - 1, 1 << 35,
               (1 << 42) + 5, (1 << 56) - 1, 1 << 56, (1 << 63) - 1, 1 << 63, (1 << 63) + 1,
               (1 << 64) - 2, (1 << 64) - 1, 1_700_000_000_000_000_000, 1_700_000_000_000_016_383,
               1_700_000_000_000_016_384]


@pytest.mark.parametrize("value", _BOUNDARIES)
def test_varint_matches_the_loop(value: int) -> None:
    registry._tails.clear()
    assert registry.varint(value) == registry._varint_loop(value)
    assert registry.varint(value) == registry._varint_loop(value)  # memo hit
    assert registry.varint(value ^ 1) == registry._varint_loop(value ^ 1)


def test_varint_matches_the_loop_over_runs() -> None:
    rng = random.Random(7)
    values = [rng.randrange(0, 1 << 64) for _ in range(3000)] + [rng.randrange(0, 1 << 30) for _ in range(3000)]
    base = 1_764_000_000_000_000_000
    values += list(range(base - 300, base + 300)) + list(range(base + 16_000, base + 16_800))
    for value in values:
        assert registry.varint(value) == registry._varint_loop(value), value
