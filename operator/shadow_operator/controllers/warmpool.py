"""SandboxWarmPool controller: keep `replicas` sandboxes of a template, replenish and roll them."""

from __future__ import annotations

import contextlib
from typing import Any

import kopf

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.clients.kube import Kube
from shadow_operator.controllers import claim as claim_controller
from shadow_operator.controllers import events, metrics, runtime
from shadow_operator.controllers.claim import pools, templates
from shadow_operator.controllers.sandbox import sandboxes
from shadow_operator.resources import blueprint
from shadow_operator.resources import conditions as conds
from shadow_operator.resources import sandbox as res

KIND = "SandboxWarmPool"
MISSING_TEMPLATE_RETRY = 30.0
RESYNC_SECONDS = 60.0


def enqueue(namespace: str, name: str, delay: float = 0.0) -> None:
    runtime.current().queue(KIND).add(namespace, name, delay)


@kopf.on.event(c.EXTENSIONS_GROUP, c.STORAGE_VERSION, "sandboxwarmpools")
async def pool_event(namespace: str | None, name: str, type: str, **_: Any) -> None:
    if not namespace:
        return
    enqueue(namespace, name)
    if type in (None, "ADDED"):
        await claim_controller.enqueue_unready(runtime.current().kube, namespace)


@kopf.on.event(c.SANDBOX_GROUP, c.STORAGE_VERSION, "sandboxes", labels={c.LABEL_WARM_POOL: kopf.PRESENT})
async def warm_sandbox_event(body: kopf.Body, **_: Any) -> None:
    for ref in body["metadata"].get("ownerReferences") or ():
        if ref.get("kind") == KIND and ref.get("controller"):
            enqueue(body["metadata"]["namespace"], ref["name"])


def _ready(sandbox: dict[str, Any]) -> bool:
    return conds.is_true((sandbox.get("status") or {}).get("conditions"), c.COND_READY)


async def reconcile(namespace: str, name: str) -> float | None:
    kube = runtime.current().kube
    pool = await kube.get(pools(namespace, name))
    if pool is None or pool["metadata"].get("deletionTimestamp"):
        for gauge in (metrics.WARM_POOL_SIZE, metrics.WARM_POOL_READY, metrics.WARM_POOL_DESIRED):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)
        return None
    spec = pool["spec"]
    desired = int(spec.get("replicas", 1))
    selector = f"{c.LABEL_WARM_POOL}={naming.name_hash(name)}"
    members = [
        s
        for s in await kube.list(sandboxes(namespace), labels=selector)
        if res.controller_uid(s) == pool["metadata"]["uid"] and not s["metadata"].get("deletionTimestamp")
    ]
    template = await kube.get(templates(namespace, spec["sandboxTemplateRef"]["name"]))
    again: float | None = RESYNC_SECONDS
    if template is None:
        events.warn(
            pool,
            reason=c.REASON_TEMPLATE_NOT_FOUND,
            message=f"SandboxTemplate {spec['sandboxTemplateRef']['name']!r} not found",
        )
        again = MISSING_TEMPLATE_RETRY
    else:
        members = await _roll(kube, pool, template, members)
        members = await _scale(kube, pool, template, members, desired)
    ready = sum(1 for s in members if _ready(s))
    await _write_status(kube, pool, len(members), ready, selector)
    metrics.WARM_POOL_SIZE.labels(namespace, name).set(len(members))
    metrics.WARM_POOL_READY.labels(namespace, name).set(ready)
    metrics.WARM_POOL_DESIRED.labels(namespace, name).set(desired)
    return again


async def _roll(
    kube: Kube, pool: dict[str, Any], template: dict[str, Any], members: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    strategy = (pool["spec"].get("updateStrategy") or {}).get("type", "OnReplenish")
    if strategy != "Recreate":
        return members
    current = blueprint.template_hash(template)
    fresh = []
    for sandbox in members:
        if (sandbox["metadata"].get("labels") or {}).get(c.LABEL_TEMPLATE_HASH) == current:
            fresh.append(sandbox)
        else:
            await _delete(kube, sandbox)
    if len(fresh) != len(members):
        events.info(
            pool, reason="Recreate", message=f"Replaced {len(members) - len(fresh)} stale warm sandboxes"
        )
    return fresh


async def _scale(
    kube: Kube, pool: dict[str, Any], template: dict[str, Any], members: list[dict[str, Any]], desired: int
) -> list[dict[str, Any]]:
    namespace = pool["metadata"]["namespace"]
    if len(members) < desired:
        for _ in range(desired - len(members)):
            members.append(
                await kube.create(sandboxes(namespace), blueprint.build_warm_sandbox(pool, template))
            )
    elif len(members) > desired:
        current = blueprint.template_hash(template)
        # Shed stale, then unready, then youngest sandboxes first (two stable sorts).
        members.sort(key=lambda s: str(s["metadata"]["creationTimestamp"]), reverse=True)
        members.sort(
            key=lambda s: (
                (s["metadata"].get("labels") or {}).get(c.LABEL_TEMPLATE_HASH) == current,
                _ready(s),
            )
        )
        for sandbox in members[: len(members) - desired]:
            await _delete(kube, sandbox)
        members = members[len(members) - desired :]
    return members


async def _delete(kube: Kube, sandbox: dict[str, Any]) -> None:
    meta = sandbox["metadata"]
    # The resourceVersion precondition fails (409) if a claim adopted this sandbox since we listed it.
    await kube.delete(
        sandboxes(meta["namespace"], meta["name"]), uid=meta["uid"], resource_version=meta["resourceVersion"]
    )


async def _write_status(kube: Kube, pool: dict[str, Any], count: int, ready: int, selector: str) -> None:
    meta = pool["metadata"]
    status = {
        "replicas": count,
        "readyReplicas": ready,
        "selector": selector,
        "observedGeneration": meta.get("generation"),
    }
    old = pool.get("status") or {}
    patch = {k: v for k, v in status.items() if old.get(k) != v}
    if patch:
        await kube.merge_patch(pools(meta["namespace"], meta["name"]) + "/status", {"status": patch})
