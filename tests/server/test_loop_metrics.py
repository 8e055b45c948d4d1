"""The Loop* metric families (tc_server/metrics.py): the exposition a scrape sees is what
prometheus_client's own Counter and Histogram write for the same updates, so dashboards and alerts
read the same series."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from tc_server.metrics import LoopCounter, LoopHistogram

BUCKETS = (0.0001, 0.00025, 0.001, 1, 5)


def _updated(counter: LoopCounter | Counter, histogram: LoopHistogram | Histogram) -> None:
    counter.labels("a", "x")
    counter.labels("a", "y").inc()
    counter.labels(kind="a", result="y").inc(2.5)
    child = histogram.labels("NEW_TXN")
    # On a bound, between bounds, below the first and above the last.
    for value in (0.0001, 0.0002, 0.00001, 3, 7, 1):
        child.observe(value)
    histogram.labels("END_TXN")


def test_loop_families_expose_what_prometheus_client_exposes() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    _updated(LoopCounter("t_ops", "ops", ["kind", "result"], ours),
             LoopHistogram("t_seconds", "latency", ["command"], ours, buckets=BUCKETS))
    _updated(Counter("t_ops", "ops", ["kind", "result"], registry=theirs),
             Histogram("t_seconds", "latency", ["command"], buckets=BUCKETS, registry=theirs))
    assert generate_latest(ours).decode() == generate_latest(theirs).decode()
    assert ours.get_sample_value("t_ops_total", {"kind": "a", "result": "y"}) == 3.5
    assert ours.get_sample_value("t_seconds_bucket", {"command": "NEW_TXN", "le": "0.0001"}) == 2


def test_a_family_refuses_a_wrong_label_count() -> None:
    family = LoopCounter("t_refused", "refused", ["kind", "result"], CollectorRegistry())
    with pytest.raises(ValueError, match="t_refused"):
        family.labels("only-one")
