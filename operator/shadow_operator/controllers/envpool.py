"""ShadowEnvironmentPool reconciler: keep `replicas` environment instances started and unclaimed.

An instance is a workspace Sandbox and (unless the pool's gitea.enabled is false) a Gitea: Secret, Service,
NetworkPolicies and StatefulSet, all made by the environment builders from the pool's fields
(resources/pool.py) and controlled by the pool. A ShadowEnvironment naming the pool takes a Ready one by
moving those controller references to itself (controllers/environment/pool.py); that wakes this pool (the
engine maps the old owner too), which starts another. Instances made from other values (the pool's fields or
its template changed) are replaced; extra ones are removed, those not Ready first.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Iterable

from shadow_operator.api import constants as c
from shadow_operator.api.kinds import (
    SANDBOX,
    SANDBOX_TEMPLATE,
    SECRET,
    SHADOW_ENVIRONMENT_POOL,
    STATEFUL_SET,
)
from shadow_operator.api.models import ObjectMeta
from shadow_operator.api.pool import ShadowEnvironmentPool, ShadowEnvironmentPoolStatus
from shadow_operator.controllers import metrics
from shadow_operator.engine import Cache, Index, NotOwned, Reconciler, Watch, gather_bounded
from shadow_operator.engine.cache import Body, Key
from shadow_operator.engine.status import StatusPass
from shadow_operator.resources import environment as res
from shadow_operator.resources import gitea_policy
from shadow_operator.resources import indexes as ix
from shadow_operator.resources import pool as pools
from shadow_operator.resources.metadata import controller_uid

# Instances started at once: each is six objects; a few in parallel hide the API round trips.
CREATE_CONCURRENCY = 4
STATES = ("ready", "starting", "desired")


def _pools_in_namespace(template: Body, cache: Cache) -> Iterable[Key]:
    """A template changed: any pool of its namespace may use it (the default template is named by config)."""
    namespace = template["metadata"]["namespace"]
    for pool in cache.store(SHADOW_ENVIRONMENT_POOL).list(namespace):
        yield namespace, pool["metadata"]["name"]


class EnvironmentPoolReconciler(Reconciler[ShadowEnvironmentPool]):
    kind = SHADOW_ENVIRONMENT_POOL
    # The instances' Sandboxes (Ready, or taken) and Gitea StatefulSets (Ready) wake their pool.
    owns = (SANDBOX, STATEFUL_SET)
    watches = (Watch(SANDBOX_TEMPLATE, _pools_in_namespace),)
    indexes = (Index(SANDBOX, ix.BY_CONTROLLER, ix.by_controller),)
    workers = 2
    owns_delay = 0.2

    async def reconcile(self, pool: ShadowEnvironmentPool) -> float | None:
        template_name = pool.spec.template or self.config.default_template
        template = self.cache.store(SANDBOX_TEMPLATE).get(pool.namespace, template_name)
        members = [
            s
            for s in self.cache.store(SANDBOX).by_index(ix.BY_CONTROLLER, pool.metadata.uid or "")
            if not ObjectMeta.model_validate(s["metadata"]).deletion_timestamp
        ]
        if template is None:
            message = f"SandboxTemplate {template_name!r} does not exist in namespace {pool.namespace}"
            ready_count = sum(1 for s in members if self._ready(pool, s))
            await self._report(pool, len(members), ready_count, False, c.REASON_TEMPLATE_NOT_FOUND, message)
            return None  # the template's creation wakes us
        made_of = pools.instance_hash(pool.body["spec"], template, self.config.default_template)
        stale = [s for s in members if _made_of(s) != made_of]
        if stale:
            await asyncio.gather(*(self._delete(pool, s) for s in stale))
            self.recorder.info(
                pool.body,
                reason="Replaced",
                message=f"{len(stale)} instance(s) made from an older spec or template removed",
            )
        members = [s for s in members if s not in stale]
        members = await self._scale(pool, template, made_of, members)
        await asyncio.gather(*(self._ensure_gitea(pool, s["metadata"]["name"]) for s in members))
        ready_count = sum(1 for s in members if self._ready(pool, s))
        done = ready_count == len(members) == pool.spec.replicas
        message = f"{ready_count} of {pool.spec.replicas} instances Ready"
        await self._report(pool, len(members), ready_count, done, "Ready" if done else "Starting", message)
        return None

    async def deleted(self, key: Key) -> None:
        for state in STATES:
            with contextlib.suppress(KeyError):
                metrics.ENVIRONMENT_POOL_INSTANCES.remove(*key, state)

    # ------------------------------------------------------------------------------------- instances
    async def _scale(
        self, pool: ShadowEnvironmentPool, template: Body, made_of: str, members: list[Body]
    ) -> list[Body]:
        desired = pool.spec.replicas
        if len(members) < desired:
            members = members + await gather_bounded(
                desired - len(members), lambda: self._start(pool, template, made_of), CREATE_CONCURRENCY
            )
        elif len(members) > desired:
            # Not Ready first, then the youngest (two stable sorts).
            members.sort(
                key=lambda s: str(ObjectMeta.model_validate(s["metadata"]).creation_timestamp), reverse=True
            )
            members.sort(key=lambda s: self._ready(pool, s))
            extra = len(members) - desired
            await asyncio.gather(*(self._delete(pool, s) for s in members[:extra]))
            members = members[extra:]
        return members

    async def _start(self, pool: ShadowEnvironmentPool, template: Body, made_of: str) -> Body:
        """A new instance: its Sandbox (which reserves the name), then its Gitea."""
        while True:
            name = pools.new_instance_name(pool.name)
            body = pools.instance_body(pool.body, name)
            gitea_url = res.gitea_url(body, self.config.cluster_domain) if pool.spec.gitea.enabled else None
            sandbox = res.build_workspace_sandbox(body, template, gitea_base_url=gitea_url)
            pools.mark_instance(sandbox, pool.name, made_of)
            try:
                created = await self.client.apply(SANDBOX, sandbox, owner=pool.body)
            except NotOwned:
                continue  # the random name is taken: draw another
            await self._ensure_gitea(pool, name)
            return created

    async def _ensure_gitea(self, pool: ShadowEnvironmentPool, instance: str) -> None:
        """Gitea's objects of an instance, made once (an instance an environment took is left alone)."""
        if not pool.spec.gitea.enabled:
            return
        body = pools.instance_body(pool.body, instance)
        try:
            if self.cache.store(SECRET).get(pool.namespace, res.gitea_secret_name(instance)) is None:
                secret = res.build_gitea_secret(body, c.GITEA_ADMIN_USERNAME, secrets.token_urlsafe(24))
                await self.client.apply(SECRET, secret, owner=pool.body)
            current = self.cache.store(STATEFUL_SET).get(pool.namespace, res.gitea_name(instance))
            for kind, manifest in gitea_policy.build_gitea_children(body, self.config.gitea, current):
                await self.client.apply(kind, manifest, owner=pool.body)
        except NotOwned:
            return  # taken by an environment meanwhile

    async def _delete(self, pool: ShadowEnvironmentPool, sandbox: Body) -> None:
        """Remove an instance, unless an environment takes it first: the Sandbox goes on the condition that
        it is as this pass saw it (409 if taken meanwhile, and then nothing else is touched)."""
        meta = sandbox["metadata"]
        if not await self.client.delete_as_seen(SANDBOX, sandbox):
            return
        for kind, name in pools.instance_objects(meta["name"]):
            obj = self.cache.store(kind).get(meta["namespace"], name)
            if obj is not None and controller_uid(obj) == pool.metadata.uid:
                await self.client.delete_as_seen(kind, obj)

    def _ready(self, pool: ShadowEnvironmentPool, sandbox: Body) -> bool:
        if not ix.is_ready(sandbox):
            return False
        if not pool.spec.gitea.enabled:
            return True
        return res.gitea_ready(
            self.cache.store(STATEFUL_SET).get(pool.namespace, res.gitea_name(sandbox["metadata"]["name"]))
        )

    # ------------------------------------------------------------------------------------------ status
    async def _report(
        self,
        pool: ShadowEnvironmentPool,
        count: int,
        ready_count: int,
        ready: bool,
        reason: str,
        message: str,
    ) -> None:
        """Status, condition and gauges from the counts this pass found (not counted again here)."""
        key = (pool.namespace, pool.name)
        for state, value in (
            ("ready", ready_count),
            ("starting", count - ready_count),
            ("desired", pool.spec.replicas),
        ):
            metrics.ENVIRONMENT_POOL_INSTANCES.labels(*key, state).set(value)
        seen = StatusPass(pool, ShadowEnvironmentPoolStatus)
        seen.conditions.set(c.COND_READY, ready, reason, message)
        seen.status.replicas = count
        seen.status.ready_replicas = ready_count
        seen.status.selector = pools.selector(pool.name)
        seen.status.observed_generation = pool.metadata.generation
        await seen.write(self.client, SHADOW_ENVIRONMENT_POOL)


def _made_of(sandbox: Body) -> str | None:
    return ObjectMeta.model_validate(sandbox["metadata"]).annotations.get(c.ANNOTATION_POOL_HASH)
