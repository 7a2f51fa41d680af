"""Prometheus metrics of the reconcile engine (served on SHADOW_METRICS_PORT)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("shadow_operator_reconcile_total", "Reconcile passes.", ["kind"])
RECONCILE_ERRORS = Counter(
    "shadow_operator_reconcile_errors_total", "Reconcile passes that failed.", ["kind", "error"]
)
RECONCILE_DURATION = Histogram(
    "shadow_operator_reconcile_duration_seconds",
    "Duration of one reconcile pass.",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
CACHED_OBJECTS = Gauge("shadow_operator_cached_objects", "Objects held in the informer cache.", ["kind"])
API_WRITES = Counter(
    "shadow_operator_api_writes_total", "Write requests sent to the API server.", ["kind", "verb"]
)
API_WRITES_SKIPPED = Counter(
    "shadow_operator_api_writes_skipped_total", "apply() calls that found nothing to change.", ["kind"]
)
