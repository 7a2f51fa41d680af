"""The typed status of one pass (engine/status.py): conditions keep their transition times, and what is written
is the merge patch of what changed, nothing when nothing did."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from shadow_operator.api.kinds import SANDBOX_WARM_POOL
from shadow_operator.api.models import (
    SandboxClaim,
    SandboxClaimStatus,
    SandboxWarmPool,
    SandboxWarmPoolStatus,
)
from shadow_operator.engine.status import Conditions, StatusPass, merge_patch
from shadow_operator.resources import conditions as conds

from tests.support.fakes import FakeClient

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)


def test_condition_transition_time_is_kept_while_status_holds() -> None:
    first = Conditions([], 1, now=lambda: T0)
    first.set("Ready", False, "A", "")
    stamp = first.items()[0].last_transition_time
    assert stamp == T0
    same_status = Conditions(first.items(), 2, now=lambda: T1)
    same_status.set("Ready", False, "B", "changed")
    assert same_status.items()[0].last_transition_time == stamp and same_status.items()[0].reason == "B"
    assert same_status.items()[0].observed_generation == 2
    flipped = Conditions(first.items(), 2, now=lambda: T1)
    flipped.set("Ready", True, "B", "")
    assert flipped.items()[0].last_transition_time == T1
    first.remove("Ready")
    assert first.items() == []


def test_merge_patch_nulls_what_went_and_recurses_into_objects() -> None:
    old = {"a": 1, "gone": "x", "obj": {"keep": 1, "drop": 2}, "list": [1, 2]}
    new = {"a": 1, "obj": {"keep": 1}, "list": [1], "added": True}
    assert merge_patch(old, new) == {"gone": None, "obj": {"drop": None}, "list": [1], "added": True}
    assert merge_patch(new, new) == {}


def warm_pool(status: dict[str, Any] | None) -> SandboxWarmPool:
    body: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "team", "uid": "uid-p", "generation": 2},
        "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "t"}},
    }
    if status is not None:
        body["status"] = status
    return SandboxWarmPool.from_body(body)


async def test_only_what_changed_is_written_and_nothing_when_nothing_did() -> None:
    client = FakeClient()
    old = {"replicas": 1, "readyReplicas": 0, "selector": "s", "observedGeneration": 2}
    seen = StatusPass(warm_pool(old), SandboxWarmPoolStatus)
    seen.status.ready_replicas = 1
    assert await seen.write(client, SANDBOX_WARM_POOL)
    assert client.status_patches == [("SandboxWarmPool", "p", {"readyReplicas": 1})]
    assert not await seen.write(client, SANDBOX_WARM_POOL)  # compared with what it wrote, not what it read
    again = StatusPass(warm_pool({**old, "readyReplicas": 1}), SandboxWarmPoolStatus)
    again.status.ready_replicas = 1
    again.status.selector = "s"
    assert not await again.write(client, SANDBOX_WARM_POOL) and len(client.status_patches) == 1


async def test_a_field_nobody_set_is_not_written_and_a_status_without_conditions_gets_none() -> None:
    seen = StatusPass(warm_pool(None), SandboxWarmPoolStatus)
    seen.status.replicas = 0
    assert seen.changes() == {"replicas": 0}


async def test_conditions_are_compared_ignoring_their_order() -> None:
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "R",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "observedGeneration": 1,
    }
    other = {"type": "Finished", "status": "False", "reason": "F", "message": "m",
             "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}  # fmt: skip
    claim = SandboxClaim.from_body(
        {
            "metadata": {"name": "c", "namespace": "team", "generation": 1},
            "spec": {"sandboxTemplateRef": {"name": "t"}},
            "status": {"conditions": [ready, other]},  # not sorted by type: as another writer may leave it
        }
    )
    seen = StatusPass(claim, SandboxClaimStatus, now=lambda: T1)
    seen.conditions.put(conds.make_condition("Ready", True, "R", "", 1))
    assert seen.changes() == {}
    seen.conditions.set("Ready", True, "R", "now with a message")
    written = seen.changes()["conditions"]
    assert [x["type"] for x in written] == ["Finished", "Ready"]
    assert written[1]["lastTransitionTime"] == "2026-01-01T00:00:00Z"  # the status did not change
