"""Forks and snapshots of environments (sans-I/O, see `kube.run`).

- `build_fork`/`fork`: new environments that start as a copy of a running one (`spec.workspace.from`); the
  operator snapshots the source's volume, or copies through the runtimes where it cannot, and says which.
- `snapshot`: a VolumeSnapshot of an environment's workspace, taken after the filesystem is flushed, that
  `spec.workspace.from.snapshot` restores (into as many environments as you like).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.api.kinds import (
    PVC,
    SANDBOX,
    SHADOW_ENVIRONMENT,
    STORAGE_CLASS,
    VOLUME_SNAPSHOT,
    VOLUME_SNAPSHOT_CLASS,
)
from shadow_operator.common import snapshots
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk import kube, runtime
from shadow_operator.sdk import sandbox as sandboxops
from shadow_operator.sdk.errors import ApiNotInstalled, NotFound, ShadowError, WaitTimeout
from shadow_operator.sdk.kube import Body, Call, Op
from shadow_operator.sdk.runtime import RuntimeEndpoint

T = TypeVar("T")

# What a fork takes over from its source's spec (its sources come with the clone).
_INHERITED_SPEC = (
    "gitea",
    "gitRewrites",
    "template",
    "runtimeClassName",
    "env",
    "resources",
    "preview",
    "journal",
    "verify",
)
_INHERITED_ANNOTATIONS = (envops.ANNOTATION_LOCAL_PREFIX, c.ANNOTATION_PREVIEW_ACCESS)


class SnapshotUnsupported(ShadowError):
    """The workspace's volume cannot be snapshotted (no VolumeSnapshotClass for its CSI driver)."""


def build_fork(
    source: Body,
    name: str,
    *,
    method: str = "Auto",
    storage_class: str | None = None,
    timeout_seconds: int | None = None,
    retain_snapshot: bool = False,
    verify: bool | None = None,
    snapshot: str | None = None,
) -> Body:
    """A ShadowEnvironment that starts as a copy of `source`: same mount path, size, rewrites, template and
    verification; the local directories its sources came from (so `promote` from the fork goes there too).

    With `snapshot`, it restores that VolumeSnapshot of the source instead of having the operator take one.
    """
    spec = source["spec"]
    workspace = spec.get("workspace") or {}
    origin: dict[str, Any] = (
        {"snapshot": snapshot} if snapshot else {"environment": source["metadata"]["name"], "method": method}
    )
    if timeout_seconds is not None:
        origin["timeoutSeconds"] = timeout_seconds
    if retain_snapshot:
        origin["retainSnapshot"] = True
    new_workspace: dict[str, Any] = {k: workspace[k] for k in ("mountPath", "size") if k in workspace} | {
        "from": origin
    }
    if storage_class:
        new_workspace["storageClassName"] = storage_class
    new_spec: dict[str, Any] = {k: copy.deepcopy(spec[k]) for k in _INHERITED_SPEC if k in spec}
    new_spec["workspace"] = new_workspace
    if verify is not None:
        new_spec["verify"] = {**(new_spec.get("verify") or {}), "enabled": verify}
    annotations = {
        k: v
        for k, v in (source["metadata"].get("annotations") or {}).items()
        if any(k.startswith(prefix) for prefix in _INHERITED_ANNOTATIONS)
    }
    return {
        "apiVersion": SHADOW_ENVIRONMENT.api_version,
        "kind": SHADOW_ENVIRONMENT.kind,
        "metadata": {"name": name, "namespace": source["metadata"]["namespace"], "annotations": annotations},
        "spec": new_spec,
    }


def fork(
    namespace: str,
    source: str,
    names: Sequence[str],
    *,
    method: str = "Auto",
    storage_class: str | None = None,
    retain_snapshot: bool = False,
    **options: Any,
) -> Op[list[ShadowEnvironment]]:
    """Create one fork of `source` per name; the operator clones them in parallel.

    Several forks at once share one baseline: one VolumeSnapshot of the source (flushed first) that every
    fork restores, owned by all of them (deleted with the last, unless `retain_snapshot`). This client-side
    part only cuts that snapshot; what each fork is restored into and how is the operator's clone step's
    decision (controllers/environment/clone/), as for a single fork. Where the source
    cannot be snapshotted, each fork is copied by the operator (`method` Auto); with `method` Copy they are
    copied anyway. A single fork is left to the operator (spec.workspace.from.environment).
    """
    what = f"ShadowEnvironment {namespace}/{source}"
    body = yield from kube.get(SHADOW_ENVIRONMENT.path(namespace, source), what)
    shared: Body | None = None
    if len(names) > 1 and method != "Copy":
        try:
            shared = yield from take_snapshot(
                namespace, source, _stamped(f"{source}-fork"), owner_label=names[0], retain=True
            )
        except SnapshotUnsupported:
            if method == "Snapshot":
                raise
    created: list[ShadowEnvironment] = []
    try:
        for name in names:
            manifest = build_fork(
                body,
                name,
                method=method,
                storage_class=storage_class,
                retain_snapshot=retain_snapshot,
                snapshot=shared["metadata"]["name"] if shared else None,
                **options,
            )
            created.append((yield from envops.create(manifest)))
    finally:
        # The shared snapshot belongs to the forks that exist (none: it goes now), unless retained.
        if shared is not None and not retain_snapshot:
            yield from _own_snapshot(namespace, shared["metadata"]["name"], created)
    return created


