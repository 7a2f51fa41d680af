"""Prometheus metrics on a private registry (several apps in one test process must not collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Histogram(
            "sandbox_runtime_request_duration_seconds",
            "HTTP request latency by route and status.",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.execs = Counter(
            "sandbox_runtime_exec_total",
            "Commands run, by API and outcome.",
            ["api", "outcome"],
            registry=self.registry,
        )
        self.exec_duration = Histogram(
            "sandbox_runtime_exec_duration_seconds",
            "Command wall-clock duration.",
            ["api"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600),
        )
        self.bytes_in = Counter(
            "sandbox_runtime_bytes_received_total",
            "File bytes received (uploads, imports).",
            registry=self.registry,
        )
        self.bytes_out = Counter(
            "sandbox_runtime_bytes_sent_total",
            "File bytes sent (downloads, exports).",
            registry=self.registry,
        )
        self.processes = Gauge(
            "sandbox_runtime_processes", "Processes currently running.", registry=self.registry
        )
