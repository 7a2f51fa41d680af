"""router-auth's metrics from nginx's access log lines: parsing, the bounded sandbox labels and their reuse."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from shadow_operator.router.metrics import OVERFLOW, RouterMetrics, message_of

pytestmark = pytest.mark.unit


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def make(limit: int, alive: set[tuple[str, str]]) -> tuple[CollectorRegistry, RouterMetrics]:
    registry = CollectorRegistry()
    return registry, RouterMetrics(registry, max_sandboxes=limit, exists=lambda ns, sb: (ns, sb) in alive)


def test_syslog_framing_from_nginx() -> None:
    assert (
        message_of(b"<190>Nov 23 14:50:00 shadow_metrics: preview ns/a 200 0.004") == "preview ns/a 200 0.004"
    )
    assert message_of(b"preview ns/a 200 0.004") is None
    assert message_of(b"<190>Nov 23 14:50:00 other_tag: preview ns/a 200 0.004") is None


def test_lines_count_requests_by_status_class_and_observe_upstream_time() -> None:
    registry, metrics = make(10, set())
    metrics.observe("preview ns/a 200 0.004")
    metrics.observe("preview ns/a 502 -")  # the sandbox never answered: counted, no latency
    metrics.observe("sdk ns/a 201 0.5, 0.020")  # several upstream tries: the last one's time
    labels = {"namespace": "ns", "sandbox": "a"}
    assert value(registry, "shadow_router_requests_total", route="preview", code="2xx", **labels) == 1
    assert value(registry, "shadow_router_requests_total", route="preview", code="5xx", **labels) == 1
    assert value(registry, "shadow_router_upstream_latency_seconds_count", route="preview", **labels) == 1
    assert value(registry, "shadow_router_upstream_latency_seconds_sum", route="sdk", **labels) == 0.02


@pytest.mark.parametrize(
    "line", ["", "preview ns/a 200", "browser ns/a 200 0.1", "preview a 200 0.1", "preview ns/a ok 0.1"]
)
def test_unreadable_lines_are_counted_not_raised(line: str) -> None:
    registry, metrics = make(10, set())
    metrics.observe(line)
    assert value(registry, "shadow_router_log_lines_invalid_total") == 1


def test_labels_are_bounded_and_freed_by_deleted_sandboxes() -> None:
    alive = {("ns", "a"), ("ns", "b"), ("ns", "c")}
    registry, metrics = make(2, alive)
    for name in ("a", "b", "c", "c"):
        metrics.observe(f"preview ns/{name} 200 0.001")
    other = {"namespace": OVERFLOW[0], "sandbox": OVERFLOW[1]}
    assert value(registry, "shadow_router_requests_total", route="preview", code="2xx", **other) == 2
    assert (
        value(
            registry, "shadow_router_requests_total", route="preview", code="2xx", namespace="ns", sandbox="b"
        )
        == 1
    )

    alive.discard(("ns", "a"))
    metrics.observe("preview ns/c 200 0.001")
    assert (
        value(
            registry, "shadow_router_requests_total", route="preview", code="2xx", namespace="ns", sandbox="c"
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "shadow_router_requests_total",
            {"route": "preview", "code": "2xx", "namespace": "ns", "sandbox": "a"},
        )
        is None
    )
    assert metrics.labels.held == {("ns", "b"), ("ns", "c")}
