"""The router's wake-up and activity bookkeeping on their own: what they remember and write stays bounded
whatever the requests (the integration tests run them behind nginx against an API server)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from shadow_operator.api import constants as c
from shadow_operator.router.index import Index
from shadow_operator.router.wake import Activity, WakeMetrics, Waker

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """The API server's side of the patches: what was written, in order."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, str, str, dict[str, str]]] = []

    async def __call__(self, namespace: str, name: str, uid: str, annotations: Mapping[str, str]) -> None:
        self.patches.append((namespace, name, uid, dict(annotations)))


async def _drain(activity: Activity) -> None:
    task = asyncio.create_task(activity.run())
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()


async def test_activity_is_written_once_per_period_per_sandbox() -> None:
    clock, written = Clock(), Recorder()
    activity = Activity(written, every=30, clock=clock)
    for _ in range(100):
        activity.note("ns", "a", "uid-a")
    await _drain(activity)
    assert [p[1] for p in written.patches] == ["a"]
    clock.now += 29
    activity.note("ns", "a", "uid-a")
    await _drain(activity)
    assert len(written.patches) == 1
    clock.now += 2
    activity.note("ns", "a", "uid-a")
    await _drain(activity)
    assert len(written.patches) == 2
    assert set(written.patches[0][3]) == {c.ANNOTATION_LAST_ACTIVITY}


async def test_a_flood_of_sandboxes_waits_in_a_bounded_queue() -> None:
    clock, written = Clock(), Recorder()
    activity = Activity(written, every=30, max_pending=8, clock=clock)
    for n in range(10_000):
        activity.note("ns", f"s{n}", f"uid-{n}")
    assert len(activity._pending) == 8
    await _drain(activity)
    assert len(written.patches) == 8
    # What is remembered per sandbox is forgotten once it decides nothing (older than `every`).
    for round_ in range(5):
        clock.now += 31
        for n in range(8):
            activity.note("ns", f"r{round_}-{n}", f"uid-r{round_}-{n}")
        await _drain(activity)
    assert len(activity._written) <= 16


def _sleeping_sandbox(name: str, uid: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {
            "podTemplate": {"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 3000}]}]}}
        },
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "Suspended"},
                {"type": "Suspended", "status": "True", "reason": "Idle"},
            ]
        },
    }


async def test_fifty_holds_ask_once_and_all_end_when_the_watch_says_ready() -> None:
    index, asked = Index(default_preview_port=3000), Recorder()
    waker = Waker(index, asked, WakeMetrics(CollectorRegistry()), hold_seconds=5)
    index.put("Sandbox", _sleeping_sandbox("a", "uid-a"))
    holds = [asyncio.create_task(waker.hold("ns", "a", "preview")) for _ in range(50)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(asked.patches) == 1 and set(asked.patches[0][3]) == {c.ANNOTATION_RESUME_REQUEST}
    assert not any(h.done() for h in holds)
    awake = _sleeping_sandbox("a", "uid-a")
    awake["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    index.put("Sandbox", awake)
    pod = {
        "metadata": {
            "name": "a",
            "namespace": "ns",
            "ownerReferences": [{"uid": "uid-a", "controller": True, "kind": "Sandbox", "name": "a"}],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.9",
            "podIPs": [{"ip": "10.0.0.9"}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    index.put("Pod", pod)
    assert await asyncio.wait_for(asyncio.gather(*holds), 2) == [True] * 50
    assert len(asked.patches) == 1
    assert not waker.waking("uid-a")


async def test_a_sandbox_suspended_by_its_spec_is_not_woken() -> None:
    index, asked = Index(default_preview_port=3000), Recorder()
    waker = Waker(index, asked, WakeMetrics(CollectorRegistry()), hold_seconds=5)
    body = _sleeping_sandbox("a", "uid-a")
    body["spec"]["operatingMode"] = "Suspended"
    body["status"]["conditions"][1]["reason"] = c.REASON_SANDBOX_SUSPENDED
    index.put("Sandbox", body)
    route = index.route("ns", "a")
    assert route is not None and not route.asleep
    assert await waker.hold("ns", "a", "preview") is True  # nothing to wait for: decide again (503)
    assert asked.patches == []
