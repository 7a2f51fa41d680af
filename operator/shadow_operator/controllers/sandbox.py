"""Sandbox controller: one Pod (named like the Sandbox), optional headless Service, PVCs, runtime token."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

import kopf

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.clients.kube import ApiError, Kube, resource_path
from shadow_operator.controllers import events, runtime
from shadow_operator.resources import conditions as conds
from shadow_operator.resources import sandbox as res

KIND = "Sandbox"
RESYNC_SECONDS = 300.0
# A foreign object holding a child's name may be removed by someone else; look again now and then.
CONFLICT_RECHECK_SECONDS = 10.0


class ChildConflict(Exception):
    """A child's deterministic name is taken by an object this Sandbox does not own (and may not adopt)."""


def sandboxes(namespace: str, name: str | None = None, sub: str | None = None) -> str:
    return resource_path(c.SANDBOX_API_VERSION, "sandboxes", namespace, name, sub)


def core(plural: str, namespace: str, name: str | None = None) -> str:
    return resource_path("v1", plural, namespace, name)


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def enqueue(namespace: str, name: str, delay: float = 0.0) -> None:
    runtime.current().queue(KIND).add(namespace, name, delay)


# ------------------------------------------------------------------------------------------- watches
@kopf.on.event(c.SANDBOX_GROUP, c.STORAGE_VERSION, "sandboxes")
async def sandbox_event(namespace: str | None, name: str, **_: Any) -> None:
    if namespace:
        enqueue(namespace, name)


def _enqueue_owner(body: kopf.Body) -> None:
    for ref in body.get("metadata", {}).get("ownerReferences") or ():
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(c.SANDBOX_GROUP + "/"):
            enqueue(body["metadata"]["namespace"], ref["name"])


@kopf.on.event("v1", "pods", labels={c.LABEL_SANDBOX_NAME_HASH: kopf.PRESENT})
async def pod_event(body: kopf.Body, **_: Any) -> None:
    _enqueue_owner(body)


@kopf.on.event("v1", "services", labels={c.LABEL_SANDBOX_NAME_HASH: kopf.PRESENT})
async def service_event(body: kopf.Body, **_: Any) -> None:
    _enqueue_owner(body)


# ------------------------------------------------------------------------------------------ reconcile
async def reconcile(namespace: str, name: str) -> float | None:
    rt = runtime.current()
    kube = rt.kube
    sandbox = await kube.get(sandboxes(namespace, name))
    if sandbox is None or sandbox["metadata"].get("deletionTimestamp"):
        return None
    spec = sandbox["spec"]
    now = datetime.now(UTC)
    shutdown = parse_time(spec.get("shutdownTime"))

    if shutdown is not None and now >= shutdown:
        await _expire(kube, sandbox)
        return None

    seen = await _reconcile_children(kube, sandbox)
    await _write_status(kube, sandbox, seen)
    delays = [CONFLICT_RECHECK_SECONDS] if seen.error else []
    if shutdown is not None:
        delays.append(min((shutdown - now).total_seconds(), RESYNC_SECONDS))
    return min(delays) if delays else None


