"""Every decision of the gateway, counted and kept for the sandbox's users to read.

Counters carry only bounded labels (the sandbox, the matching rule's host pattern, a known method): a refused
host is attacker-chosen, so it goes to the log, never into a label. The log is a ring buffer per sandbox (on the
admin port), and, when the gateway follows a cluster, Events on the Sandbox that its users can read
(egress.events).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass

from prometheus_client import CollectorRegistry, Counter

from shadow_operator.common import egress
from shadow_operator.egress.events import EventLog

LOG_ENTRIES_PER_SANDBOX = 256
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT"})
UNKNOWN = "-"


@dataclass(frozen=True)
class Entry:
    time: float
    host: str
    port: int
    method: str
    path: str
    allowed: bool
    rule: str
    reason: str


class Audit:
    def __init__(self, registry: CollectorRegistry | None = None, events: EventLog | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.events = events
        self.decisions = Counter(
            "shadow_egress_decisions",
            "Egress gateway decisions, by sandbox, the rule's host pattern (- when none matched), method and "
            "outcome.",
            ["namespace", "sandbox", "rule_host", "method", "decision"],
            registry=self.registry,
        )
        self.unidentified = Counter(
            "shadow_egress_unidentified",
            "Connections refused because their proxy credential and source address name no sandbox.",
            registry=self.registry,
        )
        self.logs: dict[str, deque[Entry]] = {}
        # The label sets each sandbox has used, so that its series go when it does: sandboxes are disposable,
        # and a counter per sandbox that outlived it would grow the gateway's memory with every one.
        self.series: dict[str, set[tuple[str, ...]]] = {}

    def record(
        self,
        sandbox: str,
        rules: tuple[egress.Rule, ...],
        decision: egress.Decision,
        host: str,
        port: int,
        method: str,
        path: str = "",
    ) -> None:
        namespace, name = sandbox.split("/", 1)
        rule = rules[decision.rule] if decision.rule is not None else None
        rule_host = rule.host if rule is not None else UNKNOWN
        labels = (
            namespace,
            name,
            rule_host,
            method if method in KNOWN_METHODS else UNKNOWN,
            "allowed" if decision.allowed else "refused",
        )
        self.decisions.labels(*labels).inc()
        self.series.setdefault(sandbox, set()).add(labels)
        log = self.logs.setdefault(sandbox, deque(maxlen=LOG_ENTRIES_PER_SANDBOX))
        log.append(
            Entry(
                time.time(),
                host[:253],
                port,
                method[:16],
                path[:512],
                decision.allowed,
                decision.rule_label,
                decision.reason,
            )
        )
        if self.events is not None:
            self.events.record(sandbox, decision, rule, host, port, method, path)

    def read(self, sandbox: str) -> list[dict[str, object]]:
        return [asdict(entry) for entry in self.logs.get(sandbox, ())]

    def forget(self, keep: set[str]) -> None:
        """Drop the logs and the series of sandboxes that are gone."""
        for key in set(self.logs) - keep:
            del self.logs[key]
        for key in set(self.series) - keep:
            for labels in self.series.pop(key):
                self.decisions.remove(*labels)
