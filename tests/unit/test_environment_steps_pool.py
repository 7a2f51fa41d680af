"""The environment's pool step with fakes: which instance it takes, and the races it must win or lose cleanly."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api.kinds import SANDBOX, SHADOW_ENVIRONMENT_POOL, STATEFUL_SET
from shadow_operator.controllers.environment.pool import PoolStep
from shadow_operator.resources import environment as res
from shadow_operator.resources import indexes as ix
from shadow_operator.resources import pool as pools

from tests.support.fakes import NAMESPACE, World, environment, new_pass

pytestmark = pytest.mark.unit

TEMPLATE = {"metadata": {"name": "workspace", "namespace": NAMESPACE}, "spec": {"podTemplate": {"spec": {}}}}
SPEC = {
    "sources": [{"name": "app", "repo": "app", "upload": {}}],
    "pool": "warm",
    "workspace": {"size": "1Gi"},
}
POOL = {
    "apiVersion": "shadow.dev/v1alpha1",
    "kind": "ShadowEnvironmentPool",
    "metadata": {"name": "warm", "namespace": NAMESPACE, "uid": "uid-pool", "resourceVersion": "1"},
    "spec": {"replicas": 1, "workspace": {"size": "1Gi"}},
}


def instance(world: World, name: str, resource_version: str) -> dict[str, Any]:
    """A Ready instance of POOL in the cache (and its Gitea Ready), as the pool made it."""
    sandbox = {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "resourceVersion": resource_version,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {c.LABEL_POOL: "warm"},
            "annotations": {c.ANNOTATION_POOL_HASH: pools.instance_hash(POOL["spec"], TEMPLATE, "workspace")},
            "ownerReferences": [
                {"apiVersion": "shadow.dev/v1alpha1", "kind": "ShadowEnvironmentPool", "name": "warm",
                 "uid": "uid-pool", "controller": True}
            ],
        },
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "DependenciesReady"}]},
    }  # fmt: skip
    world.cache.store(SANDBOX).upsert(copy.deepcopy(sandbox))
    world.cache.store(STATEFUL_SET).upsert(
        {
            "metadata": {"name": res.gitea_name(name), "namespace": NAMESPACE, "resourceVersion": "1"},
            "status": {"readyReplicas": 1},
        }
    )
    return sandbox


def world_with_pool() -> World:
    world = World()
    world.cache.store(SANDBOX).add_index(ix.BY_CONTROLLER, ix.by_controller)
    world.cache.store(SHADOW_ENVIRONMENT_POOL).upsert(copy.deepcopy(POOL))
    return world


async def test_an_instance_whose_status_changed_since_the_cache_saw_it_is_still_taken() -> None:
    """The cache is a version behind (the Sandbox controller wrote its status since): the conditional patch
    fails with 409, and the instance, still the pool's and Ready, is taken with its newer version."""
    world = world_with_pool()
    seen = instance(world, "warm-abcde", resource_version="1")
    newer = copy.deepcopy(seen)
    newer["metadata"]["resourceVersion"] = "2"
    world.client.put(SANDBOX, newer)
    state = new_pass(environment("taker", spec=SPEC))
    await PoolStep(world.deps).take(state, TEMPLATE)
    assert state.status.sandbox == "warm-abcde"
    assert state.status.pool is not None and state.status.pool.reason == "Adopted"
    taken = await world.client.get_live(SANDBOX, NAMESPACE, "warm-abcde")
    assert taken is not None and taken["metadata"]["ownerReferences"][0]["uid"] == "uid-taker"


async def test_an_instance_another_environment_took_meanwhile_is_not_taken_again() -> None:
    world = world_with_pool()
    seen = instance(world, "warm-abcde", resource_version="1")
    theirs = copy.deepcopy(seen)
    theirs["metadata"]["resourceVersion"] = "2"
    theirs["metadata"]["ownerReferences"] = [
        {"apiVersion": "shadow.dev/v1alpha1", "kind": "ShadowEnvironment", "name": "first", "uid": "uid-first",
         "controller": True}
    ]  # fmt: skip
    world.client.put(SANDBOX, theirs)
    state = new_pass(environment("second", spec=SPEC))
    await PoolStep(world.deps).take(state, TEMPLATE)
    assert state.status.sandbox == "second"
    assert state.status.pool is not None and state.status.pool.reason == "PoolEmpty"
    kept = await world.client.get_live(SANDBOX, NAMESPACE, "warm-abcde")
    assert kept is not None and kept["metadata"]["ownerReferences"][0]["uid"] == "uid-first"
