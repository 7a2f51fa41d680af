"""SandboxWarmPool reconciler: keep `replicas` sandboxes of a template, replenish and roll them.

Members come from the cache (sandboxes the pool controls). A claim adopting one moves its controller reference
away, which wakes the pool at once (the engine maps the old owner too), and missing members are created
concurrently, once the claims pause: a burst of claims (a web app's new sessions) would otherwise share the
node's CPU with the Pods replacing what they took (kubelet, containerd, each runtime's start-up) just when
their first commands run. While the pool still has members to give, it waits until none was taken for
`warm_pool_refill_delay` seconds, and no longer than `warm_pool_refill_max_delay` after it first fell short.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.kinds import SANDBOX, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL
from shadow_operator.api.models import ObjectMeta, SandboxWarmPool, SandboxWarmPoolStatus
from shadow_operator.controllers import metrics
from shadow_operator.engine import Cache, Deps, Index, Reconciler, Watch, gather_bounded
from shadow_operator.engine.status import StatusPass
from shadow_operator.resources import blueprint
from shadow_operator.resources import indexes as ix

Body = dict[str, Any]
Key = tuple[str, str]
# Sandboxes created at once while filling a pool: enough to hide latency, few enough not to flood the server.
CREATE_CONCURRENCY = 16


def pools_of_template(template: Body, cache: Cache) -> Iterable[Key]:
    meta = template["metadata"]
    for pool in cache.store(SANDBOX_WARM_POOL).by_index(
        ix.POOL_BY_TEMPLATE, f"{meta['namespace']}/{meta['name']}"
    ):
        yield pool["metadata"]["namespace"], pool["metadata"]["name"]


@dataclass(frozen=True)
class Shortfall:
    """What a pool's last pass saw: its members, when it last lost one, since when it has been short."""

    members: int
    lost_at: float | None = None
    short_since: float | None = None


def refill_wait(
    seen: Shortfall | None, members: int, ready: int, desired: int, now: float, delay: float, max_delay: float
) -> tuple[Shortfall, float]:
    """This pass's Shortfall (`members` of them `ready`, `desired` wanted), and the seconds to wait before
    creating the missing members (0: now)."""
    if members >= desired:
        return Shortfall(members), 0.0
    lost_at = now if seen and members < seen.members else (seen.lost_at if seen else None)
    short_since = seen.short_since if seen and seen.short_since is not None else now
    state = Shortfall(members, lost_at, short_since)
    # A pool that never lost a member (new, scaled up, the operator restarted) or has none Ready left to give
    # (the next claims start cold): filled now.
    if lost_at is None or not ready or delay <= 0:
        return state, 0.0
    return state, max(0.0, min(lost_at + delay, short_since + max_delay) - now)


class WarmPoolReconciler(Reconciler[SandboxWarmPool]):
    kind = SANDBOX_WARM_POOL
    owns = (SANDBOX,)
    watches = (Watch(SANDBOX_TEMPLATE, pools_of_template),)
    indexes = (
        Index(SANDBOX, ix.BY_CONTROLLER, ix.by_controller),
        Index(SANDBOX_WARM_POOL, ix.POOL_BY_TEMPLATE, ix.pool_by_template),
    )
    workers = 4
    owns_delay = 0.2
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(self, deps: Deps) -> None:
        super().__init__(deps)
        self._shortfalls: dict[Key, Shortfall] = {}

    async def reconcile(self, pool: SandboxWarmPool) -> float | None:
        if pool.deleting:
            await self.deleted((pool.namespace, pool.name))
            return None
        desired = pool.spec.replicas
        members = [
            s
            for s in self.cache.store(SANDBOX).by_index(ix.BY_CONTROLLER, pool.metadata.uid)
            if not ObjectMeta.model_validate(s["metadata"]).deletion_timestamp
        ]
        template_name = pool.spec.sandbox_template_ref.name
        template = self.cache.store(SANDBOX_TEMPLATE).get(pool.namespace, template_name)
        wait = 0.0
        if template is None:
            self.recorder.warn(
                pool.body,
                reason=c.REASON_TEMPLATE_NOT_FOUND,
                message=f"SandboxTemplate {template_name!r} not found",
            )
        else:
            members = await self._roll(pool, template, members)
            key = (pool.namespace, pool.name)
            self._shortfalls[key], wait = refill_wait(
                self._shortfalls.get(key),
                len(members),
                sum(1 for s in members if ix.is_ready(s)),
                desired,
                self.clock(),
                self.config.warm_pool_refill_delay,
                self.config.warm_pool_refill_max_delay,
            )
            if not wait:
                members = await self._scale(pool, template, members, desired)
                self._shortfalls[key] = Shortfall(len(members))
        ready = sum(1 for s in members if ix.is_ready(s))
        state = StatusPass(pool, SandboxWarmPoolStatus)
        state.status.replicas = len(members)
        state.status.ready_replicas = ready
        state.status.selector = f"{c.LABEL_WARM_POOL}={naming.name_hash(pool.name)}"
        state.status.observed_generation = pool.metadata.generation
        await state.write(self.client, SANDBOX_WARM_POOL)
        metrics.WARM_POOL_SIZE.labels(pool.namespace, pool.name).set(len(members))
        metrics.WARM_POOL_READY.labels(pool.namespace, pool.name).set(ready)
        metrics.WARM_POOL_DESIRED.labels(pool.namespace, pool.name).set(desired)
        return wait or None

    async def deleted(self, key: Key) -> None:
        self._shortfalls.pop(key, None)
        for gauge in (metrics.WARM_POOL_SIZE, metrics.WARM_POOL_READY, metrics.WARM_POOL_DESIRED):
            with contextlib.suppress(KeyError):
                gauge.remove(*key)

    async def _roll(self, pool: SandboxWarmPool, template: Body, members: list[Body]) -> list[Body]:
        strategy = pool.spec.update_strategy.type if pool.spec.update_strategy else "OnReplenish"
        if strategy != "Recreate":
            return members
        fresh = [s for s in members if not blueprint.is_stale(s, template)]
        stale = [s for s in members if s not in fresh]
        await asyncio.gather(*(self._delete(s) for s in stale))
        if stale:
            self.recorder.info(
                pool.body, reason="Recreate", message=f"Replaced {len(stale)} stale warm sandboxes"
            )
        return fresh

    async def _scale(
        self, pool: SandboxWarmPool, template: Body, members: list[Body], desired: int
    ) -> list[Body]:
        if len(members) < desired:
            manifest = blueprint.build_warm_sandbox(pool.body, template)
            members = members + await gather_bounded(
                desired - len(members), lambda: self.client.create(SANDBOX, manifest), CREATE_CONCURRENCY
            )
        elif len(members) > desired:
            current = blueprint.template_hash(template)
            # Shed stale, then unready, then youngest sandboxes first (two stable sorts).
            members.sort(key=lambda s: str(s["metadata"]["creationTimestamp"]), reverse=True)
            members.sort(
                key=lambda s: (
                    _template_hash(s) == current,
                    ix.is_ready(s),
                )
            )
            await asyncio.gather(*(self._delete(s) for s in members[: len(members) - desired]))
            members = members[len(members) - desired :]
        return members

    async def _delete(self, sandbox: Body) -> None:
        # Fails (409) if a claim adopted this sandbox since we cached it; the adoption wakes this pool again.
        await self.client.delete_as_seen(SANDBOX, sandbox)


def _template_hash(sandbox: Body) -> str | None:
    return ObjectMeta.model_validate(sandbox["metadata"]).labels.get(c.LABEL_TEMPLATE_HASH)
