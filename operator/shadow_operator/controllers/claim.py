"""SandboxClaim controller: adopt a ready warm sandbox or cold-start one, then mirror its readiness."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.clients.kube import ApiError, Kube, resource_path
from shadow_operator.controllers import events, metrics, runtime
from shadow_operator.controllers.sandbox import parse_time, sandboxes
from shadow_operator.resources import blueprint
from shadow_operator.resources import conditions as conds
from shadow_operator.resources import sandbox as res

KIND = "SandboxClaim"
MISSING_REFERENT_RETRY = 30.0
ADOPTION_ATTEMPTS = 5
REPLENISH_DELAY = 0.5


def claims(namespace: str, name: str | None = None, sub: str | None = None) -> str:
    return resource_path(c.EXTENSIONS_API_VERSION, "sandboxclaims", namespace, name, sub)


def templates(namespace: str, name: str | None = None) -> str:
    return resource_path(c.EXTENSIONS_API_VERSION, "sandboxtemplates", namespace, name)


def pools(namespace: str, name: str | None = None) -> str:
    return resource_path(c.EXTENSIONS_API_VERSION, "sandboxwarmpools", namespace, name)


class Blocked(Exception):
    """The claim cannot progress until something changes; `reason` goes into the Ready condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def enqueue(namespace: str, name: str, delay: float = 0.0) -> None:
    runtime.current().queue(KIND).add(namespace, name, delay)


@kopf.on.event(c.EXTENSIONS_GROUP, c.STORAGE_VERSION, "sandboxclaims")
async def claim_event(namespace: str | None, name: str, **_: Any) -> None:
    if namespace:
        enqueue(namespace, name)


@kopf.on.event(c.SANDBOX_GROUP, c.STORAGE_VERSION, "sandboxes", labels={c.LABEL_CLAIM_UID: kopf.PRESENT})
async def sandbox_event(body: kopf.Body, **_: Any) -> None:
    for ref in body["metadata"].get("ownerReferences") or ():
        if ref.get("kind") == KIND and ref.get("controller"):
            enqueue(body["metadata"]["namespace"], ref["name"])


async def enqueue_unready(kube: Kube, namespace: str) -> None:
    """Wake claims of a namespace that wait for a template or pool to appear."""
    for item in await kube.list(claims(namespace)):
        if not conds.is_true((item.get("status") or {}).get("conditions"), c.COND_READY):
            enqueue(namespace, item["metadata"]["name"])


# ------------------------------------------------------------------------------------------ reconcile
async def reconcile(namespace: str, name: str) -> float | None:
    kube = runtime.current().kube
    claim = await kube.get(claims(namespace, name))
    if claim is None or claim["metadata"].get("deletionTimestamp"):
        return None
    lifecycle = claim["spec"].get("lifecycle") or {}
    now = datetime.now(UTC)
    shutdown = parse_time(lifecycle.get("shutdownTime"))
    expired = shutdown is not None and now >= shutdown

    if expired:
        return await _expire(kube, claim, lifecycle.get("shutdownPolicy") or "Retain")

    sandbox: dict[str, Any] | None = None
    launch = c.LAUNCH_COLD
    try:
        sandbox = await _bound_sandbox(kube, claim)
        if sandbox is None:
            sandbox, launch = await _provision(kube, claim)
    except Blocked as blocked:
        await _write_status(
            kube,
            claim,
            None,
            conds.make_condition(
                c.COND_READY, False, blocked.reason, blocked.message, claim["metadata"].get("generation")
            ),
        )
        if blocked.reason in (c.REASON_TEMPLATE_NOT_FOUND, c.REASON_WARM_POOL_NOT_FOUND):
            return MISSING_REFERENT_RETRY
        return None

    # The sandbox's own label is authoritative: the claim may turn Ready passes after it adopted.
    launch = (sandbox["metadata"].get("labels") or {}).get(c.LABEL_LAUNCH_TYPE) or launch
    ready = _mirror_ready(claim, sandbox)
    await _write_status(kube, claim, sandbox, ready, launch=launch)
    delays = []
    if shutdown is not None:
        delays.append((shutdown - now).total_seconds())
    ttl_delay = await _ttl_after_finished(kube, claim, sandbox, lifecycle)
    if ttl_delay is not None:
        delays.append(ttl_delay)
    return min(delays) if delays else None