def _own_snapshot(namespace: str, name: str, owners: Sequence[ShadowEnvironment]) -> Op[None]:
    path, what = VOLUME_SNAPSHOT.path(namespace, name), f"VolumeSnapshot {namespace}/{name}"
    if not owners:
        yield Call("DELETE", path, f"delete {what}")
        return
    refs = [
        {
            "apiVersion": SHADOW_ENVIRONMENT.api_version,
            "kind": SHADOW_ENVIRONMENT.kind,
            "name": e.name,
            "uid": e.metadata.uid,
        }
        for e in owners
    ]
    yield Call(
        "PATCH",
        path,
        f"own {what} by its forks",
        body={"metadata": {"ownerReferences": refs}},
        content_type="application/merge-patch+json",
    )


def cloned(env: ShadowEnvironment) -> bool:
    """The fork's workspace holds the clone (its Pod is Ready on it)."""
    return envops.is_true(env, c.COND_CLONED)


def clone_seconds(env: ShadowEnvironment) -> float | None:
    """Seconds from the fork's creation until its cloned workspace was usable (None: not yet)."""
    cloned_after = envops.phase_seconds(env).get("cloned")
    if cloned_after is not None:
        return round(cloned_after, 1)
    clone = env.status.clone if env.status else None  # written by an operator without status.timings
    created = env.metadata.creation_timestamp
    if clone is None or clone.completed_at is None or created is None:
        return None
    return round((clone.completed_at - created).total_seconds(), 1)


def snapshot(
    namespace: str, environment: str, name: str | None = None, *, retain: bool = False, timeout: float = 300.0
) -> Op[Body]:
    """Flush the environment's workspace, snapshot its volume and wait until the snapshot is ready to use.

    The snapshot belongs to the environment (deleted with it) unless `retain`; it is labelled with it either
    way, so `shadowctl cleanup` finds a retained one once the environment is gone. It records the
    environment's sources, which an environment restored from it (spec.workspace.from.snapshot) inherits.
    """
    name = name or _stamped(environment)
    created = yield from take_snapshot(namespace, environment, name, retain=retain)
    return (yield from wait_snapshot(namespace, name, created, timeout))


def take_snapshot(
    namespace: str, environment: str, name: str, *, retain: bool = False, owner_label: str | None = None
) -> Op[Body]:
    """`snapshot` without the wait. `owner_label`: the environment it is labelled with (default: the one
    snapshotted), for a snapshot made for environments that do not exist yet (`fork`)."""
    env = yield from envops.get(namespace, environment)
    if not envops.is_true(env, c.COND_SOURCES_READY):
        raise envops.runtime_not_ready(env, " (its sources are not copied in yet)")
    ep = (yield from envops.runtime_endpoint(env)) if envops.is_true(env, c.COND_WORKSPACE_READY) else None
    sources = [
        s.model_dump(include={"name", "repo", "path"})
        for s in (env.status.sources if env.status else None) or ()
    ]
    owner = {"apiVersion": SHADOW_ENVIRONMENT.api_version, "kind": SHADOW_ENVIRONMENT.kind}
    created: Body = yield from _snapshot_claim(
        namespace,
        naming.pvc_name(c.WORKSPACE_VOLUME, environment),
        name,
        owner={**owner, "name": environment, "uid": env.metadata.uid or ""},
        retain=retain,
        flush=ep,
        environment=owner_label or environment,
        snapshot_of=environment,
        sources=sources,
    )
    return created


def snapshot_sandbox(
    namespace: str,
    sandbox: str,
    name: str | None = None,
    *,
    volume: str = c.WORKSPACE_VOLUME,
    retain: bool = False,
    timeout: float = 300.0,
) -> Op[Body]:
    """The same for a plain Sandbox: its volume from the volumeClaimTemplate `volume`, flushed through its
    runtime first when it runs. Restore it with a volumeClaimTemplate whose spec has
    `dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: ...}`."""
    body = yield from kube.get(SANDBOX.path(namespace, sandbox), f"Sandbox {namespace}/{sandbox}")
    templates = [t["metadata"]["name"] for t in body["spec"].get("volumeClaimTemplates") or ()]
    if volume not in templates:
        raise ShadowError(
            f"Sandbox {namespace}/{sandbox} has no volume {volume!r} from a volumeClaimTemplate "
            f"(it has: {', '.join(templates) or 'none'})",
            hint="only volumes made from volumeClaimTemplates are PersistentVolumeClaims that can be snapshotted",
        )
    name = name or _stamped(sandbox)
    ep = None
    if any(
        x.get("type") == c.COND_READY and x.get("status") == "True"
        for x in (body.get("status") or {}).get("conditions") or ()
    ):
        ep = yield from sandboxops.endpoint(sandboxops.SandboxRef(sandbox, sandbox, namespace))
    created = yield from _snapshot_claim(
        namespace,
        naming.pvc_name(volume, sandbox),
        name,
        owner={
            "apiVersion": SANDBOX.api_version,
            "kind": SANDBOX.kind,
            "name": sandbox,
            "uid": body["metadata"]["uid"],
        },
        retain=retain,
        flush=ep,
        environment=None,
        snapshot_of=sandbox,
        sources=(),
    )
    return (yield from wait_snapshot(namespace, name, created, timeout))


