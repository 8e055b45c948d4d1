"""Prometheus metrics (README, *Operations*): PIP-473's store series and Pulsar's coordinator series.

Names follow Prometheus conventions (base units, ``_total`` on counters). Labels are bounded sets
(``cluster``, ``coordinator_id``, ``command``, ``result``, ``outcome``, ``kind``, ``index``, ``error``,
``reason``, and ``url``, the configured upstream URLs only); never a txn id, nothing a client names.
Each server owns its own registry so that several servers can run in one test process.
"""

from __future__ import annotations

import bisect
import platform
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from tc_server import __version__

# No ``*_created`` series: one per labelled counter and histogram (115 of them on a fresh server) that
# nobody queries (rate() and increase() cope with resets on their own). The switch is process-wide and
# applies to metrics made after it, so it is thrown here, before any Metrics exists.
disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client 0.26 leaves it unannotated

# Seconds. Pulsar's execution-latency buckets (10 ms .. 3000 s, TransactionAggregator), and on to a day: the
# default --max-txn-timeout-ms is a day, and a txn that ran past 3000 s was only in +Inf, so the
# dashboard's quantiles of long transactions stopped at 3000 s.
TXN_LATENCY_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.5, 1, 5, 15, 30, 60, 300, 1500, 3000, 3600, 7200, 21600, 86400)
# Up to a minute: a request runs up to --request-timeout-s (10 s) and END_TXN waits for its participants up to
# --participant-wait-s (25 s); with 5 s on top, the dashboard's p99 panels flatlined at 5 s in exactly the
# incidents they are for (a stalled store, a broker that does not acknowledge).
REQUEST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5, 5, 10, 30, 60)

# Seconds from a decision to the last participant's acknowledgement.
DELIVERY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

TC_LABELS = ("cluster", "coordinator_id")

# Every series a dashboard may query; tests check the dashboard only uses these.
METRIC_NAMES = (
    "pulsar_txn_metadata_store_op_writes_total",
    "pulsar_txn_metadata_store_header_cas_total",
    "pulsar_txn_metadata_store_index_query_seconds",
    "pulsar_txn_metadata_store_outstanding_op_records",
    "pulsar_txn_created_total",
    "pulsar_txn_committed_total",
    "pulsar_txn_aborted_total",
    "pulsar_txn_timeout_total",
    "pulsar_txn_active_count",
    "pulsar_txn_execution_latency_seconds",
    "tc_server_request_seconds",
    "tc_server_request_errors_total",
    "tc_server_coordinator_leader",
    "tc_server_connections",
    "tc_server_unreadable_overdue_headers",
    "tc_server_connections_refused_total",
    "tc_server_requests_in_flight",
    "tc_server_store_batch_size",
    "tc_server_store_writer_lost_total",
    "tc_server_upstream_up",
    "tc_server_forwarded_request_seconds",
    "tc_server_forwarded_requests_total",
    "tc_server_proxied_connections",
    "tc_server_undelivered_decisions",
    "tc_server_oldest_undelivered_decision_seconds",
    "tc_server_decision_delivery_seconds",
    "tc_server_participant_requests_total",
    "tc_server_ready",
    "tc_server_build_info",
    "tc_server_coordinator_has_leader",
    "tc_server_tls_certificate_expiry_timestamp_seconds",
)


class LoopCounterChild:
    """One label set of a :class:`LoopCounter`."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class LoopHistogramChild:
    """One label set of a :class:`LoopHistogram`: a count per bucket (the last one +Inf), and the sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        # Prometheus buckets are "less than or equal": the first bound >= amount.
        self.counts[bisect.bisect_left(self._bounds, amount)] += 1
        self.sum += amount


Child = TypeVar("Child", LoopCounterChild, LoopHistogramChild)


