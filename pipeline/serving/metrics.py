"""What the Decision API exposes on `GET /metrics`, in the Prometheus text format (`prometheus-client`).

    decision_requests_total{status}        answered requests of POST /v1/systemone, by HTTP status
    decision_request_seconds               their latency, from the body read to the answer written (histogram)
    decision_queue_depth                   requests waiting for a batch, read when scraped
    decision_batch_requests                requests per forward-pass batch (histogram)
    decision_batch_questions               questions per batch (histogram)
    decision_log_written_total             decisions written to the inference log
    decision_log_dropped_total{reason}     decisions the log could not write: queue_full, write_error
    decision_log_queue_depth               decisions waiting for the log's next flush
    decision_monitor_<gauge>               the drift monitor's latest window (`flows.monitor`, docs/flywheel.md):
                                           drift_share, drifted_columns, expected_accuracy, measured_accuracy,
                                           labelled_decisions, window_decisions, report_age_seconds
    decision_certificate_<gauge>{question} each certificate re-checked on the monitor's latest window
                                           (`pipeline.flywheel.recertify`): target_error, automated,
                                           automated_labelled, errors, realised_error, error_lower_bound,
                                           error_upper_bound, broken (1 when the lower bound is above ε)

Each app has its own registry, so two servers in one process (the tests) never share counts.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pipeline.flywheel.gauges import CERTIFICATE_GAUGES, read_certificate_gauges, read_gauges

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServerMetrics:
    """The server's counters, latency and batch histograms, and the queue depth as a scrape-time gauge."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        queue_depth: Callable[[], int],
        log_depth: Callable[[], int] = lambda: 0,
        monitor_folder: str | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "decision_requests",
            "Answered POST /v1/systemone requests, by HTTP status",
            ["status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "decision_request_seconds",
            "Latency of POST /v1/systemone",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "decision_batch_requests",
            "Requests per forward-pass batch",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.batch_questions = Histogram(
            "decision_batch_questions",
            "Questions per forward-pass batch",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        depth = Gauge("decision_queue_depth", "Requests waiting for a batch", registry=self.registry)
        depth.set_function(queue_depth)
        self.logged = Counter(
            "decision_log_written", "Decisions written to the inference log", registry=self.registry
        )
        self.log_dropped = Counter(
            "decision_log_dropped",
            "Decisions the inference log could not write",
            ["reason"],
            registry=self.registry,
        )
        Gauge(
            "decision_log_queue_depth",
            "Decisions waiting for the inference log's next flush",
            registry=self.registry,
        ).set_function(log_depth)
        if monitor_folder is not None:
            self.registry.register(MonitorGauges(monitor_folder))

    def log_written(self, n: int) -> None:
        self.logged.inc(n)

    def log_drop(self, reason: str, n: int) -> None:
        self.log_dropped.labels(reason=reason).inc(n)

    def answered(self, status: int, seconds: float) -> None:
        self.requests.labels(status=str(status)).inc()
        self.latency.observe(seconds)

    def batch(self, requests: int, questions: int) -> None:
        self.batch_requests.observe(requests)
        self.batch_questions.observe(questions)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class MonitorGauges(Collector):
    """The drift monitor's latest summary under `folder`, read when scraped (none before the first report)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def collect(self):
        # A summary being replaced, or unreadable: no gauges this scrape.
        try:
            gauges, certificates = read_gauges(self.folder), read_certificate_gauges(self.folder)
        except (OSError, ValueError, KeyError):
            gauges, certificates = {}, {}
        for name, value in gauges.items():
            yield GaugeMetricFamily(
                f"decision_monitor_{name}", f"drift monitor: {name.replace('_', ' ')}", value=value
            )
        for name in CERTIFICATE_GAUGES:
            family = GaugeMetricFamily(
                f"decision_certificate_{name}",
                f"certificate on the window: {name.replace('_', ' ')}",
                labels=["question"],
            )
            for question, values in sorted(certificates.items()):
                if name in values:
                    family.add_metric([question], values[name])
            if family.samples:
                yield family
