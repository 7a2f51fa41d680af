"""What a reconciler declares becomes caches and routes: own keys, owners (old and new), watch functions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api.kinds import (
    POD,
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    SECRET,
    SERVICE,
)
from shadow_operator.api.models import Sandbox, SandboxWarmPool
from shadow_operator.controllers import RECONCILERS
from shadow_operator.engine import Cache, Cached, Index, Manager, Reconciler, Watch, WorkQueue
from shadow_operator.engine.client import is_subset
from shadow_operator.engine.manager import Route, Running, _own_key
from shadow_operator.engine.reconciler import Deps, controller_keys
from shadow_operator.resources import environment as res

pytestmark = pytest.mark.unit


def sandbox(name: str, rv: str, owner_kind: str | None = None, owner: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "resourceVersion": rv, "uid": f"uid-{name}"}
    if owner_kind:
        group = "agents.x-k8s.io" if owner_kind == "Sandbox" else "extensions.agents.x-k8s.io"
        meta["ownerReferences"] = [
            {
                "apiVersion": f"{group}/v1beta1",
                "kind": owner_kind,
                "name": owner,
                "uid": f"uid-{owner}",
                "controller": True,
            }
        ]
    return {"metadata": meta}


def templates_to_pools(template: dict[str, Any], cache: Cache) -> list[tuple[str, str]]:
    return [("ns", "pool-of-" + template["metadata"]["name"])]


class PoolReconciler(Reconciler[SandboxWarmPool]):
    kind = SANDBOX_WARM_POOL
    owns = (SANDBOX,)
    watches = (Watch(SANDBOX_TEMPLATE, templates_to_pools),)
    owns_delay = 0.05


class BoxReconciler(Reconciler[Sandbox]):
    kind = SANDBOX
    owns = (POD,)
    cached = (Cached(POD, "example.com/mine"),)
    indexes = (Index(SANDBOX_CLAIM, "by-name", lambda obj: [obj["metadata"]["name"]]),)


def test_every_declared_kind_is_cached_with_its_selector() -> None:
    manager = Manager([PoolReconciler, BoxReconciler], load_config=dict)
    assert manager.cached == {
        SANDBOX_WARM_POOL: None,
        SANDBOX: None,
        SANDBOX_TEMPLATE: None,
        POD: "example.com/mine",
        SANDBOX_CLAIM: None,
    }


def test_conflicting_selectors_for_one_kind_are_refused() -> None:
    class Other(Reconciler[Sandbox]):
        kind = SANDBOX
        cached = (Cached(POD, "example.com/theirs"),)

    with pytest.raises(ValueError, match="two label selectors"):
        Manager([BoxReconciler, Other], load_config=dict)


def test_controller_keys_map_only_controllers_of_the_owner_kind() -> None:
    to_pool = controller_keys(SANDBOX_WARM_POOL)
    assert list(to_pool(sandbox("a", "1", "SandboxWarmPool", "pool"), Cache())) == [("ns", "pool")]
    assert list(to_pool(sandbox("a", "1", "SandboxClaim", "claim"), Cache())) == []
    assert list(to_pool(sandbox("a", "1"), Cache())) == []


async def test_a_child_changing_owner_wakes_old_and_new_owner_and_itself() -> None:
    """A warm sandbox adopted by a claim: the pool it left must refill, the claim must see it."""
    seen: dict[str, list[tuple[str, str]]] = {"pool": [], "claim": [], "sandbox": []}

    def recorder(name: str) -> Any:
        async def reconcile(key: tuple[str, str]) -> None:
            seen[name].append(key)

        return reconcile

    queues = {name: WorkQueue(name, recorder(name), workers=1) for name in seen}
    manager = Manager([PoolReconciler], load_config=dict)
    store = manager.cache.store(SANDBOX)
    store.add_listener(
        manager._dispatcher(
            [
                Route(queues["sandbox"], _own_key),
                Route(queues["pool"], controller_keys(SANDBOX_WARM_POOL), delay=0.05),
                Route(queues["claim"], controller_keys(SANDBOX_CLAIM)),
            ]
        )
    )
    for queue in queues.values():
        queue.start()
        queue.start_processing()
    store.upsert(sandbox("warm-1", "1", "SandboxWarmPool", "pool"))
    store.upsert(sandbox("warm-1", "2", "SandboxClaim", "claim"))
    await asyncio.sleep(0.02)
    assert seen["pool"] == [], "owner wake-ups wait for the reconciler's owns_delay"
    await asyncio.sleep(0.1)
    for queue in queues.values():
        await queue.stop()
    assert set(seen["sandbox"]) == {("ns", "warm-1")}
    assert seen["pool"] == [("ns", "pool")], "two changes within the delay: one pass"
    assert seen["claim"] == [("ns", "claim")]


@pytest.mark.parametrize(
    ("desired", "current", "expected"),
    [
        ({"a": 1}, {"a": 1, "defaulted": 2}, True),
        ({"a": {"b": [1, {"c": 2}]}}, {"a": {"b": [1, {"c": 2, "d": 3}]}}, True),
        ({"a": [1]}, {"a": [1, 2]}, False),
        ({"a": 1}, {"a": 2}, False),
        ({"a": {"b": 1}}, {"a": None}, False),
        ({"a": 1}, {}, False),
        ({"spec": {"egress": [], "ingress": [1]}}, {"spec": {"ingress": [1]}}, True),
        ({"spec": {"selector": {}}}, {"spec": {}}, True),
        ({"spec": {"egress": [1]}}, {"spec": {}}, False),
    ],
)
def test_apply_skips_a_write_only_when_every_desired_field_is_there(
    desired: Any, current: Any, expected: bool
) -> None:
    assert is_subset(desired, current) is expected


def test_the_operator_caches_gitea_objects_by_its_own_label_not_a_sandbox_one() -> None:
    """Gitea's Secret and Service are cached through the managed-by label they carry; none of them needs
    the Sandbox name hash any more, and the kinds' selectors agree between the reconcilers."""
    manager = Manager(RECONCILERS, load_config=dict)
    assert manager.cached[SECRET] == manager.cached[SERVICE] == c.MANAGED_BY_SELECTOR
    env = {"metadata": {"name": "demo", "namespace": "team"}, "spec": {}}
    for obj in (res.build_gitea_secret(env, "admin", "pw"), res.build_gitea_service(env)):
        labels = obj["metadata"]["labels"]
        assert labels[c.LABEL_MANAGED_BY] == c.MANAGED_BY_VALUE
        assert not any(key.startswith("agents.x-k8s.io/") for key in labels)