class LoopFamily(Generic[Child]):
    """A labelled family whose values are plain numbers, for the request path (issue 13).

    prometheus_client takes a lock on every ``inc()`` and ``observe()`` (0.64 and 1.3 us on this
    machine), ~8 us per transaction over its nine updates; without any of them the Java pair-bench's
    event loop used ~10 % less CPU per pair (docs/performance.md). Every update of these families runs
    on the event loop's thread, and so does the scrape (the admin port is on the same loop), so no lock
    is needed. The exposition is prometheus_client's: this is a collector in the same registry, with the
    same names, types, labels and buckets the library's classes gave."""

    kind = ""  # the Prometheus type: "counter" or "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name = name
        self._documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Child] = {}
        registry.register(self)

    def labels(self, *values: object, **by_name: object) -> Child:
        """The child of one label set, by position or by name (as prometheus_client's ``labels()``)."""
        if by_name:
            values = tuple(by_name[name] for name in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: labels {self.labelnames}, given {values}")
        key = tuple(str(value) for value in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
        return child

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        yield self._family()

    def _new_child(self) -> Child:
        raise NotImplementedError

    def _family(self) -> Metric:
        """The family with a sample (set) per child."""
        raise NotImplementedError


class LoopCounter(LoopFamily[LoopCounterChild]):
    """A counter family (exposed as ``<name>_total``); see :class:`LoopFamily`."""

    kind = "counter"

    def _new_child(self) -> LoopCounterChild:
        return LoopCounterChild()

    def _family(self) -> Metric:
        family = CounterMetricFamily(self.name, self._documentation, labels=self.labelnames)
        for key, child in self._children.items():
            family.add_metric(list(key), child.value)
        return family


class LoopHistogram(LoopFamily[LoopHistogramChild]):
    """A histogram family; see :class:`LoopFamily`."""

    kind = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry,
                 buckets: Sequence[float]) -> None:
        self._bounds = tuple(float(bound) for bound in buckets)
        # The le label as prometheus_client writes it ("1.0", "0.0001"), so dashboards see the same series.
        self._le = [floatToGoString(bound) for bound in self._bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> LoopHistogramChild:
        return LoopHistogramChild(self._bounds)

    def _family(self) -> Metric:
        family = HistogramMetricFamily(self.name, self._documentation, labels=self.labelnames)
        for key, child in self._children.items():
            cumulative, buckets = 0, []
            for le, count in zip(self._le, child.counts, strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            family.add_metric(list(key), buckets, child.sum)
        return family


def ready_gauge(registry: CollectorRegistry) -> Gauge:
    """``tc_server_ready``: /readyz's answer at the time of the scrape, for alert rules
    (deploy/prometheus/alerts.yml), which read metrics, not probes. Served by the waiting start's admin
    port too (0), so an instance that waits for its store is not-ready there, not a failed scrape."""
    return Gauge("tc_server_ready", "1 when /readyz answers 200 (evaluated at each scrape; /readyz names the "
                 "problems when 0)", registry=registry)


# Read by the alert rules (TcServerCoordinatorWithoutLeader) and the dashboard's variables, from every instance:
# a running one's coordinator, and one still waiting for its store (admin/routes.py StartingRoutes, all 0).
HAS_LEADER = "tc_server_coordinator_has_leader"
HAS_LEADER_HELP = ("1 when the coordinator is led by this instance, or by another whose URL this instance knows "
                   "(another tc-server, or Pulsar 5's own coordinator); 0 while this instance's store session "
                   "may have lapsed")


class ScrapedGauge(Collector):
    """A gauge read when scraped: its owner sets :attr:`read` to a function of its samples (label values,
    value). Nothing is exported until then: a 0 where nothing is known would read as a fact (an expired
    certificate, a coordinator without a leader)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.read: Callable[[], Iterable[tuple[Sequence[str], float]]] | None = None
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        if self.read is not None:
            family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
            for labels, value in self.read():
                family.add_metric(labels, value)
            yield family


def tls_certificate_expiry(registry: CollectorRegistry) -> ScrapedGauge:
    """When the TLS certificate in use expires, on every admin port that serves with it (a worker's, the
    supervisor's with --admin-tls); its owner sets ``read`` to the ServerTlsContext's ``expiry_samples``."""
    return ScrapedGauge("tc_server_tls_certificate_expiry_timestamp_seconds",
                        "When the server's TLS certificate in use (--tls-cert-file) expires, in Unix seconds", (),
                        registry)


def build_info(registry: CollectorRegistry) -> Gauge:
    """``tc_server_build_info{version,python} 1``: which version each instance runs (a rolling upgrade's
    progress), on every admin port (a worker's, the supervisor's)."""
    gauge = Gauge("tc_server_build_info", "The running tc-server's version and Python", ["version", "python"],
                  registry=registry)
    gauge.labels(__version__, platform.python_version()).set(1)
    return gauge


def process_series(registry: CollectorRegistry) -> None:
    """prometheus_client's ``process_*`` series (start time, CPU, resident memory, open descriptors), on every
    admin port: a worker restarted by the supervisor starts its counters from 0, which rate() cannot tell from
    growth when the new process has counted past the old value by the next scrape; its
    process_start_time_seconds says it. And the memory that an out-of-memory kill follows."""
    ProcessCollector(registry=registry)


class Metrics:
    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # The families updated on every transaction request are Loop* (see LoopFamily); the rest are
        # prometheus_client's own.
        self.op_writes = LoopCounter(
            "pulsar_txn_metadata_store_op_writes", "Store write operations issued by the coordinator",
            ["kind"], r)
        self.header_cas = LoopCounter(
            "pulsar_txn_metadata_store_header_cas", "Header compare-and-set outcomes", ["result"], r)
        self.index_query = LoopHistogram(
            "pulsar_txn_metadata_store_index_query_seconds", "Secondary-index scans",
            ["index"], r, buckets=REQUEST_BUCKETS)
        self.outstanding_ops = Gauge(
            "pulsar_txn_metadata_store_outstanding_op_records",
            "Op records of terminal transactions still in the store (seen by the last GC sweep)",
            registry=r)
        self.created = LoopCounter("pulsar_txn_created", "Transactions created", TC_LABELS, r)
        self.committed = LoopCounter("pulsar_txn_committed", "Transactions committed", TC_LABELS, r)
        self.aborted = LoopCounter("pulsar_txn_aborted", "Transactions aborted (timeouts included)", TC_LABELS, r)
        self.timed_out = LoopCounter("pulsar_txn_timeout", "Transactions aborted by their timeout", TC_LABELS, r)
        self.active = Gauge("pulsar_txn_active_count", "Open transactions led here", TC_LABELS, registry=r)
        self.execution_latency = LoopHistogram(
            "pulsar_txn_execution_latency_seconds", "Time from NEW_TXN to the end decision",
            TC_LABELS, r, buckets=TXN_LATENCY_BUCKETS)
        self.request_seconds = LoopHistogram(
            "tc_server_request_seconds", "Request latency per command", ["command"], r, buckets=REQUEST_BUCKETS)
        self.request_errors = Counter(
            "tc_server_request_errors", "Requests answered with an error, by command and ServerError",
            ["command", "error"], registry=r)
        self.leader = Gauge(
            "tc_server_coordinator_leader", "1 while this instance leads the coordinator",
            TC_LABELS, registry=r)
        # Set by the coordinator (coordinator.py): what /readyz counts, per coordinator.
        self.has_leader = ScrapedGauge(HAS_LEADER, HAS_LEADER_HELP, TC_LABELS, r)
        self.ready = ready_gauge(r)
        self.build_info = build_info(r)
        process_series(r)
        # Read by app.py with --tls-listen or --admin-tls only.
        self.tls_certificate_expiry = tls_certificate_expiry(r)
        self.connections = Gauge("tc_server_connections", "Open client connections", registry=r)
        self.unreadable_overdue_headers = Gauge(
            "tc_server_unreadable_overdue_headers", "OPEN transaction headers past their deadline, of coordinators led "
            "here, that cannot be read (damaged records no timeout can abort; each key is logged once)", registry=r)
        self.connections_refused = Counter(
            "tc_server_connections_refused", "Client connections closed because a limit was reached "
            "(max_connections, max_connections_per_address, max_tls_handshakes, max_buffered_input)", ["reason"],
            registry=r)
        self.in_flight = Gauge("tc_server_requests_in_flight",
                              "Requests being served: transaction requests and forwarded ones", registry=r)
        self.store_batch_size = Histogram(
            "tc_server_store_batch_size", "Operations per store commit/batch",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000), registry=r)
        self.store_writer_lost = Counter(
            "tc_server_store_writer_lost", "Times the embedded store's writer process was found gone (its writes in "
            "flight failed with an unknown outcome; the next write started a new one)", registry=r)
        # The front door (tc_server/server/upstream.py): the label values are the configured upstream
        # URLs and the command names of the Pulsar protocol, both bounded sets.
        self.upstream_up = Gauge(
            "tc_server_upstream_up", "1 if the last connection attempt to this upstream broker succeeded",
            ["url"], registry=r)
        self.forwarded_seconds = Histogram(
            "tc_server_forwarded_request_seconds", "Latency of requests forwarded to the upstream, by command",
            ["command"], buckets=REQUEST_BUCKETS, registry=r)
        self.forwarded_total = Counter(
            "tc_server_forwarded_requests", "Requests forwarded to the upstream, by command and outcome "
            "(ok, or the failure: ConnectionFailed, ConnectionClosed, RequestTimedOut, HandshakeRefused, ...)",
            ["command", "outcome"], registry=r)
        self.proxied_connections = Gauge(
            "tc_server_proxied_connections", "Client connections carried byte for byte to a broker", registry=r)
        # Decisions delivered to today's brokers (docs/participants.md).
        self.undelivered = Gauge(
            "tc_server_undelivered_decisions", "Decided txns of a coordinator led here whose participant "
            "brokers have not all acknowledged the decision yet", TC_LABELS, registry=r)
        self.oldest_undelivered = Gauge(
            "tc_server_oldest_undelivered_decision_seconds", "Age of the oldest undelivered decision "
            "(0 when none)", TC_LABELS, registry=r)
        self.delivery_latency = LoopHistogram(
            "tc_server_decision_delivery_seconds", "Time from the decision until every participant broker "
            "acknowledged it", TC_LABELS, r, buckets=DELIVERY_BUCKETS)
        self.participant_requests = LoopCounter(
            "tc_server_participant_requests", "END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION attempts by "
            "outcome (ok, or the error: ServiceNotReady, ConnectionFailed, RequestTimedOut, ...; each non-ok "
            "one is retried)", ["command", "outcome"], r)

    def tc(self, coordinator_id: int) -> dict[str, str]:
        return {"cluster": self.cluster, "coordinator_id": str(coordinator_id)}
