"""SandboxClaim reconciler: adopt a ready warm sandbox or cold-start one, then mirror its readiness.

The hot path of a warm claim is three writes and no reads: the pool's members come from the cache, the
adoption is one conditional patch of the Sandbox (its resourceVersion guards against a racing claim), the claim
is annotated with the Sandbox's name, and its status is written from the adopted Sandbox's Ready condition in
the same pass. The first time a claim is seen it is also stamped (controller-first-observed-at), beside the
adoption.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api.kinds import SANDBOX, SANDBOX_CLAIM, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL
from shadow_operator.api.models import (
    ClaimLifecycle,
    ClaimSandboxStatus,
    Condition,
    Resource,
    Sandbox,
    SandboxClaim,
    SandboxClaimStatus,
    SandboxStatus,
)
from shadow_operator.clients.kube import ApiError
from shadow_operator.controllers import metrics
from shadow_operator.engine import Cache, Index, Reconciler, Watch
from shadow_operator.engine.status import StatusPass
from shadow_operator.resources import blueprint
from shadow_operator.resources import conditions as conds
from shadow_operator.resources import indexes as ix
from shadow_operator.resources.blueprint import ClaimBlocked as Blocked
from shadow_operator.resources.egress_narrowing import egress_narrowed
from shadow_operator.resources.metadata import controller_uid

Body = dict[str, Any]
Key = tuple[str, str]


# ------------------------------------------------------------------------------------------ watches
def _unready_claims(cache: Cache, values: Iterable[str]) -> Iterable[Key]:
    """The claims that wait on `values` and are not Ready yet, and those with a spec.egress (its
    EgressNarrowed condition follows the template)."""
    store = cache.store(SANDBOX_CLAIM)
    for value in values:
        for claim in store.by_index(ix.CLAIM_WAITS_ON, value):
            if not ix.is_ready(claim) or (claim.get("spec") or {}).get("egress") is not None:
                yield claim["metadata"]["namespace"], claim["metadata"]["name"]


def claims_of_template(template: Body, cache: Cache) -> Iterable[Key]:
    """Claims that wait for this template, directly or through one of its pools."""
    ns, name = template["metadata"]["namespace"], template["metadata"]["name"]
    pools = cache.store(SANDBOX_WARM_POOL).by_index(ix.POOL_BY_TEMPLATE, f"{ns}/{name}")
    values = [
        ix.waits_on(ns, "template", name),
        *(ix.waits_on(ns, "pool", p["metadata"]["name"]) for p in pools),
    ]
    return _unready_claims(cache, values)


def claims_of_pool(pool: Body, cache: Cache) -> Iterable[Key]:
    ns, name = pool["metadata"]["namespace"], pool["metadata"]["name"]
    values = [ix.waits_on(ns, "pool", name)]
    template = ((pool.get("spec") or {}).get("sandboxTemplateRef") or {}).get("name")
    if template:
        values.append(ix.waits_on(ns, "template", template))  # v1alpha1 claims with warmpool: default
    return _unready_claims(cache, values)


class ClaimReconciler(Reconciler[SandboxClaim]):
    kind = SANDBOX_CLAIM
    owns = (SANDBOX,)
    watches = (Watch(SANDBOX_TEMPLATE, claims_of_template), Watch(SANDBOX_WARM_POOL, claims_of_pool))
    indexes = (
        Index(SANDBOX, ix.BY_CONTROLLER, ix.by_controller),
        Index(SANDBOX, ix.POOL_MEMBER, ix.pool_member),
        Index(SANDBOX_CLAIM, ix.CLAIM_WAITS_ON, ix.claim_waits_on),
        Index(SANDBOX_WARM_POOL, ix.POOL_BY_TEMPLATE, ix.pool_by_template),
    )
    workers = 16

    async def reconcile(self, claim: SandboxClaim) -> float | None:
        if claim.deleting:
            return None
        # The first-observed stamp goes out beside the adoption, not before it: off the path to Ready.
        stamped = self._stamp_first_observed(claim)
        lifecycle = claim.spec.lifecycle
        now = datetime.now(UTC)
        claim_finished = _finished(claim.status.conditions if claim.status else None)
        if _expired(lifecycle, claim_finished, now):
            await stamped
            return await self._expire(claim, claim_finished)

        launch = c.LAUNCH_COLD
        try:
            sandbox = self._bound_sandbox(claim)
            if sandbox is None:
                sandbox, launch = await self._provision(claim)
        except Blocked as blocked:
            condition = conds.make_condition(
                c.COND_READY, False, blocked.reason, str(blocked), claim.metadata.generation
            )
            await stamped
            await self._status(claim, None, condition).write(self.client, SANDBOX_CLAIM)
            return _until(_expires_at(lifecycle, claim_finished), now)

        await stamped
        bound = Sandbox.from_body(sandbox)
        # The Sandbox's Finished, mirrored onto the claim, may end it now (ttlSecondsAfterFinished).
        finished = _finished(bound.status.conditions if bound.status else None) or claim_finished
        if _expired(lifecycle, finished, now):
            return await self._expire(claim, finished)
        # The sandbox's own label is authoritative: the claim may turn Ready passes after it adopted.
        launch = bound.metadata.labels.get(c.LABEL_LAUNCH_TYPE) or launch
        if launch == c.LAUNCH_WARM:
            # Before the status: a client that sees the claim Ready finds its sandbox named (as upstream).
            await self._annotate(claim, bound.name)
        await self._forward_resume(claim, bound)
        state = self._status(claim, bound, _mirror_ready(claim, bound))
        if await state.write(self.client, SANDBOX_CLAIM) and state.became_true(c.COND_READY):
            self._observe_startup(claim, launch)
        return _until(_expires_at(lifecycle, finished), now)

    def _stamp_first_observed(self, claim: SandboxClaim) -> asyncio.Future[None]:
        """Stamp agents.x-k8s.io/controller-first-observed-at (RFC 3339, sub-second) on a claim seen for the first
        time, as upstream's controller does; a done future when it has one."""
        if claim.metadata.annotations.get(c.ANNOTATION_CONTROLLER_FIRST_OBSERVED):
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        observed = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        patch = {"metadata": {"annotations": {c.ANNOTATION_CONTROLLER_FIRST_OBSERVED: observed}}}

        async def stamp() -> None:
            try:
                await self.client.patch(SANDBOX_CLAIM, claim.namespace, claim.name, patch)
            except ApiError as exc:
                if not exc.not_found:
                    raise

        return asyncio.ensure_future(stamp())

    def _bound_sandbox(self, claim: SandboxClaim) -> Body | None:
        """The Sandbox this claim controls (found by its controller reference, robust to a crash mid-adoption)."""
        owned = self.cache.store(SANDBOX).by_index(ix.BY_CONTROLLER, claim.metadata.uid)
        owned.sort(key=lambda s: (s["metadata"]["name"] != claim.name, s["metadata"]["creationTimestamp"]))
        return owned[0] if owned else None

    # ---------------------------------------------------------------------------------------- provision
    async def _provision(self, claim: SandboxClaim) -> tuple[Body, str]:
        namespace, spec = claim.namespace, claim.spec
        pools = self.cache.store(SANDBOX_WARM_POOL)
        candidate_pools: list[Body] = []
        if spec.warm_pool_ref is not None:
            pool = pools.get(namespace, spec.warm_pool_ref.name)
            if pool is None:
                raise Blocked(
                    c.REASON_WARM_POOL_NOT_FOUND, f"SandboxWarmPool {spec.warm_pool_ref.name!r} not found"
                )
            template_name = pool["spec"]["sandboxTemplateRef"]["name"]
            candidate_pools = [pool]
        else:
            assert spec.sandbox_template_ref is not None  # admission: exactly one of the two refs
            template_name = spec.sandbox_template_ref.name
            policy = spec.warmpool or "none"
            if policy == "default":
                candidate_pools = pools.by_index(ix.POOL_BY_TEMPLATE, f"{namespace}/{template_name}")
            elif policy != "none":
                named = pools.get(namespace, policy)
                if named is None:
                    raise Blocked(c.REASON_WARM_POOL_NOT_FOUND, f"SandboxWarmPool {policy!r} not found")
                candidate_pools = [named]

        template = self.cache.store(SANDBOX_TEMPLATE).get(namespace, template_name)
        if template is None:
            raise Blocked(c.REASON_TEMPLATE_NOT_FOUND, f"SandboxTemplate {template_name!r} not found")
        try:
            blueprint.check_metadata(claim.body)
            wants_cold = bool(spec.env or spec.volume_claim_templates)
            if candidate_pools and not wants_cold:
                adopted = await self._adopt(claim, candidate_pools, template)
                if adopted is not None:
                    return adopted, c.LAUNCH_WARM
            manifest = blueprint.build_claimed_sandbox(claim.body, template)
        except blueprint.ClaimRejected as rejected:
            self.recorder.warn(claim.body, reason=rejected.reason, message=str(rejected))
            raise
        return await self._create_cold(claim, manifest), c.LAUNCH_COLD

    async def _create_cold(self, claim: SandboxClaim, manifest: Body) -> Body:
        try:
            created = await self.client.create(SANDBOX, manifest)
        except ApiError as exc:
            if exc.invalid:
                raise Blocked(
                    c.REASON_RECONCILER_ERROR, f"Sandbox rejected by the API server: {exc.message}"
                ) from None
            if not exc.already_exists:
                raise
            existing = await self.client.get_live(SANDBOX, claim.namespace, claim.name)
            if existing is not None and controller_uid(existing) == claim.metadata.uid:
                self.cache.store(SANDBOX).upsert(existing)
                return existing
            raise Blocked(
                c.REASON_SANDBOX_CREATE_PENDING,
                f"a Sandbox named {claim.name!r} exists and is not owned by this claim",
            ) from None
        self.recorder.info(
            claim.body, reason="SandboxCreated", message=f"Created Sandbox {claim.name} (cold start)"
        )
        return created

    async def _adopt(self, claim: SandboxClaim, candidate_pools: list[Body], template: Body) -> Body | None:
        """Take over a warm sandbox; the resourceVersion guard makes concurrent claims pick different ones."""
        for pool in candidate_pools:
            for candidate in self._candidates(pool, claim.metadata.uid):
                try:
                    adopted = await self.client.patch(
                        SANDBOX,
                        claim.namespace,
                        candidate["metadata"]["name"],
                        blueprint.adoption_patch(candidate, claim.body, template),
                    )
                except ApiError as exc:
                    if exc.conflict or exc.not_found:
                        continue  # another claim won this one, or it vanished: try the next candidate
                    raise
                self.recorder.info(
                    claim.body,
                    reason="SandboxAdopted",
                    message=f"Adopted warm pool Sandbox {adopted['metadata']['name']}",
                )
                return adopted
        return None

    def _candidates(self, pool: Body, claim_uid: str) -> list[Body]:
        """Ready sandboxes first (oldest first), rotated per claim so that a burst of claims spreads over them
        instead of all racing for the same one; then the sandboxes that are still starting."""
        members = self.cache.store(SANDBOX).by_index(ix.POOL_MEMBER, pool["metadata"]["uid"])
        members.sort(key=lambda s: s["metadata"]["creationTimestamp"])
        ready = [s for s in members if ix.is_ready(s)]
        starting = [s for s in members if not ix.is_ready(s)]
        if ready:
            offset = zlib.crc32(claim_uid.encode()) % len(ready)
            ready = ready[offset:] + ready[:offset]
        return ready + starting

    # -------------------------------------------------------------------------------------------- status
    def _status(
        self,
        claim: SandboxClaim,
        sandbox: Sandbox | None,
        ready: Condition,
        finished: Condition | None = None,
    ) -> StatusPass[SandboxClaimStatus]:
        """The claim's status: `ready`, and what it mirrors of its bound Sandbox, or without one the `finished`
        condition it keeps (written by the caller)."""
        state = StatusPass(claim, SandboxClaimStatus)
        state.conditions.put(ready)
        if (template := self._template_of(claim)) is not None:
            state.conditions.set_or_remove(
                c.COND_EGRESS_NARROWED, egress_narrowed(template, claim.spec.egress)
            )
        if sandbox is None and finished is not None:
            state.conditions.put(finished)
        if sandbox is not None:
            sb_status = sandbox.status or SandboxStatus()
            finished = _finished(sb_status.conditions)
            if finished is not None:
                state.conditions.put(finished)
            else:
                state.conditions.remove(c.COND_FINISHED)
            state.status.sandbox = ClaimSandboxStatus.model_validate(
                {"name": sandbox.name, "podIPs": sb_status.pod_ips or None}
            )
            state.status.preview_url = sb_status.preview_url
        return state

    def _template_of(self, claim: SandboxClaim) -> Body | None:
        """The claim's template (through its pool when it names one), None while it or the pool is missing."""
        spec, namespace = claim.spec, claim.namespace
        name = spec.sandbox_template_ref.name if spec.sandbox_template_ref is not None else None
        if spec.warm_pool_ref is not None:
            pool = self.cache.store(SANDBOX_WARM_POOL).get(namespace, spec.warm_pool_ref.name)
            name = pool["spec"]["sandboxTemplateRef"]["name"] if pool is not None else None
        return self.cache.store(SANDBOX_TEMPLATE).get(namespace, name) if name else None

    async def _annotate(self, claim: SandboxClaim, name: str) -> None:
        """Name the bound sandbox on the claim (agents.x-k8s.io/sandbox-name)."""
        if claim.metadata.annotations.get(c.ANNOTATION_ASSIGNED_SANDBOX) == name:
            return
        try:
            await self.client.patch(
                SANDBOX_CLAIM,
                claim.namespace,
                claim.name,
                {"metadata": {"annotations": {c.ANNOTATION_ASSIGNED_SANDBOX: name}}},
            )
        except ApiError as exc:
            if not exc.not_found:
                raise

    async def _forward_resume(self, claim: SandboxClaim, sandbox: Sandbox) -> None:
        """A new value of the claim's shadow.dev/resume-requested goes to its Sandbox, once: a tenant may
        annotate its claim but not the Sandbox, which resumes on a new value of its own annotation. The value
        passed is kept on the Sandbox beside it, so one the router wrote since is never overwritten by an
        older one of the claim's."""
        value = claim.metadata.annotations.get(c.ANNOTATION_RESUME_REQUEST)
        if not value or sandbox.metadata.annotations.get(c.ANNOTATION_CLAIM_RESUME_REQUEST) == value:
            return
        annotations = {c.ANNOTATION_RESUME_REQUEST: value, c.ANNOTATION_CLAIM_RESUME_REQUEST: value}
        try:
            await self.client.patch(
                SANDBOX, sandbox.namespace, sandbox.name, {"metadata": {"annotations": annotations}}
            )
        except ApiError as exc:
            if not exc.not_found:
                raise

    def _observe_startup(self, claim: SandboxClaim, launch: str) -> None:
        meta = claim.metadata
        started = (
            conds.parse_time(meta.annotations.get(c.ANNOTATION_CLIENT_FIRST_REQUESTED))
            or meta.creation_timestamp
        )
        if started is None:
            return
        elapsed_ms = (datetime.now(UTC) - started).total_seconds() * 1000
        metrics.CLAIM_STARTUP_LATENCY.labels(meta.namespace, launch).observe(max(elapsed_ms, 0.0))

    # ------------------------------------------------------------------------------------------ lifecycle
    async def _expire(self, claim: SandboxClaim, finished: Condition | None) -> float | None:
        """shutdownTime or ttlSecondsAfterFinished reached: shutdownPolicy says what goes. Delete and
        DeleteForeground delete the claim (the Sandbox, its Pod and Service follow by owner reference; foreground:
        the claim stays until they are gone); Retain deletes the Sandbox and keeps the claim, Ready=False
        ClaimExpired, with the Finished condition it had."""
        namespace, name, uid = claim.namespace, claim.name, claim.metadata.uid
        lifecycle = claim.spec.lifecycle
        policy = lifecycle.shutdown_policy if lifecycle else "Retain"
        if policy in ("Delete", "DeleteForeground"):
            self.recorder.info(
                claim.body, reason=c.REASON_CLAIM_EXPIRED, message=f"Deleting Claim (ShutdownPolicy={policy})"
            )
            propagation = "Foreground" if policy == "DeleteForeground" else "Background"
            await self.client.delete(SANDBOX_CLAIM, namespace, name, propagation=propagation, uid=uid)
            return None
        sandbox = self._bound_sandbox(claim)
        if sandbox is not None and not Resource.model_validate(sandbox).deleting:
            await self.client.delete(
                SANDBOX, namespace, sandbox["metadata"]["name"], uid=sandbox["metadata"]["uid"]
            )
        was = conds.find(claim.status.conditions if claim.status else None, c.COND_READY)
        if was is None or was.reason != c.REASON_CLAIM_EXPIRED:
            self.recorder.info(claim.body, reason=c.REASON_CLAIM_EXPIRED, message="Claim expired")
        ready = conds.make_condition(
            c.COND_READY,
            False,
            c.REASON_CLAIM_EXPIRED,
            "Claim expired. Sandbox cleanup initiated.",
            claim.metadata.generation,
        )
        await self._status(claim, None, ready, finished).write(self.client, SANDBOX_CLAIM)
        return None