async def _bound_sandbox(kube: Kube, claim: dict[str, Any]) -> dict[str, Any] | None:
    """The Sandbox this claim controls, found by the claim-uid label (robust to a crash mid-adoption)."""
    meta = claim["metadata"]
    found = await kube.list(sandboxes(meta["namespace"]), labels=f"{c.LABEL_CLAIM_UID}={meta['uid']}")
    owned = [s for s in found if res.controller_uid(s) == meta["uid"]]
    owned.sort(key=lambda s: (s["metadata"]["name"] != meta["name"], s["metadata"]["creationTimestamp"]))
    return owned[0] if owned else None


async def _provision(kube: Kube, claim: dict[str, Any]) -> tuple[dict[str, Any], str]:
    meta, spec = claim["metadata"], claim["spec"]
    namespace = meta["namespace"]
    candidate_pools: list[dict[str, Any]] = []
    if spec.get("warmPoolRef"):
        pool = await kube.get(pools(namespace, spec["warmPoolRef"]["name"]))
        if pool is None:
            raise Blocked(
                c.REASON_WARM_POOL_NOT_FOUND, f"SandboxWarmPool {spec['warmPoolRef']['name']!r} not found"
            )
        template_name = pool["spec"]["sandboxTemplateRef"]["name"]
        candidate_pools = [pool]
    else:
        template_name = spec["sandboxTemplateRef"]["name"]
        policy = spec.get("warmpool") or "none"
        if policy == "default":
            candidate_pools = [
                p
                for p in await kube.list(pools(namespace))
                if p["spec"]["sandboxTemplateRef"]["name"] == template_name
            ]
        elif policy != "none":
            named = await kube.get(pools(namespace, policy))
            if named is None:
                raise Blocked(c.REASON_WARM_POOL_NOT_FOUND, f"SandboxWarmPool {policy!r} not found")
            candidate_pools = [named]

    template = await kube.get(templates(namespace, template_name))
    if template is None:
        raise Blocked(c.REASON_TEMPLATE_NOT_FOUND, f"SandboxTemplate {template_name!r} not found")
    try:
        blueprint.check_metadata(claim)
        wants_cold = bool(spec.get("env") or spec.get("volumeClaimTemplates"))
        if candidate_pools and not wants_cold:
            adopted = await _adopt(kube, claim, candidate_pools)
            if adopted is not None:
                return adopted, c.LAUNCH_WARM
        manifest = blueprint.build_claimed_sandbox(claim, template)
    except blueprint.ClaimRejected as rejected:
        events.warn(claim, reason=rejected.reason, message=str(rejected))
        raise Blocked(rejected.reason, str(rejected)) from None
    return await _create_cold(kube, claim, manifest), c.LAUNCH_COLD


