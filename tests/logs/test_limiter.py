"""The log limiter (tc_server/logs.py LogLimiter): one line per kind and interval, with a count of those left
out, and a memory that does not grow with the kinds a client can vary."""

from __future__ import annotations

from tc_server.logs import MAX_LIMITED_KINDS, LogLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_kinds_a_client_varies_are_forgotten_once_quiet_and_nothing_left_out_is_lost() -> None:
    # Kinds were never forgotten: a path or a topic in the key (admin store errors, refused deliveries) grew
    # the limiter with every new one (a review of hostile input).
    clock = Clock()
    limiter = LogLimiter(interval_s=1.0, clock=clock)
    assert limiter.allow("held") == 0
    assert limiter.allow("held") is None  # left out: remembered until it is said
    for n in range(3 * MAX_LIMITED_KINDS):
        clock.now = 2.0 + n / 1000  # each kind once, most of them quiet by the time the limiter looks
        assert limiter.allow(f"path-{n}") == 0
    assert len(limiter._next_at) <= 2 * MAX_LIMITED_KINDS
    assert limiter.allow("held") == 1  # the line left out is still counted in the next one