async def _reconcile_children(kube: Kube, sandbox: dict[str, Any]) -> res.Observed:
    meta, spec = sandbox["metadata"], sandbox["spec"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    await _ensure_token_secret(kube, sandbox)
    for pvc in res.build_pvcs(sandbox):
        await _create_if_missing(kube, core("persistentvolumeclaims", namespace), pvc)

    pods = await kube.list(
        core("pods", namespace), labels=f"{c.LABEL_SANDBOX_NAME_HASH}={naming.name_hash(name)}"
    )
    owned = [p for p in pods if res.controller_uid(p) == uid]
    if len(owned) > 1:
        if (_ready(sandbox) or {}).get("reason") != c.REASON_MULTIPLE_PODS:
            message = f"{len(owned)} Pods are controlled by this Sandbox"
            events.warn(sandbox, reason=c.REASON_MULTIPLE_PODS, message=message)
        return res.Observed(
            pod=None, multiple_pods=len(owned), service=await kube.get(core("services", namespace, name))
        )

    pod = await kube.get(core("pods", namespace, name))
    pod_owned = True
    if pod is not None and res.controller_uid(pod) != uid:
        pod = await _adopt_if_allowed(kube, sandbox, pod, "pods")
        pod_owned = pod is not None
        if pod is None:
            return res.Observed(
                pod=None, pod_owned=False, error=f"Pod {name!r} exists and is not owned by this Sandbox"
            )

    if res.is_suspended(spec):
        if pod is not None and not pod["metadata"].get("deletionTimestamp"):
            await kube.delete(core("pods", namespace, name), uid=pod["metadata"]["uid"])
            events.info(sandbox, reason="PodDeleted", message="Sandbox suspended: Pod deleted, volumes kept")
    elif pod is None:
        token_secret = naming.token_secret_name(name)
        try:
            pod = await kube.create(
                core("pods", namespace), res.build_pod(sandbox, token_secret=token_secret)
            )
        except ApiError as exc:
            if exc.already_exists:
                raise kopf.TemporaryError("Pod appeared concurrently; looking again", delay=0.2) from None
            if exc.invalid:
                return _rejected(sandbox, "Pod", exc)
            raise
        events.info(sandbox, reason="PodCreated", message=f"Created Pod {name}")
    elif pod["metadata"].get("deletionTimestamp") is None:
        await _sync_pod_metadata(kube, sandbox, pod)

    try:
        service = await _reconcile_service(kube, sandbox)
    except ChildConflict as conflict:
        return res.Observed(pod=pod, pod_owned=pod_owned, error=str(conflict))
    return res.Observed(pod=pod, pod_owned=pod_owned, service=service)


def _rejected(sandbox: dict[str, Any], what: str, exc: ApiError) -> res.Observed:
    """The API server refused a child built from the user's spec: say why in Ready, once as an Event."""
    message = f"{what} rejected by the API server: {exc.message}"
    if (_ready(sandbox) or {}).get("message") != "Error seen: " + message:
        events.warn(sandbox, reason="Invalid" + what, message=message)
    return res.Observed(pod=None, error=message)


async def _ensure_token_secret(kube: Kube, sandbox: dict[str, Any]) -> None:
    meta = sandbox["metadata"]
    path = core("secrets", meta["namespace"], naming.token_secret_name(meta["name"]))
    if await kube.get(path) is not None:
        return
    # Generated once: an existing Secret is never rotated behind a running runtime's back.
    secret = res.build_token_secret(sandbox, secrets.token_urlsafe(32))
    await _create_if_missing(kube, core("secrets", meta["namespace"]), secret)


async def _create_if_missing(kube: Kube, collection: str, body: dict[str, Any]) -> None:
    if await kube.get(f"{collection}/{body['metadata']['name']}") is not None:
        return
    try:
        await kube.create(collection, body)
    except ApiError as exc:
        if not exc.already_exists:
            raise


async def _adopt_if_allowed(
    kube: Kube, sandbox: dict[str, Any], obj: dict[str, Any], plural: str
) -> dict[str, Any] | None:
    """Adopt an unowned child only when it carries agents.x-k8s.io/adoptable=true (as upstream)."""
    meta = obj["metadata"]
    if res.controller_uid(obj) is not None or (meta.get("labels") or {}).get(c.LABEL_ADOPTABLE) != "true":
        return None
    patch = {
        "metadata": {
            "resourceVersion": meta["resourceVersion"],
            "ownerReferences": [*(meta.get("ownerReferences") or []), res.owner_reference(sandbox)],
            "labels": {c.LABEL_SANDBOX_NAME_HASH: naming.name_hash(sandbox["metadata"]["name"])},
        }
    }
    adopted = await kube.merge_patch(core(plural, meta["namespace"], meta["name"]), patch)
    events.info(sandbox, reason="Adopted", message=f"Adopted {plural[:-1]} {meta['name']}")
    return adopted


async def _sync_pod_metadata(kube: Kube, sandbox: dict[str, Any], pod: dict[str, Any]) -> None:
    """Add template labels/annotations the Pod lacks (e.g. merged in by a claim on adoption).

    User keys are never removed; of our own propagated labels, those that no longer apply (the warm-pool
    label after adoption) are.
    """
    token_secret = naming.token_secret_name(sandbox["metadata"]["name"])
    desired = res.build_pod(sandbox, token_secret=token_secret)["metadata"]
    patch: dict[str, dict[str, str | None]] = {}
    for kind in ("labels", "annotations"):
        current = pod["metadata"].get(kind) or {}
        changes: dict[str, str | None] = {k: v for k, v in desired[kind].items() if current.get(k) != v}
        if kind == "labels":
            changes.update(
                {k: None for k in res.PROPAGATED_LABELS if k in current and k not in desired[kind]}
            )
        if changes:
            patch[kind] = changes
    if patch:
        await kube.merge_patch(
            core("pods", pod["metadata"]["namespace"], pod["metadata"]["name"]), {"metadata": patch}
        )


async def _reconcile_service(kube: Kube, sandbox: dict[str, Any]) -> dict[str, Any] | None:
    meta, spec = sandbox["metadata"], sandbox["spec"]
    path = core("services", meta["namespace"], meta["name"])
    service = await kube.get(path)
    wanted = spec.get("service")
    if service is not None and res.controller_uid(service) != meta["uid"]:
        if wanted:
            service = await _adopt_if_allowed(kube, sandbox, service, "services")
            if service is None:
                raise ChildConflict(f"Service {meta['name']!r} exists and is not owned by this Sandbox")
        else:
            return None
    if wanted is False:
        if service is not None:
            await kube.delete(path)
        return None
    if service is None:
        if not wanted:
            return None
        try:
            service = await kube.create(core("services", meta["namespace"]), res.build_service(sandbox))
        except ApiError as exc:
            if exc.already_exists:
                raise kopf.TemporaryError("Service appeared concurrently; looking again", delay=0.2) from None
            if exc.invalid:
                raise ChildConflict(f"Service rejected by the API server: {exc.message}") from None
            raise
        return service
    desired = res.build_service(sandbox)["spec"]
    current_ports = [
        {k: p.get(k) for k in ("name", "port", "protocol", "targetPort")}
        for p in service["spec"].get("ports") or ()
    ]
    selector = service["spec"].get("selector")
    if (wanted and current_ports != desired["ports"]) or selector != desired["selector"]:
        # A JSON patch replaces the selector map whole; a merge patch would keep foreign keys in it.
        ops: list[dict[str, Any]] = [{"op": "add", "path": "/spec/selector", "value": desired["selector"]}]
        if wanted:
            ops.append({"op": "add", "path": "/spec/ports", "value": desired["ports"]})
        service = await kube.json_patch(path, ops)
    return service


async def _expire(kube: Kube, sandbox: dict[str, Any]) -> None:
    meta, spec = sandbox["metadata"], sandbox["spec"]
    namespace, name = meta["namespace"], meta["name"]
    for plural in ("pods", "services"):
        child = await kube.get(core(plural, namespace, name))
        if child is not None and res.controller_uid(child) == meta["uid"]:
            await kube.delete(core(plural, namespace, name), uid=child["metadata"]["uid"])
    if spec.get("shutdownPolicy") == "Delete":
        events.info(
            sandbox, reason=c.REASON_SANDBOX_EXPIRED, message="shutdownTime reached: deleting the Sandbox"
        )
        await kube.delete(sandboxes(namespace, name), uid=meta["uid"])
        return
    ready = _ready(sandbox)
    if ready is None or ready.get("reason") != c.REASON_SANDBOX_EXPIRED:
        events.info(
            sandbox, reason=c.REASON_SANDBOX_EXPIRED, message="shutdownTime reached: Pod and Service deleted"
        )
    await _write_status(kube, sandbox, res.Observed(pod=None, expired=True))


def _ready(sandbox: dict[str, Any]) -> Any:
    return conds.find((sandbox.get("status") or {}).get("conditions"), c.COND_READY)


async def _write_status(kube: Kube, sandbox: dict[str, Any], seen: res.Observed) -> None:
    config = runtime.current().config
    meta = sandbox["metadata"]
    old = sandbox.get("status") or {}
    desired, remove = res.compute_conditions(sandbox, seen)
    conditions = conds.merge(old.get("conditions"), desired, remove=remove)
    pod_owned = seen.pod if seen.pod_owned else None
    service = seen.service
    status: dict[str, Any] = {
        "selector": f"{c.LABEL_SANDBOX_NAME_HASH}={naming.name_hash(meta['name'])}",
        "podIPs": res.pod_ips(pod_owned) or None,
        "nodeName": ((pod_owned or {}).get("spec") or {}).get("nodeName") or None,
        "service": service["metadata"]["name"] if service else None,
        "serviceFQDN": (
            f"{service['metadata']['name']}.{meta['namespace']}.svc.{config.cluster_domain}"
            if service
            else None
        ),
        "runtimeURL": None if seen.expired else res.runtime_url(sandbox, seen, config.cluster_domain),
        "previewURL": None
        if seen.expired
        else res.preview_url(sandbox, config.preview_domain, config.preview_scheme),
        "runtimeTokenSecret": naming.token_secret_name(meta["name"]),
    }
    patch = {k: v for k, v in status.items() if old.get(k) != v}
    if not conds.same(old.get("conditions"), conditions):
        patch["conditions"] = conditions
    if not patch:
        return
    was_ready = conds.is_true(old.get("conditions"), c.COND_READY)
    now_ready = conds.is_true(conditions, c.COND_READY)
    try:
        await kube.merge_patch(sandboxes(meta["namespace"], meta["name"], "status"), {"status": patch})
    except ApiError as exc:
        if exc.not_found:
            return
        raise
    if now_ready and not was_ready:
        events.info(sandbox, reason=c.REASON_DEPENDENCIES_READY, message="Sandbox is Ready")
