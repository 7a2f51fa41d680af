"""Sandbox reconciler: one Pod (named like the Sandbox), optional headless Service, PVCs, runtime token."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from datetime import UTC, datetime
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.kinds import POD, PVC, SANDBOX, SANDBOX_TEMPLATE, SECRET, SERVICE, ResourceKind
from shadow_operator.api.models import Condition, ObjectMeta, Resource, Sandbox, SandboxStatus, Service
from shadow_operator.clients.kube import ApiError
from shadow_operator.controllers import sandbox_idle
from shadow_operator.engine import Cached, Index, NotOwned, Reconciler
from shadow_operator.engine.cache import Body, Key
from shadow_operator.engine.status import StatusPass
from shadow_operator.resources import conditions as conds
from shadow_operator.resources import indexes, metadata, podsecurity, runtime_auth
from shadow_operator.resources import sandbox as res

RESYNC_SECONDS = 300.0
DEFAULT_GRACE_SECONDS = 30  # a Pod's terminationGracePeriodSeconds when it sets none
# A foreign object holding a child's name may be removed by someone else; look again now and then.
CONFLICT_RECHECK_SECONDS = 10.0
# The caches watch only labelled objects: Pods and claims carry the name hash; the Services and Secrets of
# every owner kind (an environment's Gitea too) carry the operator's managed-by label.
OURS = c.LABEL_SANDBOX_NAME_HASH


class ChildConflict(Exception):
    """A child's deterministic name is taken by an object this Sandbox does not own (and may not adopt)."""


