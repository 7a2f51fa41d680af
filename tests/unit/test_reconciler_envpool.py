"""The ShadowEnvironmentPool reconciler over the engine's client and cache, the API server in memory: it starts
its instances and writes its counts and Ready condition once."""

from __future__ import annotations

from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api.kinds import SANDBOX, SANDBOX_TEMPLATE, SHADOW_ENVIRONMENT_POOL
from shadow_operator.controllers.envpool import EnvironmentPoolReconciler
from shadow_operator.resources import pool as pools

from tests.support.fakes import NAMESPACE, Harness, make_ready, template

pytestmark = pytest.mark.unit


def pool(replicas: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "warm", "namespace": NAMESPACE, "uid": "uid-warm"},
        "spec": {"replicas": replicas, "gitea": {"enabled": False}, "workspace": {"size": "1Gi"}},
    }


def status(harness: Harness) -> dict[str, Any]:
    found: dict[str, Any] = harness.get(SHADOW_ENVIRONMENT_POOL, NAMESPACE, "warm")["status"]
    return found


def instances(harness: Harness) -> list[str]:
    return sorted(b["metadata"]["name"] for p, b in harness.api.objects.items() if "/sandboxes/" in p)


async def test_a_pool_starts_its_instances_and_turns_ready_with_them() -> None:
    harness = Harness(EnvironmentPoolReconciler)
    harness.put(SANDBOX_TEMPLATE, template())
    harness.put(SHADOW_ENVIRONMENT_POOL, pool())
    await harness.run(SHADOW_ENVIRONMENT_POOL, NAMESPACE, "warm")
    (instance,) = instances(harness)
    written = status(harness)
    assert (written["replicas"], written["readyReplicas"]) == (1, 0)
    assert written["selector"] == pools.selector("warm") and written["observedGeneration"] == 1
    (ready,) = written["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == (c.COND_READY, "False", "Starting")
    assert ready["message"] == "0 of 1 instances Ready"

    make_ready(harness, SANDBOX, instance)
    harness.writes()
    await harness.run(SHADOW_ENVIRONMENT_POOL, NAMESPACE, "warm")
    assert harness.writes() == [f"status {SHADOW_ENVIRONMENT_POOL.path(NAMESPACE, 'warm')}"]
    (ready,) = status(harness)["conditions"]
    assert (ready["status"], ready["reason"], ready["message"]) == ("True", "Ready", "1 of 1 instances Ready")
    await harness.run(SHADOW_ENVIRONMENT_POOL, NAMESPACE, "warm")
    assert harness.writes() == []


async def test_without_its_template_a_pool_says_so_and_starts_nothing() -> None:
    harness = Harness(EnvironmentPoolReconciler)
    harness.put(SHADOW_ENVIRONMENT_POOL, pool())
    await harness.run(SHADOW_ENVIRONMENT_POOL, NAMESPACE, "warm")
    assert instances(harness) == []
    (ready,) = status(harness)["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", c.REASON_TEMPLATE_NOT_FOUND)
    assert "SandboxTemplate 'workspace' does not exist" in ready["message"]