async def _create_cold(kube: Kube, claim: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    meta = claim["metadata"]
    try:
        created = await kube.create(sandboxes(meta["namespace"]), manifest)
    except ApiError as exc:
        if exc.invalid:
            raise Blocked(
                c.REASON_RECONCILER_ERROR, f"Sandbox rejected by the API server: {exc.message}"
            ) from None
        if not exc.already_exists:
            raise
        existing = await kube.get(sandboxes(meta["namespace"], meta["name"]))
        if existing is not None and res.controller_uid(existing) == meta["uid"]:
            return existing
        raise Blocked(
            c.REASON_SANDBOX_CREATE_PENDING,
            f"a Sandbox named {meta['name']!r} exists and is not owned by this claim",
        ) from None
    events.info(claim, reason="SandboxCreated", message=f"Created Sandbox {meta['name']} (cold start)")
    return created


async def _adopt(
    kube: Kube, claim: dict[str, Any], candidate_pools: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """Take over a warm sandbox; the resourceVersion guard makes concurrent claims pick different ones."""
    namespace = claim["metadata"]["namespace"]
    for pool in candidate_pools:
        pool_name = pool["metadata"]["name"]
        for _ in range(ADOPTION_ATTEMPTS):
            candidates = await _candidates(kube, pool, claim["metadata"]["uid"])
            if not candidates:
                break
            for candidate in candidates:
                try:
                    adopted = await kube.merge_patch(
                        sandboxes(namespace, candidate["metadata"]["name"]),
                        blueprint.adoption_patch(candidate, claim),
                    )
                except ApiError as exc:
                    if exc.conflict or exc.not_found:
                        continue  # another claim won this one, or it vanished: try the next candidate
                    raise
                await kube.merge_patch(
                    claims(namespace, claim["metadata"]["name"]),
                    {
                        "metadata": {
                            "annotations": {c.ANNOTATION_ASSIGNED_SANDBOX: adopted["metadata"]["name"]}
                        }
                    },
                )
                events.info(
                    claim,
                    reason="SandboxAdopted",
                    message=f"Adopted warm pool Sandbox {adopted['metadata']['name']}",
                )
                # Replenish a moment later: during a burst, serving claims comes before refilling the pool.
                runtime.current().queue("SandboxWarmPool").add(namespace, pool_name, delay=REPLENISH_DELAY)
                runtime.current().queue("Sandbox").add(namespace, adopted["metadata"]["name"])
                return adopted
    return None


async def _candidates(kube: Kube, pool: dict[str, Any], claim_uid: str) -> list[dict[str, Any]]:
    """Ready sandboxes first (oldest first), rotated per claim so that a burst of claims spreads over them
    instead of all racing for the same one; then the sandboxes that are still starting."""
    meta = pool["metadata"]
    items = await kube.list(
        sandboxes(meta["namespace"]), labels=f"{c.LABEL_WARM_POOL}={naming.name_hash(meta['name'])}"
    )
    usable = [
        s
        for s in items
        if res.controller_uid(s) == meta["uid"] and not s["metadata"].get("deletionTimestamp")
    ]
    usable.sort(key=lambda s: s["metadata"]["creationTimestamp"])
    ready = [s for s in usable if conds.is_true((s.get("status") or {}).get("conditions"), c.COND_READY)]
    starting = [s for s in usable if s not in ready]
    if ready:
        offset = int(naming.name_hash(claim_uid), 16) % len(ready)
        ready = ready[offset:] + ready[:offset]
    return ready + starting


def _mirror_ready(claim: dict[str, Any], sandbox: dict[str, Any]) -> conds.Condition:
    generation = claim["metadata"].get("generation")
    status = sandbox.get("status") or {}
    ready = conds.find(status.get("conditions"), c.COND_READY)
    if ready is not None and ready.get("reason") == c.REASON_SANDBOX_EXPIRED:
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
    return conds.make_condition(
        c.COND_READY, str(ready["status"]), str(ready["reason"]), str(ready.get("message", "")), generation
    )


async def _write_status(
    kube: Kube,
    claim: dict[str, Any],
    sandbox: dict[str, Any] | None,
    ready: conds.Condition,
    *,
    launch: str = "",
) -> None:
    meta = claim["metadata"]
    old = claim.get("status") or {}
    desired = [ready]
    remove: list[str] = []
    finished = conds.find(((sandbox or {}).get("status") or {}).get("conditions"), c.COND_FINISHED)
    if finished is not None:
        desired.append(dict(finished))
    elif sandbox is not None:
        remove.append(c.COND_FINISHED)
    conditions = conds.merge(old.get("conditions"), desired, remove=remove)
    patch: dict[str, Any] = {}
    if not conds.same(old.get("conditions"), conditions):
        patch["conditions"] = conditions
    if sandbox is not None:
        bound = {
            "name": sandbox["metadata"]["name"],
            "podIPs": (sandbox.get("status") or {}).get("podIPs") or None,
        }
        if (old.get("sandbox") or {}) != {k: v for k, v in bound.items() if v is not None}:
            patch["sandbox"] = bound
    if not patch:
        return
    try:
        await kube.merge_patch(claims(meta["namespace"], meta["name"], "status"), {"status": patch})
    except ApiError as exc:
        if exc.not_found:
            return
        raise
    if ready["status"] == "True" and not conds.is_true(old.get("conditions"), c.COND_READY):
        _observe_startup(claim, sandbox, launch)


def _observe_startup(claim: dict[str, Any], sandbox: dict[str, Any] | None, launch: str) -> None:
    meta = claim["metadata"]
    started = parse_time((meta.get("annotations") or {}).get(c.ANNOTATION_CLIENT_FIRST_REQUESTED))
    started = started or parse_time(meta.get("creationTimestamp"))
    if started is None:
        return
    elapsed_ms = (datetime.now(UTC) - started).total_seconds() * 1000
    launch = launch or ((sandbox or {}).get("metadata", {}).get("labels") or {}).get(
        c.LABEL_LAUNCH_TYPE, c.LAUNCH_COLD
    )
    metrics.CLAIM_STARTUP_LATENCY.labels(meta["namespace"], launch).observe(max(elapsed_ms, 0.0))


async def _expire(kube: Kube, claim: dict[str, Any], policy: str) -> float | None:
    meta = claim["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    if policy in ("Delete", "DeleteForeground"):
        events.info(claim, reason=c.REASON_CLAIM_EXPIRED, message=f"Deleting Claim (ShutdownPolicy={policy})")
        propagation = "Foreground" if policy == "DeleteForeground" else "Background"
        await kube.delete(claims(namespace, name), propagation=propagation, uid=meta["uid"])
        return None
    sandbox = await _bound_sandbox(kube, claim)
    if sandbox is not None and not sandbox["metadata"].get("deletionTimestamp"):
        await kube.delete(sandboxes(namespace, sandbox["metadata"]["name"]), uid=sandbox["metadata"]["uid"])
    was_expired = (conds.find((claim.get("status") or {}).get("conditions"), c.COND_READY) or {}).get(
        "reason"
    )
    if was_expired != c.REASON_CLAIM_EXPIRED:
        events.info(claim, reason=c.REASON_CLAIM_EXPIRED, message="Claim expired")
    ready = conds.make_condition(
        c.COND_READY,
        False,
        c.REASON_CLAIM_EXPIRED,
        "Claim expired. Sandbox cleanup initiated.",
        meta.get("generation"),
    )
    await _write_status(kube, claim, None, ready)
    if sandbox is not None:
        # Wake again to confirm the sandbox is gone.
        return 5.0
    return None


async def _ttl_after_finished(
    kube: Kube, claim: dict[str, Any], sandbox: dict[str, Any], lifecycle: dict[str, Any]
) -> float | None:
    ttl = lifecycle.get("ttlSecondsAfterFinished")
    if ttl is None:
        return None
    finished = conds.find((sandbox.get("status") or {}).get("conditions"), c.COND_FINISHED)
    if finished is None or finished.get("status") != "True":
        return None
    since = parse_time(finished.get("lastTransitionTime")) or datetime.now(UTC)
    due = since + timedelta(seconds=int(ttl))
    now = datetime.now(UTC)
    if now >= due:
        meta = claim["metadata"]
        events.info(
            claim, reason="TTLAfterFinished", message="Deleting finished claim after ttlSecondsAfterFinished"
        )
        await kube.delete(claims(meta["namespace"], meta["name"]), uid=meta["uid"])
        return None
    return (due - now).total_seconds()
