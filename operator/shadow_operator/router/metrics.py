"""Requests and upstream latency per sandbox, from nginx's access log.

nginx sends one syslog line per routed request over UDP to router-auth on loopback (`access_log syslog:...`
with the chart's `shadow_metrics` format): `<route> <namespace>/<sandbox> <status> <upstream_response_time>`.
The sandbox is the one router-auth's own decision named (the `X-Shadow-Sandbox` header nginx keeps from the
auth answer), so only requests that were routed are counted, and a Host header cannot invent label values.

Cardinality is bounded: at most `max_sandboxes` (namespace, sandbox) label pairs, first come first served;
when they are all taken, pairs of sandboxes that no longer exist are dropped (series removed) to make room,
and requests of any further sandbox count under `_other`/`_other` (an underscore is never in a DNS-1123 name,
so that label cannot collide with a real sandbox's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram

log = logging.getLogger(__name__)

OVERFLOW = ("_other", "_other")
ROUTES = ("preview", "sdk")
# Syslog framing nginx uses: `<PRI>Mmm dd hh:mm:ss TAG: MESSAGE` (no hostname with `nohostname`).
TAG = "shadow_metrics"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class SandboxLabels:
    """The bounded set of (namespace, sandbox) label pairs; `exists` tells which ones may be recycled."""

    def __init__(self, limit: int, exists: Callable[[str, str], bool]) -> None:
        self.limit = limit
        self.exists = exists
        self.held: set[tuple[str, str]] = set()

    def label(self, namespace: str, sandbox: str) -> tuple[tuple[str, str], list[tuple[str, str]]]:
        """(the pair to count under, the pairs dropped to make room)."""
        key = (namespace, sandbox)
        if key in self.held:
            return key, []
        dropped: list[tuple[str, str]] = []
        if len(self.held) >= self.limit:
            dropped = [pair for pair in self.held if not self.exists(*pair)]
            self.held.difference_update(dropped)
        if len(self.held) >= self.limit:
            return OVERFLOW, dropped
        self.held.add(key)
        return key, dropped


class RouterMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        max_sandboxes: int,
        exists: Callable[[str, str], bool],
    ) -> None:
        self.labels = SandboxLabels(max_sandboxes, exists)
        self.requests = Counter(
            "shadow_router_requests",
            "Requests the router sent to a sandbox, by its answer's status class.",
            ["route", "namespace", "sandbox", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "shadow_router_upstream_latency_seconds",
            "Time the sandbox took to answer (nginx's $upstream_response_time; a WebSocket's whole life).",
            ["route", "namespace", "sandbox"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.invalid = Counter(
            "shadow_router_log_lines_invalid",
            "Access log lines router-auth could not read (a format mismatch between nginx and router-auth).",
            registry=registry,
        )

    def observe(self, line: str) -> None:
        """One access log line (the message, without syslog framing)."""
        fields = line.split(maxsplit=3)  # the time may be a list: "0.5, 0.020"
        try:
            route, sandbox, status, upstream_time = fields
            namespace, _, name = sandbox.partition("/")
            if route not in ROUTES or not namespace or not name or not status.isdigit():
                raise ValueError(line)
        except ValueError:
            self.invalid.inc()
            return
        (namespace, name), dropped = self.labels.label(namespace, name)
        for old_namespace, old_name in dropped:
            self._forget(old_namespace, old_name)
        self.requests.labels(route, namespace, name, f"{status[0]}xx").inc()
        # "-": no answer from the sandbox; "0.001, 0.002": nginx tried more than one upstream (the last
        # answered). The router's config names exactly one, but the format allows it.
        seconds = upstream_time.split(",")[-1].strip()
        if seconds not in ("", "-"):
            try:
                self.latency.labels(route, namespace, name).observe(float(seconds))
            except ValueError:
                self.invalid.inc()

    def _forget(self, namespace: str, sandbox: str) -> None:
        for route in ROUTES:
            for code in ("1xx", "2xx", "3xx", "4xx", "5xx"):
                with contextlib.suppress(KeyError):
                    self.requests.remove(route, namespace, sandbox, code)
            with contextlib.suppress(KeyError):
                self.latency.remove(route, namespace, sandbox)


def message_of(datagram: bytes) -> str | None:
    """The message of one syslog datagram from nginx, None for anything else."""
    text = datagram.decode("utf-8", errors="replace").strip()
    head, sep, message = text.partition(f" {TAG}: ")
    if not sep or not head.startswith("<"):
        return None
    return message


class LogReceiver(asyncio.DatagramProtocol):
    """The UDP end of nginx's `access_log syslog:server=...`: each datagram is one line."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        message = message_of(data)
        if message is None:
            self.metrics.invalid.inc()
            return
        self.metrics.observe(message)

    def error_received(self, exc: Exception) -> None:
        log.warning("access log receiver: %s", exc)