async def test_an_object_being_deleted_gets_no_pass_and_its_state_goes() -> None:
    """Deletion is the engine's, not each reconciler's: no pass over an object with a deletionTimestamp (its
    children go by garbage collection), `deleted` then and again once it is gone."""
    calls: list[tuple[str, str]] = []

    class Pools(Reconciler[SandboxWarmPool]):
        kind = SANDBOX_WARM_POOL

        async def reconcile(self, pool: SandboxWarmPool) -> float | None:
            calls.append(("reconcile", pool.name))
            return None

        async def deleted(self, key: tuple[str, str]) -> None:
            calls.append(("deleted", key[1]))

    manager = Manager([Pools], load_config=dict)
    none: Any = None
    deps = Deps(client=none, cache=manager.cache, recorder=none, config={}, enqueue=lambda key, delay: None)
    running = Running(
        kube=none, client=none, recorder=none, reconcilers={Pools.name(): Pools(deps)}, queues={}
    )
    reconcile = manager._reconcile_func(running, Pools)
    store = manager.cache.store(SANDBOX_WARM_POOL)
    meta = {"name": "pool", "namespace": "ns", "uid": "u", "resourceVersion": "1"}
    spec = {"sandboxTemplateRef": {"name": "tpl"}}
    store.upsert({"metadata": meta, "spec": spec})
    await reconcile(("ns", "pool"))
    deleting = {**meta, "resourceVersion": "2", "deletionTimestamp": "2026-01-01T00:00:00Z"}
    store.upsert({"metadata": deleting, "spec": spec})
    await reconcile(("ns", "pool"))
    store.remove("ns", "pool")
    await reconcile(("ns", "pool"))
    assert calls == [("reconcile", "pool"), ("deleted", "pool"), ("deleted", "pool")]
