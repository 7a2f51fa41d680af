"""The SandboxWarmPool reconciler over the engine's client and cache, the API server in memory: it fills and
sheds its pool, and writes its counts once."""

from __future__ import annotations

from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.kinds import SANDBOX, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL
from shadow_operator.controllers.config import Config
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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def adopt(harness: Harness, name: str) -> None:
    """A claim takes the member: its controller reference moves to the claim."""
    body = harness.get(SANDBOX, NAMESPACE, name)
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim", "name": f"claim-{name}",
         "uid": f"uid-claim-{name}", "controller": True}
    ]  # fmt: skip
    harness.api.put(SANDBOX, body)
    harness.sync()


async def full_pool(replicas: int, config: Config | None = None) -> tuple[Harness, Clock]:
    harness = Harness(WarmPoolReconciler, config)
    clock = Clock()
    harness.reconciler.clock = clock  # type: ignore[attr-defined]
    harness.put(SANDBOX_TEMPLATE, template())
    harness.put(SANDBOX_WARM_POOL, pool(replicas))
    await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm")  # a new pool fills at once
    for name in members(harness):
        make_ready(harness, SANDBOX, name)
    harness.sync()
    return harness, clock


async def test_a_burst_of_claims_is_replaced_once_the_claims_pause() -> None:
    harness, clock = await full_pool(4)
    taken = members(harness)[:2]
    adopt(harness, taken[0])
    # The refill waits the delay (1 s by default) after the member was taken, not the owns_delay.
    assert await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm") == pytest.approx(1.0)
    assert len(members(harness)) == 4  # the taken one still exists, as the claim's: nothing new
    clock.now += 0.6
    adopt(harness, taken[1])
    assert await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm") == pytest.approx(1.0)  # counted anew
    clock.now += 0.5
    assert await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm") == pytest.approx(0.5)
    assert len(members(harness)) == 4
    assert harness.get(SANDBOX_WARM_POOL, NAMESPACE, "warm")["status"]["replicas"] == 2
    clock.now += 0.5
    assert await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm") is None
    assert len(members(harness)) == 6  # two replacements, created together
    assert harness.get(SANDBOX_WARM_POOL, NAMESPACE, "warm")["status"]["replicas"] == 4


async def test_claims_that_never_pause_wait_no_longer_than_the_max_delay() -> None:
    harness, clock = await full_pool(30)
    waits = []
    for name in members(harness)[:25]:
        adopt(harness, name)
        waits.append(await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm"))
        clock.now += 0.5
    # Short since the first claim: the max delay (10 s) runs out at the 21st, 10 s later; the 21 missing are
    # created then, and the next claim starts a new wait.
    assert waits[:19] == [pytest.approx(1.0)] * 19
    assert waits[19:] == [pytest.approx(0.5), None, *[pytest.approx(1.0)] * 4]
    assert len(members(harness)) == 30 + 21


async def test_a_pool_without_a_ready_member_left_or_without_a_delay_refills_at_once() -> None:
    harness, _ = await full_pool(1)
    adopt(harness, members(harness)[0])
    assert await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm") is None
    assert len(members(harness)) == 2

    harness, _ = await full_pool(2, Config(SHADOW_WARM_POOL_REFILL_DELAY="0"))
    adopt(harness, members(harness)[0])
    assert await harness.run(SANDBOX_WARM_POOL, NAMESPACE, "warm") is None
    assert len(members(harness)) == 3
