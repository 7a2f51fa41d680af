"""The gateway's decision Events, before any API server: what is due, in which order, within which bounds.
(tests/integration/test_egress_events.py runs the same with the real gateway and a real API server.)"""

from __future__ import annotations

from typing import Any

import pytest
from shadow_operator.common import egress
from shadow_operator.egress.events import EventLog
from shadow_operator.egress.table import PolicyTable, SandboxEntry

pytestmark = pytest.mark.unit

RULES = (egress.Rule("pypi.org", methods=frozenset({"GET"}), paths=("/simple/",)),)


class Recorder:
    """The writer's side, kept in memory: which Events were created and patched, in order."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.refused = 0  # creations refused while `forbidden`
        self.forbidden = False

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        if self.forbidden:
            self.refused += 1
            raise RuntimeError("(403) events.events.k8s.io is forbidden")
        self.created.append(body)

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        self.patched.append((name, body))
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def world(**options: Any) -> tuple[EventLog, Recorder, Clock]:
    table = PolicyTable()
    entries = [SandboxEntry(ns, "sb", ns, frozenset(), RULES, uid=f"uid-{ns}") for ns in ("flood", "quiet")]
    table.replace(entries, {})
    writer, clock = Recorder(), Clock()
    return EventLog(table, writer, "gateway-0", clock=clock, **options), writer, clock


def refuse(log: EventLog, namespace: str, host: str, path: str = "/") -> None:
    decision = egress.decide_request(RULES, f"{namespace}/sb", host, 443, "GET", path)
    log.record(f"{namespace}/sb", decision, None, host, 443, "GET", path)


def test_a_flood_is_bounded_per_sandbox_and_waits_behind_other_tenants() -> None:
    log, writer, clock = world(rate=0.0, burst=3.0)
    for i in range(5000):
        refuse(log, "flood", f"h{i}.example")
    refuse(log, "quiet", "pypi.org", "/private/x")
    assert log.flush() == 3
    # Namespaces take turns: the quiet tenant's one Event is among the first writes, not after 33 of the flood's.
    assert "quiet" in {body["metadata"]["namespace"] for body in writer.created}
    log.bucket.burst = log.bucket.tokens = 1000.0
    log.flush()
    flood = [b for b in writer.created if b["metadata"]["namespace"] == "flood"]
    assert len(flood) == 33
    (overflow,) = [b for b in flood if b["reason"] == egress.REASON_OVERFLOW]
    assert overflow["series"]["count"] == 5000 - 32
    assert overflow["note"].startswith("more than 32 distinct egress destinations at once")
    # More of the same only counts: no new Event, one patch per Event at most every `every` seconds.
    for i in range(5000, 6000):
        refuse(log, "flood", f"h{i}.example")
    assert log.flush() == 0
    clock.now += log.every
    assert log.flush() == 1 and writer.patched[-1][1]["series"]["count"] == 6000 - 32
    assert len(writer.created) == 34


def test_a_destination_quiet_for_long_makes_room_for_another() -> None:
    log, writer, clock = world(per_sandbox=2, idle=60.0)
    refuse(log, "quiet", "a.example")
    refuse(log, "quiet", "b.example")
    log.flush()
    clock.now += 61
    refuse(log, "quiet", "c.example")
    log.flush()
    assert [b["regarding"]["uid"] for b in writer.created] == ["uid-quiet"] * 3
    assert [b["reason"] for b in writer.created] == [egress.REASON_REFUSED] * 3
    assert len({b["metadata"]["name"] for b in writer.created}) == 3


def test_the_event_says_what_was_refused_and_what_to_add_escaped() -> None:
    log, writer, _ = world()
    refuse(log, "quiet", "pypi.org", "/simple\x1b[2J/\u202e?token=secret")
    log.flush()
    (body,) = writer.created
    assert body["note"].startswith("refused GET pypi.org/simple\\x1b[2J/\\u202e: ")
    assert "token=secret" not in str(body)
    assert body["type"] == "Warning" and body["reportingController"] == egress.EVENT_CONTROLLER
    assert body["metadata"]["labels"] == {egress.EVENT_LABEL_SANDBOX: "sb"}
    assert "series" not in body  # one occurrence: a series counts two or more


def test_a_refused_write_is_tried_again_after_a_while_not_at_every_tick() -> None:
    log, writer, clock = world()
    writer.forbidden = True
    refuse(log, "quiet", "a.example")
    assert log.flush() == 1 and log.flush() == 0
    clock.now += log.every
    writer.forbidden = False
    assert log.flush() == 1
    assert writer.refused == 1 and len(writer.created) == 1


def test_namespaces_take_turns_whenever_the_bucket_allows_a_write() -> None:
    """The writer ticks more often than the bucket refills: the turn passes with each write, not each tick."""
    log, writer, _ = world(rate=0.0, burst=1.0)
    for i in range(10):
        refuse(log, "flood", f"h{i}.example")
    refuse(log, "quiet", "a.example")
    refuse(log, "quiet", "b.example")
    for _ in range(4):
        log.bucket.tokens = 0.0
        assert log.flush() == 0  # a tick with an empty bucket
        log.bucket.tokens = 1.0
        assert log.flush() == 1
    assert [b["metadata"]["namespace"] for b in writer.created] == ["flood", "quiet", "flood", "quiet"]
