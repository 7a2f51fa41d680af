"""Forks and snapshots of environments (sans-I/O, see `kube.run`).

- `build_fork`/`fork`: new environments that start as a copy of a running one (`spec.workspace.from`); the
  operator snapshots the source's volume, or copies through the runtimes where it cannot, and says which.
- `snapshot`: a VolumeSnapshot of an environment's workspace, taken after the filesystem is flushed, that
  `spec.workspace.from.snapshot` restores (into as many environments as you like).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.api.kinds import (
    PVC,
    SHADOW_ENVIRONMENT,
    STORAGE_CLASS,
    VOLUME_SNAPSHOT,
    VOLUME_SNAPSHOT_CLASS,
)
from shadow_operator.resources import snapshots
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk import kube, runtime
from shadow_operator.sdk.errors import ApiNotInstalled, NotFound, ShadowError, WaitTimeout
from shadow_operator.sdk.kube import Body, Call, Op

# What a fork takes over from its source's spec (its sources come with the clone).
_INHERITED_SPEC = ("gitea", "gitRewrites", "template", "env", "resources", "preview", "journal", "verify")
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
) -> Body:
    """A ShadowEnvironment that starts as a copy of `source`: same mount path, size, rewrites, template and
    verification; the local directories its sources came from (so `promote` from the fork goes there too)."""
    spec = source["spec"]
    workspace = spec.get("workspace") or {}
    origin: dict[str, Any] = {"environment": source["metadata"]["name"], "method": method}
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


def fork(namespace: str, source: str, names: Sequence[str], **options: Any) -> Op[list[ShadowEnvironment]]:
    """Create one fork of `source` per name (all at once; the operator clones them in parallel)."""
    what = f"ShadowEnvironment {namespace}/{source}"
    body = yield from kube.get(SHADOW_ENVIRONMENT.path(namespace, source), what)
    created = []
    for name in names:
        env = yield from envops.create(build_fork(body, name, **options))
        created.append(env)
    return created


def cloned(env: ShadowEnvironment) -> bool:
    """The fork's workspace holds the clone (its Pod is Ready on it)."""
    return envops.is_true(env, c.COND_CLONED)


def clone_seconds(env: ShadowEnvironment) -> float | None:
    """Seconds from the fork's creation until its cloned workspace was usable (None: not yet)."""
    clone = env.status.clone if env.status else None
    created = env.metadata.creation_timestamp
    if clone is None or clone.completed_at is None or created is None:
        return None
    return round((clone.completed_at - created).total_seconds(), 1)


def snapshot(
    namespace: str, environment: str, name: str | None = None, *, retain: bool = False, timeout: float = 300.0
) -> Op[Body]:
    """Flush the environment's workspace, snapshot its volume and wait until the snapshot is ready to use.

    The snapshot belongs to the environment (deleted with it) unless `retain`; it is labelled with it either
    way, so `shadowctl cleanup` finds a retained one once the environment is gone.
    """
    env = yield from envops.get(namespace, environment)
    if not envops.is_true(env, c.COND_SOURCES_READY):
        raise envops.runtime_not_ready(env, " (its sources are not copied in yet)")
    pvc_name = naming.pvc_name(c.WORKSPACE_VOLUME, environment)
    pvc = yield from kube.get(PVC.path(namespace, pvc_name), f"PersistentVolumeClaim {namespace}/{pvc_name}")
    class_name = (pvc.get("spec") or {}).get("storageClassName")
    storage_class = None
    if class_name:
        storage_class = yield from kube.get(
            STORAGE_CLASS.path(None, class_name), f"StorageClass {class_name}"
        )
    try:
        classes = yield from kube.send(
            Call("GET", VOLUME_SNAPSHOT_CLASS.path(), "list VolumeSnapshotClasses")
        )
        choice = snapshots.choose_class(
            snapshots.volume_driver(pvc, storage_class), classes.get("items") or ()
        )
    except (NotFound, ApiNotInstalled):
        choice = snapshots.choose_class(None, (), api_installed=False)
    if choice.name is None:
        raise SnapshotUnsupported(
            f"cannot snapshot {environment}'s workspace: {choice.reason}",
            hint=f"fork it by copy instead: shadowctl fork {environment} NAME (it copies when it cannot snapshot)",
        )
    # Flush what the workspace wrote to its volume, so the snapshot holds it.
    if envops.is_true(env, c.COND_WORKSPACE_READY):
        ep = yield from envops.runtime_endpoint(env)
        result = yield from runtime.run_command(ep, "sync", timeout=120)
        if result.exit_code != 0:
            raise ShadowError(f"sync failed in the workspace: {result.stderr.strip()[:300]}")
    env_status = env.status
    sources = [
        s.model_dump(include={"name", "repo", "path"})
        for s in (env_status.sources if env_status else None) or ()
    ]
    snapshot_name = name or f"{environment}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    manifest = snapshots.build_volume_snapshot(
        name=snapshot_name,
        namespace=namespace,
        pvc=pvc_name,
        class_name=choice.name,
        environment=environment,
        snapshot_of=environment,
        sources=sources,
    )
    if not retain:
        manifest["metadata"]["ownerReferences"] = [
            {
                "apiVersion": SHADOW_ENVIRONMENT.api_version,
                "kind": SHADOW_ENVIRONMENT.kind,
                "name": environment,
                "uid": env.metadata.uid,
            }
        ]
    what = f"VolumeSnapshot {namespace}/{snapshot_name}"
    created = yield from kube.send(
        Call("POST", VOLUME_SNAPSHOT.path(namespace), f"create {what}", body=manifest)
    )
    return (yield from wait_snapshot(namespace, snapshot_name, created, timeout))


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