class SandboxReconciler(Reconciler[Sandbox]):
    kind = SANDBOX
    owns = (POD, SERVICE, SECRET, PVC)
    # Templates: whether a new Pod's runtime gets the token (resources/runtime_auth.py).
    cached = (
        Cached(POD, OURS),
        Cached(SERVICE, c.MANAGED_BY_SELECTOR),
        Cached(SECRET, c.MANAGED_BY_SELECTOR),
        Cached(PVC, OURS),
        Cached(SANDBOX_TEMPLATE),
    )
    indexes = (Index(POD, indexes.BY_CONTROLLER, indexes.by_controller),)
    workers = 8

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle = sandbox_idle.SandboxIdle(self.cache, self.recorder, self.config.runtime_api_url)

    async def deleted(self, key: Key) -> None:
        self.idle.forget(key)

    async def reconcile(self, sandbox: Sandbox) -> float | None:
        if sandbox.deleting:
            return None
        now = datetime.now(UTC)
        shutdown = sandbox.spec.shutdown_time
        if shutdown is not None and now >= shutdown:
            await self._expire(sandbox)
            return None
        state = StatusPass(sandbox, SandboxStatus)
        idle_recheck = await self.idle.decide(sandbox, state, now)
        idle = sandbox_idle.is_suspended(state)
        seen = await self._reconcile_children(
            sandbox,
            suspended=idle or res.is_suspended(sandbox.body["spec"]),
            # Only an idle suspension shortens the grace period: a person who suspends by the spec gets the
            # Pod's own, and no request waits on that Pod.
            grace_seconds=self.config.idle_suspend_grace_seconds if idle else None,
        )
        if idle:
            policy = sandbox.spec.auto_suspend_policy
            threshold = policy.suspend_threshold_seconds if policy else None
            seen = dataclasses.replace(seen, idle=sandbox_idle.idle_message(threshold))
        self._status(sandbox, seen, state)
        self.idle.observe(sandbox, state, now)
        written = await state.write(self.client, SANDBOX)
        if written and state.became_true(c.COND_READY) and not _pool_member(sandbox):
            self.recorder.info(sandbox.body, reason=c.REASON_DEPENDENCIES_READY, message="Sandbox is Ready")
        # A foreign object holding a child's name is not watched: look again now and then.
        foreign_pod = seen.pod is not None and not seen.pod_owned
        delays = [CONFLICT_RECHECK_SECONDS] if seen.error or foreign_pod else []
        if idle_recheck is not None:
            delays.append(idle_recheck)
        if shutdown is not None:
            delays.append(min((shutdown - now).total_seconds(), RESYNC_SECONDS))
        return min(delays) if delays else None

    # ------------------------------------------------------------------------------------------ children
    async def _reconcile_children(
        self, sandbox: Sandbox, *, suspended: bool, grace_seconds: int | None = None
    ) -> res.Observed:
        body = sandbox.body
        namespace, name, uid = sandbox.namespace, sandbox.name, sandbox.metadata.uid
        owned = self.cache.store(POD).by_index(indexes.BY_CONTROLLER, uid)
        if len(owned) > 1:
            if _reason(sandbox) != c.REASON_MULTIPLE_PODS:
                message = f"{len(owned)} Pods are controlled by this Sandbox"
                self.recorder.warn(body, reason=c.REASON_MULTIPLE_PODS, message=message)
            return res.Observed(
                pod=None, multiple_pods=len(owned), service=await self.client.get(SERVICE, namespace, name)
            )

        # The token Secret and the PVCs are needed by the Pod, but not before it is scheduled: create all
        # of them at once so that a cold start costs one round trip, not four.
        pod_task = asyncio.ensure_future(
            self._reconcile_pod(sandbox, suspended=suspended, grace_seconds=grace_seconds)
        )
        others = [self._ensure_token_secret(sandbox)]
        others += [self._ensure_pvc(pvc, body) for pvc in res.build_pvcs(body)]
        service_task = asyncio.ensure_future(self._reconcile_service(sandbox))
        results = await asyncio.gather(pod_task, service_task, *others, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, ChildConflict):
                raise result
        pod_seen = results[0]
        assert isinstance(pod_seen, res.Observed)
        if pod_seen.error or pod_seen.refused or pod_seen.multiple_pods:
            return pod_seen
        service = results[1]
        if isinstance(service, ChildConflict):
            return res.Observed(pod=pod_seen.pod, pod_owned=pod_seen.pod_owned, error=str(service))
        assert service is None or isinstance(service, dict)
        return res.Observed(pod=pod_seen.pod, pod_owned=pod_seen.pod_owned, service=service)

    async def _ensure_pvc(self, manifest: Body, owner: Body) -> None:
        """PVC specs are immutable once bound: create missing ones, leave existing ones (even foreign) as they are."""
        meta = manifest["metadata"]
        if self.cache.store(PVC).get(meta["namespace"], meta["name"]) is not None:
            return
        try:
            await self.client.apply(PVC, manifest, owner=owner)
        except NotOwned:
            return

    async def _reconcile_pod(
        self, sandbox: Sandbox, *, suspended: bool, grace_seconds: int | None = None
    ) -> res.Observed:
        body = sandbox.body
        namespace, name = sandbox.namespace, sandbox.name
        pod = self.cache.store(POD).get(namespace, name)
        pod_owned = True
        if pod is None and suspended:
            # The cache holds only labelled Pods: whether a foreign one holds the name, only a read can tell
            # (suspended Sandboxes are reconciled rarely; a running one finds out when it creates its Pod).
            pod = await self.client.get_live(POD, namespace, name)
        if pod is not None and metadata.controller_uid(pod) != sandbox.metadata.uid:
            foreign = pod
            pod = await self._adopt_if_allowed(POD, body, pod)
            pod_owned = pod is not None
            if pod is None and suspended:
                # Nothing to delete that is ours; the foreign Pod is left alone and Suspended says so.
                return res.Observed(pod=foreign, pod_owned=False)
            if pod is None:
                return res.Observed(
                    pod=None, pod_owned=False, error=f"Pod {name!r} exists and is not owned by this Sandbox"
                )

        if suspended:
            if pod is not None and not Resource.model_validate(pod).deleting:
                await self.client.delete(
                    POD, namespace, name, uid=pod["metadata"]["uid"], grace_seconds=_grace(pod, grace_seconds)
                )
                self.recorder.info(
                    body, reason="PodDeleted", message="Sandbox suspended: Pod deleted, volumes kept"
                )
        elif pod is None:
            manifest = res.build_pod(
                body, token_secret=self._token_secret(sandbox), egress_gateway=self.config.egress_gateway()
            )
            refused = podsecurity.violations(
                manifest["spec"], self.config.pod_security, manifest["metadata"].get("annotations")
            )
            if refused:
                return self._refused(sandbox, refused)
            try:
                pod = await self.client.apply(POD, manifest, owner=body)
            except NotOwned as taken:
                adopted = await self._adopt_if_allowed(POD, body, dict(taken.obj))
                if adopted is None:
                    return res.Observed(
                        pod=None,
                        pod_owned=False,
                        error=f"Pod {name!r} exists and is not owned by this Sandbox",
                    )
                pod = adopted
            except ApiError as exc:
                if exc.invalid or exc.runtime_class_missing:
                    return self._rejected(sandbox, "Pod", exc)
                raise
            else:
                if not _pool_member(sandbox):
                    self.recorder.info(body, reason="PodCreated", message=f"Created Pod {name}")
        elif not Resource.model_validate(pod).deleting:
            await self._sync_pod_metadata(body, pod)
        return res.Observed(pod=pod, pod_owned=pod_owned)

    def _refused(self, sandbox: Sandbox, violations: list[str]) -> res.Observed:
        """The pod template asks for more than the chart allows: no Pod; Ready says why, once as an Event."""
        message = "Pod not created: " + "; ".join(f"spec.podTemplate.{found}" for found in violations)
        if _message(sandbox) != message:
            self.recorder.warn(sandbox.body, reason=c.REASON_POD_SECURITY_REFUSED, message=message[:1000])
        return res.Observed(pod=None, refused=message)

    def _rejected(self, sandbox: Sandbox, what: str, exc: ApiError) -> res.Observed:
        """The API server refused a child built from the user's spec: say why in Ready, once as an Event."""
        message = f"{what} rejected by the API server: {exc.message}"
        if _message(sandbox) != "Error seen: " + message:
            self.recorder.warn(sandbox.body, reason="Invalid" + what, message=message)
        return res.Observed(pod=None, error=message)

    def _token_secret(self, sandbox: Sandbox) -> str | None:
        """The runtime token Secret the Pod mounts, or None where the template serves clients without one."""
        template_name = sandbox.metadata.annotations.get(c.ANNOTATION_TEMPLATE_REF)
        template = None
        if template_name:
            template = self.cache.store(SANDBOX_TEMPLATE).get(sandbox.namespace, template_name)
        required, kept_because = runtime_auth.token_required(sandbox.body, template)
        if kept_because:
            self.recorder.warn(sandbox.body, reason=c.REASON_RUNTIME_TOKEN_KEPT, message=kept_because[:1000])
        return naming.token_secret_name(sandbox.name) if required else None

    async def _ensure_token_secret(self, sandbox: Sandbox) -> None:
        name = naming.token_secret_name(sandbox.name)
        if self.cache.store(SECRET).get(sandbox.namespace, name) is not None:
            return
        # Generated once: an existing Secret is never rotated behind a running runtime's back.
        secret = res.build_token_secret(sandbox.body, secrets.token_urlsafe(32))
        try:
            await self.client.create(SECRET, secret)
        except ApiError as exc:
            if not exc.already_exists:
                raise

    async def _adopt_if_allowed(self, kind: ResourceKind, sandbox: Body, obj: Body) -> Body | None:
        """Adopt an unowned child only when it carries agents.x-k8s.io/adoptable=true (as upstream)."""
        meta = ObjectMeta.model_validate(obj["metadata"])
        if meta.controller is not None or meta.labels.get(c.LABEL_ADOPTABLE) != "true":
            return None
        owners = [ref.model_dump(by_alias=True, exclude_none=True) for ref in meta.owner_references]
        patch = {
            "metadata": {
                "resourceVersion": meta.resource_version,
                "ownerReferences": [*owners, metadata.owner_reference(sandbox)],
                "labels": {
                    c.LABEL_SANDBOX_NAME_HASH: naming.name_hash(sandbox["metadata"]["name"]),
                    c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE,  # from now on in the cache of its kind
                },
            }
        }
        adopted = await self.client.patch(kind, meta.namespace, meta.name, patch)
        self.recorder.info(sandbox, reason="Adopted", message=f"Adopted {kind.kind.lower()} {meta.name}")
        return adopted

    async def _sync_pod_metadata(self, sandbox: Body, pod: Body) -> None:
        """Add template labels/annotations the Pod lacks (e.g. merged in by a claim on adoption).

        User keys are never removed; of our own propagated labels, those that no longer apply (the warm-pool
        label after adoption) are.
        """
        labels, annotations = res.build_pod_labels_and_annotations(sandbox)
        desired = {"labels": labels, "annotations": annotations}
        patch: dict[str, dict[str, str | None]] = {}
        meta = ObjectMeta.model_validate(pod["metadata"])
        for kind in ("labels", "annotations"):
            current = meta.labels if kind == "labels" else meta.annotations
            changes: dict[str, str | None] = {k: v for k, v in desired[kind].items() if current.get(k) != v}
            if kind == "labels":
                changes.update(
                    {k: None for k in res.PROPAGATED_LABELS if k in current and k not in desired[kind]}
                )
            if changes:
                patch[kind] = changes
        if patch:
            await self.client.patch(POD, meta.namespace, meta.name, {"metadata": patch})

    async def _reconcile_service(self, sandbox: Sandbox) -> Body | None:
        body = sandbox.body
        namespace, name = sandbox.namespace, sandbox.name
        wanted = sandbox.spec.service
        service = self.cache.store(SERVICE).get(namespace, name)
        if service is not None and metadata.controller_uid(service) != sandbox.metadata.uid:
            service = await self._foreign_service(body, service, wanted)
            if service is None:
                return None
        if wanted is False:
            if service is not None:
                await self.client.delete(SERVICE, namespace, name, uid=service["metadata"]["uid"])
            return None
        if service is None and not wanted:
            return None
        desired = res.build_service(body)
        if service is None:
            try:
                return await self.client.apply(SERVICE, desired, owner=body)
            except NotOwned as taken:
                service = await self._foreign_service(body, dict(taken.obj), wanted)
                if service is None:
                    return None
            except ApiError as exc:
                if exc.invalid:
                    raise ChildConflict(f"Service rejected by the API server: {exc.message}") from None
                raise
        current = Service.model_validate(service).spec
        current_ports = [port.model_dump(by_alias=True) for port in current.ports]
        if (wanted and current_ports != desired["spec"]["ports"]) or current.selector != desired["spec"][
            "selector"
        ]:
            # A JSON patch replaces the selector map whole (foreign keys in it must go); apply would merge it.
            ops: list[Body] = [{"op": "add", "path": "/spec/selector", "value": desired["spec"]["selector"]}]
            if wanted:
                ops.append({"op": "add", "path": "/spec/ports", "value": desired["spec"]["ports"]})
            service = await self.client.json_patch(SERVICE, namespace, name, ops)
        return service

    async def _foreign_service(self, sandbox: Body, service: Body, wanted: bool | None) -> Body | None:
        if not wanted:
            return None
        adopted = await self._adopt_if_allowed(SERVICE, sandbox, service)
        if adopted is None:
            raise ChildConflict(
                f"Service {sandbox['metadata']['name']!r} exists and is not owned by this Sandbox"
            )
        return adopted

    # -------------------------------------------------------------------------------------------- expiry
    async def _expire(self, sandbox: Sandbox) -> None:
        body = sandbox.body
        namespace, name, uid = sandbox.namespace, sandbox.name, sandbox.metadata.uid
        for kind in (POD, SERVICE):
            child = self.cache.store(kind).get(namespace, name)
            if child is not None and metadata.controller_uid(child) == uid:
                await self.client.delete(kind, namespace, name, uid=child["metadata"]["uid"])
        if sandbox.spec.shutdown_policy == "Delete":
            self.recorder.info(
                body, reason=c.REASON_SANDBOX_EXPIRED, message="shutdownTime reached: deleting the Sandbox"
            )
            await self.client.delete(SANDBOX, namespace, name, uid=uid)
            return
        if _reason(sandbox) != c.REASON_SANDBOX_EXPIRED:
            self.recorder.info(
                body, reason=c.REASON_SANDBOX_EXPIRED, message="shutdownTime reached: Pod and Service deleted"
            )
        await self._status(sandbox, res.Observed(pod=None, expired=True)).write(self.client, SANDBOX)

    # -------------------------------------------------------------------------------------------- status
    def _status(
        self, sandbox: Sandbox, seen: res.Observed, state: StatusPass[SandboxStatus] | None = None
    ) -> StatusPass[SandboxStatus]:
        """The status of what this pass saw, in `state` (written by the caller, when it changed)."""
        config = self.config
        state = state or StatusPass(sandbox, SandboxStatus)
        desired, remove = res.compute_conditions(sandbox.body, seen)
        state.conditions.remove(*remove)
        for condition in desired:
            state.conditions.put(condition)
        pod = seen.pod if seen.pod_owned else None
        service = seen.service["metadata"]["name"] if seen.service else None
        status = state.status
        # An expired Sandbox keeps its conditions and loses what described live children (as upstream).
        status.selector = (
            None if seen.expired else f"{c.LABEL_SANDBOX_NAME_HASH}={naming.name_hash(sandbox.name)}"
        )
        status.pod_ips = res.pod_ips(pod) or None
        status.node_name = res.node_name(pod)
        status.service = service
        status.service_fqdn = (
            f"{service}.{sandbox.namespace}.svc.{config.cluster_domain}" if service else None
        )
        status.runtime_url = (
            None if seen.expired else res.runtime_url(sandbox.body, seen, config.cluster_domain)
        )
        status.preview_url = (
            None
            if seen.expired
            else res.preview_url(sandbox.body, config.preview_domain, config.preview_scheme)
        )
        status.runtime_token_secret = naming.token_secret_name(sandbox.name)
        return state


def _grace(pod: Body, wanted: int | None) -> int | None:
    """The grace period of a suspension's Pod deletion: `wanted`, never longer than the Pod's own (None: the
    Pod's own, as a Pod asking for 0 gets)."""
    own = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    if wanted is None or own is None or own <= 0:
        return None
    return min(wanted, int(own))


def _pool_member(sandbox: Sandbox) -> bool:
    """Warm pool members are stock, not something a person follows: no Normal events for them (a pool of 300
    refilling would post 600), which keeps the API server free for the claims that wait on it."""
    return c.LABEL_WARM_POOL in sandbox.metadata.labels


def _ready(sandbox: Sandbox) -> Condition | None:
    return conds.find(sandbox.status.conditions if sandbox.status else None, c.COND_READY)


def _reason(sandbox: Sandbox) -> str | None:
    ready = _ready(sandbox)
    return ready.reason if ready else None


def _message(sandbox: Sandbox) -> str | None:
    ready = _ready(sandbox)
    return ready.message if ready else None