def _finished(conditions: Iterable[Condition] | None) -> Condition | None:
    """The Finished condition when it is True (a Sandbox's own, or the one mirrored onto a claim)."""
    finished = conds.find(conditions, c.COND_FINISHED)
    return finished if finished is not None and finished.status == "True" else None


def _expires_at(lifecycle: ClaimLifecycle | None, finished: Condition | None) -> datetime | None:
    """The earlier of shutdownTime and ttlSecondsAfterFinished after the Sandbox's Pod finished (upstream's rule)."""
    if lifecycle is None:
        return None
    due = lifecycle.shutdown_time
    ttl = lifecycle.ttl_seconds_after_finished
    since = finished.last_transition_time if finished is not None else None
    if ttl is not None and since is not None:
        after_finished = since + timedelta(seconds=int(ttl))
        due = after_finished if due is None else min(due, after_finished)
    return due


def _expired(lifecycle: ClaimLifecycle | None, finished: Condition | None, now: datetime) -> bool:
    due = _expires_at(lifecycle, finished)
    return due is not None and now >= due


def _until(due: datetime | None, now: datetime) -> float | None:
    return None if due is None else (due - now).total_seconds()


def _mirror_ready(claim: SandboxClaim, sandbox: Sandbox) -> Condition:
    generation = claim.metadata.generation
    ready = conds.find(sandbox.status.conditions if sandbox.status else None, c.COND_READY)
    if ready is not None and ready.reason == c.REASON_SANDBOX_EXPIRED:
        return conds.make_condition(
            c.COND_READY,
            False,
            c.REASON_SANDBOX_EXPIRED,
            "Underlying Sandbox resource has expired independently of the Claim.",
            generation,
        )
    if ready is None:
        return conds.make_condition(
            c.COND_READY, False, c.REASON_SANDBOX_NOT_READY, "Sandbox is not ready", generation
        )
    return conds.make_condition(c.COND_READY, ready.status, ready.reason, ready.message, generation)
