"""The Grafana dashboard queries only series tc-server exports, with labels those series carry."""

from __future__ import annotations

from typing import Any

import pytest

from tc_server.config import Settings
from tc_server.metrics import METRIC_NAMES, REQUEST_BUCKETS, TXN_LATENCY_BUCKETS

from .manifests import (
    dashboard,
    dashboard_exprs,
    dashboard_panels,
    exported_families,
    exported_sample_names,
    grouping_labels,
    metric_names,
    selectors,
)

# Labels Prometheus attaches to every target (static_configs, the PodMonitors' relabelings).
TARGET_LABELS = frozenset({"instance", "job", "namespace", "pod", "container"})

def used_exported_sample_names() -> set[str]:
    return {name for expr in dashboard_exprs(dashboard()) for name in metric_names(expr)}


def test_metric_names_lists_every_registered_family() -> None:
    assert set(METRIC_NAMES) == set(exported_families())


def test_promql_name_extraction() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, command) (rate(tc_server_request_seconds_bucket'
            '{command="END_TXN", instance=~"$instance"}[$__rate_interval]))) / on (instance) '
            'group_left count(pulsar_txn_active_count) or vector(0)')
    assert metric_names(expr) == {"tc_server_request_seconds_bucket", "pulsar_txn_active_count"}
    assert grouping_labels(expr) == {"le", "command", "instance"}
    assert metric_names("label_values(pulsar_txn_active_count, cluster)") == {"pulsar_txn_active_count"}


def test_dashboard_has_queries() -> None:
    exprs = dashboard_exprs(dashboard())
    assert len(exprs) > 20
    assert all(metric_names(e) for e in exprs), [e for e in exprs if not metric_names(e)]


def test_every_queried_series_is_exported() -> None:
    known = exported_sample_names()
    unknown = sorted(used_exported_sample_names() - set(known))
    assert not unknown, f"the dashboard queries series tc-server does not export: {unknown}"


@pytest.mark.parametrize("family", ["pulsar_txn_created_total", "pulsar_txn_committed_total",
                                    "pulsar_txn_aborted_total", "pulsar_txn_timeout_total",
                                    "pulsar_txn_active_count", "pulsar_txn_execution_latency_seconds",
                                    "tc_server_request_seconds", "tc_server_request_errors_total",
                                    "pulsar_txn_metadata_store_header_cas_total",
                                    "pulsar_txn_metadata_store_op_writes_total",
                                    "pulsar_txn_metadata_store_outstanding_op_records",
                                    "tc_server_coordinator_leader", "tc_server_connections"])
def test_the_issue_s_panels_are_there(family: str) -> None:
    assert family in {exported_sample_names().get(name) for name in used_exported_sample_names()}


def test_label_matchers_and_groupings_name_real_labels() -> None:
    fams, samples = exported_families(), exported_sample_names()
    problems = []
    for expr in dashboard_exprs(dashboard()):
        labels_here: set[str] = set(TARGET_LABELS)
        for name, matchers in selectors(expr):
            if name not in samples:
                continue  # test_every_queried_series_is_exported reports it
            _, labels = fams[samples[name]]
            allowed = labels | TARGET_LABELS | ({"le"} if name.endswith("_bucket") else set())
            labels_here |= allowed
            problems += [f"{name}: no label {label!r} in {expr}" for label, _, _ in matchers
                         if label not in allowed]
        problems += [f"grouping by unknown label {label!r} in {expr}"
                     for label in grouping_labels(expr) - labels_here]
    assert not problems, "\n".join(problems)


def test_histogram_quantile_reads_buckets_grouped_by_le() -> None:
    for expr in dashboard_exprs(dashboard()):
        if "histogram_quantile" in expr:
            assert "le" in grouping_labels(expr), expr
            assert all(n.endswith("_bucket") for n in metric_names(expr)), expr


def test_counters_are_read_through_rate() -> None:
    for expr in dashboard_exprs(dashboard()):
        for name in metric_names(expr):
            if name.endswith(("_total", "_bucket", "_sum")) or (
                    name.endswith("_count") and name in exported_sample_names() and name != "pulsar_txn_active_count"):
                assert "rate(" in expr, f"{name} is cumulative; read it through rate(): {expr}"


def _panel_datasources(doc: dict[str, Any]) -> list[Any]:
    found = []
    for panel in dashboard_panels(doc):
        if panel.get("type") != "row":
            found.append(panel.get("datasource"))
            found += [t.get("datasource") for t in panel.get("targets", [])]
    found += [v.get("datasource") for v in doc["templating"]["list"] if v.get("type") == "query"]
    return found


def test_datasource_and_cluster_variables() -> None:
    doc = dashboard()
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "cluster" in variables
    assert all(ds == {"type": "prometheus", "uid": "${datasource}"} for ds in _panel_datasources(doc))
    # Only the pulsar_txn_* coordinator series carry `cluster`; each of them must be filtered by it.
    for expr in dashboard_exprs(doc):
        for name, matchers in selectors(expr):
            if name in exported_sample_names() and "cluster" in exported_families()[exported_sample_names()[name]][1]:
                assert ("cluster", "=~", "$cluster") in matchers, expr
    # The other series are scoped to the cluster through $instance, whose values are the chosen cluster's
    # instances: its "All" must be Grafana's own (their list), not an allValue. With ".*" every cluster's
    # series showed (a review: cluster B's unled coordinator 3 hidden by cluster A's led one).
    assert variables["instance"].get("allValue") in (None, ""), variables["instance"]
    assert "$cluster" in variables["instance"]["query"]["query"]


def test_panel_ids_unique() -> None:
    ids = [p["id"] for p in dashboard_panels(dashboard())]
    assert len(ids) == len(set(ids))


def test_request_latency_buckets_reach_past_what_the_settings_let_a_request_take() -> None:
    # The top bucket was 5 s: histogram_quantile cannot say more than the highest finite bound, and the
    # p99 panels flatlined at 5 s while requests waited out --request-timeout-s (10 s) or END_TXN its
    # participants (--participant-wait-s, 25 s): in exactly the incidents the panels are for.
    defaults = Settings()
    assert REQUEST_BUCKETS[-2] >= max(defaults.request_timeout_s, defaults.participant_wait_s)


def test_execution_latency_buckets_reach_the_default_longest_transaction() -> None:
    # The top bucket was 3000 s (Pulsar's) while the default --max-txn-timeout-ms lets a txn run a day: the
    # execution-latency quantiles of long transactions stopped at 3000 s.
    assert TXN_LATENCY_BUCKETS[-1] >= Settings().max_txn_timeout_ms / 1000
