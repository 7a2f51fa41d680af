"""The SandboxWarmPool reconciler over the engine's client and cache, the API server in memory: it fills and
sheds its pool, and writes its counts once."""

from __future__ import annotations

from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.kinds import SANDBOX, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL
from shadow_operator.controllers.warmpool import WarmPoolReconciler

from tests.support.fakes import NAMESPACE, Harness, make_ready, template

pytestmark = pytest.mark.unit


def pool(replicas: int, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "warm", "namespace": NAMESPACE, "uid": "uid-warm"},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "workspace"}, **spec},
    }


def members(harness: Harness) -> list[str]:
    return sorted(
        body["metadata"]["name"]
        for path, body in harness.api.objects.items()
        if path.startswith(SANDBOX.path(NAMESPACE) + "/")
    )


async def test_a_pool_fills_up_and_counts_its_ready_members() -> None:
    harness = Harness(WarmPoolReconciler)
    harness.put(SANDBOX_TEMPLATE, template())
    harness.put(SANDBOX_WARM_POOL, pool(2))
    assert await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm") is None
    assert len(members(harness)) == 2
    status = harness.get(SANDBOX_WARM_POOL, NAMESPACE, "warm")["status"]
    assert status == {
        "replicas": 2,
        "readyReplicas": 0,
        "selector": f"{c.LABEL_WARM_POOL}={naming.name_hash('warm')}",
        "observedGeneration": 1,
    }
    make_ready(harness, SANDBOX, members(harness)[0])
    harness.writes()
    await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm")
    assert harness.writes() == [f"status {SANDBOX_WARM_POOL.path(NAMESPACE, 'warm')}"]
    assert harness.get(SANDBOX_WARM_POOL, NAMESPACE, "warm")["status"]["readyReplicas"] == 1
    await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm")
    assert harness.writes() == []  # nothing changed: nothing written


async def test_scaling_down_sheds_the_unready_first() -> None:
    harness = Harness(WarmPoolReconciler)
    harness.put(SANDBOX_TEMPLATE, template())
    harness.put(SANDBOX_WARM_POOL, pool(2))
    await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm")
    kept = members(harness)[1]
    make_ready(harness, SANDBOX, kept)
    body = harness.get(SANDBOX_WARM_POOL, NAMESPACE, "warm")
    body["spec"]["replicas"] = 1
    body["metadata"]["generation"] = 2
    harness.api.put(SANDBOX_WARM_POOL, body)
    await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm")
    assert members(harness) == [kept]
    status = harness.get(SANDBOX_WARM_POOL, NAMESPACE, "warm")["status"]
    assert (status["replicas"], status["readyReplicas"], status["observedGeneration"]) == (1, 1, 2)


async def test_without_its_template_a_pool_warns_and_creates_nothing() -> None:
    harness = Harness(WarmPoolReconciler)
    harness.put(SANDBOX_WARM_POOL, pool(2))
    await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm")
    assert members(harness) == []
    assert harness.recorder.reasons() == [c.REASON_TEMPLATE_NOT_FOUND]
    assert harness.get(SANDBOX_WARM_POOL, NAMESPACE, "warm")["status"]["replicas"] == 0
