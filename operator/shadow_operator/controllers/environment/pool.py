"""The pool step: an environment naming a ShadowEnvironmentPool (spec.pool) takes one of its started instances
(a Ready workspace Sandbox and a Ready Gitea) instead of starting its own, once, at creation.

Taking an instance moves its objects' controller reference from the pool to the environment: first the
Sandbox, conditionally on the resourceVersion the pool's instance was seen at (two environments racing for
one instance: one wins, the other takes the next), then Gitea's Secret, Service, NetworkPolicies and
StatefulSet. From then on the environment owns them exactly as objects it made (they are named after the
instance: status.sandbox), and the pool starts another instance. Each pass finishes a take-over an earlier
pass began (an operator stopped between the writes), and a Sandbox the environment already controls is
found again even when the status that named it was never written.
"""

from __future__ import annotations

from shadow_operator.api import constants as c
from shadow_operator.api.environment import PoolAdoption
from shadow_operator.api.kinds import SANDBOX, SHADOW_ENVIRONMENT_POOL, STATEFUL_SET
from shadow_operator.api.models import ObjectMeta
from shadow_operator.clients.kube import ApiError
from shadow_operator.controllers import metrics
from shadow_operator.controllers.environment.state import Pass, Ports
from shadow_operator.engine.cache import Body
from shadow_operator.resources import environment as res
from shadow_operator.resources import indexes as ix
from shadow_operator.resources import pool as pools
from shadow_operator.resources.metadata import controller_uid, owner_reference

# Conditional patches of one instance's Sandbox before moving on to the next instance.
TAKE_ATTEMPTS = 3


class PoolStep:
    def __init__(self, deps: Ports) -> None:
        self.deps = deps

    async def take(self, state: Pass, template: Body) -> None:
        """Decide (once) what the environment's children are named after; take a pool instance if it may."""
        env, status = state.env, state.status
        if status.sandbox is None:
            status.sandbox = self._already_taken(state) or await self._choose(state, template)
        if status.sandbox != env.name:
            await self._take_over(state, status.sandbox)

    def _already_taken(self, state: Pass) -> str | None:
        env = state.env
        for sandbox in self.deps.cache.store(SANDBOX).by_index(ix.BY_CONTROLLER, env.metadata.uid or ""):
            return str(sandbox["metadata"]["name"])
        return None

    async def _choose(self, state: Pass, template: Body) -> str:
        env, deps = state.env, self.deps
        name = env.spec.pool
        if not name:
            return env.name
        pool = deps.cache.store(SHADOW_ENVIRONMENT_POOL).get(env.namespace, name)
        taken: str | None = None
        if env.spec.workspace.from_ is not None:
            reason, message = "Fork", "a fork's workspace is made from its source, not taken from a pool"
        elif pool is None:
            reason, message = (
                "PoolNotFound",
                f"ShadowEnvironmentPool {name!r} does not exist in {env.namespace}",
            )
        elif found := pools.differences(env.body["spec"], pool["spec"], deps.config.default_template):
            reason = "PoolMismatch"
            message = (
                f"spec.{', spec.'.join(found)} differ from ShadowEnvironmentPool {name!r}'s; its instances "
                "are made from the pool's values"
            )
        else:
            made_of = pools.instance_hash(env.body["spec"], template, deps.config.default_template)
            taken = await self._take_one(state, pool, made_of)
            reason = "Adopted" if taken else "PoolEmpty"
            message = (
                f"took instance {taken} of ShadowEnvironmentPool {name}"
                if taken
                else f"ShadowEnvironmentPool {name!r} has no Ready instance of the current template"
            )
        metrics.POOL_TAKES.labels(env.namespace, name, reason).inc()
        state.status.pool = PoolAdoption(name=name, adopted=taken is not None, reason=reason, message=message)
        if taken:
            deps.recorder.info(env.body, reason="PoolInstanceTaken", message=message)
        else:
            deps.recorder.info(env.body, reason=reason, message=f"{message}; starting a workspace and Gitea")
        return taken or env.name

    async def _take_one(self, state: Pass, pool: Body, made_of: str) -> str | None:
        """The oldest Ready instance of the pool made from `made_of`, taken; None when there is none."""
        env, deps = state.env, self.deps
        gitea_on = env.spec.gitea.enabled
        candidates: list[tuple[str, Body]] = []
        for sandbox in deps.cache.store(SANDBOX).by_index(ix.BY_CONTROLLER, pool["metadata"]["uid"]):
            meta = ObjectMeta.model_validate(sandbox["metadata"])
            if meta.deletion_timestamp or not ix.is_ready(sandbox):
                continue
            if meta.annotations.get(c.ANNOTATION_POOL_HASH) != made_of:
                continue
            gitea = deps.cache.store(STATEFUL_SET).get(env.namespace, res.gitea_name(meta.name))
            if gitea_on and not res.gitea_ready(gitea):
                continue
            candidates.append((str(meta.creation_timestamp), sandbox))
        candidates.sort(key=lambda found: found[0])
        for _, sandbox in candidates:
            if await self._take_sandbox(state, pool, sandbox):
                return str(sandbox["metadata"]["name"])
        return None

    async def _take_sandbox(self, state: Pass, pool: Body, sandbox: Body | None) -> bool:
        """Move the instance's Sandbox to the environment, on the condition that it is as seen. A conflict
        with a newer version that is still the pool's and Ready (its status was written since the cache saw
        it) is tried again with that version; one taken by another environment, or deleted, is not."""
        env, client = state.env, self.deps.client
        for _ in range(TAKE_ATTEMPTS):
            if sandbox is None or controller_uid(sandbox) != pool["metadata"]["uid"]:
                return False
            meta = ObjectMeta.model_validate(sandbox["metadata"])
            if meta.deletion_timestamp or not ix.is_ready(sandbox):
                return False
            patch = {
                "metadata": {
                    "resourceVersion": meta.resource_version,
                    "ownerReferences": [owner_reference(env.body)],
                    "labels": {c.LABEL_POOL: None},
                }
            }
            try:
                await client.patch(SANDBOX, env.namespace, meta.name, patch)
            except ApiError as exc:
                if exc.not_found:
                    return False
                if not exc.conflict:
                    raise
                sandbox = await client.get_live(SANDBOX, env.namespace, meta.name)
                continue
            return True
        return False

    async def _take_over(self, state: Pass, instance: str) -> None:
        """Gitea's objects of the instance move to the environment (those the pool still controls)."""
        env, deps = state.env, self.deps
        for kind, name in pools.instance_objects(instance):
            obj = deps.cache.store(kind).get(env.namespace, name)
            if obj is None or controller_uid(obj) == env.metadata.uid:
                continue
            if not _controlled_by_pool(obj):
                continue  # not an instance's: the environment's apply reports the name conflict
            patch = {"metadata": {"ownerReferences": [owner_reference(env.body)]}}
            await deps.client.patch(kind, env.namespace, name, patch)


def _controlled_by_pool(obj: Body) -> bool:
    ref = ObjectMeta.model_validate(obj["metadata"]).controller
    return (
        ref is not None
        and ref.kind == SHADOW_ENVIRONMENT_POOL.kind
        and ref.api_version.startswith(f"{c.SHADOW_GROUP}/")
    )