def _stamped(base: str) -> str:
    return naming.bounded(f"{base}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")


def _snapshot_claim(
    namespace: str,
    claim: str,
    name: str,
    *,
    owner: dict[str, str],
    retain: bool,
    flush: RuntimeEndpoint | None,
    environment: str | None,
    snapshot_of: str,
    sources: Sequence[Mapping[str, Any]],
) -> Op[Body]:
    """Choose the class, flush, create the VolumeSnapshot (owned by `owner` unless `retain`); no wait."""
    pvc = yield from kube.get(PVC.path(namespace, claim), f"PersistentVolumeClaim {namespace}/{claim}")
    choice = yield from _on_cluster(snapshots.choose((pvc.get("spec") or {}).get("storageClassName")))
    if choice.name is None:
        raise SnapshotUnsupported(
            f"cannot snapshot {owner['kind']} {owner['name']}'s volume {claim}: {choice.reason}",
            hint="use a StorageClass whose CSI driver has a VolumeSnapshotClass (kubectl get volumesnapshotclass); "
            "`shadowctl fork` copies instead where it cannot snapshot",
        )
    plan = snapshots.cut(
        flush=flush is not None,
        name=name,
        namespace=namespace,
        pvc=claim,
        class_name=choice.name,
        environment=environment,
        snapshot_of=snapshot_of,
        sources=sources,
    )
    created: Body = yield from _on_cluster(plan, flush=flush, owner=None if retain else owner)
    return created


def _on_cluster(
    plan: snapshots.Plan[T], *, flush: RuntimeEndpoint | None = None, owner: dict[str, str] | None = None
) -> Op[T]:
    """Drive a snapshot plan (common/snapshots) with the SDK's calls: the snapshot owned by `owner`, the
    workspace flushed through the runtime `flush`."""
    try:
        step = next(plan)
        while True:
            step = plan.send((yield from _answer(step, flush, owner)))
    except StopIteration as done:
        return cast(T, done.value)


def _answer(step: snapshots.Step, flush: RuntimeEndpoint | None, owner: dict[str, str] | None) -> Op[Any]:
    if isinstance(step, snapshots.ReadStorageClass):
        try:
            return (yield from kube.get(STORAGE_CLASS.path(None, step.name), f"StorageClass {step.name}"))
        except NotFound:
            return None
    if isinstance(step, snapshots.ListSnapshotClasses):
        call = Call("GET", VOLUME_SNAPSHOT_CLASS.path(), "list VolumeSnapshotClasses")
        try:
            listed = yield from kube.send(call)
        except (NotFound, ApiNotInstalled):
            return None
        return listed.get("items") or []
    if isinstance(step, snapshots.Flush):
        assert flush is not None
        result = yield from runtime.run_command(flush, "sync", timeout=120)
        if result.exit_code != 0:
            raise ShadowError(f"sync failed in the workspace: {result.stderr.strip()[:300]}")
        return None
    manifest = step.manifest
    if owner is not None:
        manifest["metadata"]["ownerReferences"] = [owner]
    what = f"VolumeSnapshot {manifest['metadata']['namespace']}/{manifest['metadata']['name']}"
    return (
        yield from kube.send(
            Call(
                "POST",
                VOLUME_SNAPSHOT.path(manifest["metadata"]["namespace"]),
                f"create {what}",
                body=manifest,
            )
        )
    )


def wait_snapshot(namespace: str, name: str, current: Body, timeout: float) -> Op[Body]:
    """Follow a VolumeSnapshot until it is ready to use; a failed one raises, a slow one times out."""
    what = f"VolumeSnapshot {namespace}/{name}"

    def check(body: Body) -> Body | None:
        phase, detail = snapshots.snapshot_state(body)
        if phase == "Failed":
            raise ShadowError(
                f"{what} failed: {detail}", hint=f"kubectl describe volumesnapshot {name} -n {namespace}"
            )
        return body if phase == "Ready" else None

    def timed_out(body: Body) -> ShadowError:
        return WaitTimeout(
            f"{what} not ready to use after {timeout:g}s: {snapshots.snapshot_state(body)[1]}",
            hint="check the snapshot controller and the CSI driver: kubectl describe volumesnapshot "
            f"{name} -n {namespace}",
        )

    def deleted() -> ShadowError:
        return NotFound(f"{what} was deleted while waiting")

    result: Body = yield from kube.wait_for(
        VOLUME_SNAPSHOT.path(namespace),
        name,
        what,
        current,
        check,
        time.monotonic() + timeout,
        time.monotonic,
        timed_out,
        deleted,
    )
    return result
