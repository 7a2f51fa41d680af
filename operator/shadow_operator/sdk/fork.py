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
from typing import Any

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
from shadow_operator.resources import snapshots
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk import kube, runtime
from shadow_operator.sdk import sandbox as sandboxops
from shadow_operator.sdk.errors import ApiNotInstalled, NotFound, ShadowError, WaitTimeout
from shadow_operator.sdk.kube import Body, Call, Op
from shadow_operator.sdk.runtime import RuntimeEndpoint

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
    way, so `shadowctl cleanup` finds a retained one once the environment is gone. It records the
    environment's sources, which an environment restored from it (spec.workspace.from.snapshot) inherits.
    """
    env = yield from envops.get(namespace, environment)
    if not envops.is_true(env, c.COND_SOURCES_READY):
        raise envops.runtime_not_ready(env, " (its sources are not copied in yet)")
    ep = (yield from envops.runtime_endpoint(env)) if envops.is_true(env, c.COND_WORKSPACE_READY) else None
    sources = [
        s.model_dump(include={"name", "repo", "path"})
        for s in (env.status.sources if env.status else None) or ()
    ]
    owner = {"apiVersion": SHADOW_ENVIRONMENT.api_version, "kind": SHADOW_ENVIRONMENT.kind}
    return (
        yield from _snapshot_claim(
            namespace,
            naming.pvc_name(c.WORKSPACE_VOLUME, environment),
            name or _stamped(environment),
            owner={**owner, "name": environment, "uid": env.metadata.uid or ""},
            retain=retain,
            flush=ep,
            environment=environment,
            sources=sources,
            timeout=timeout,
        )
    )


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
    ep = None
    if any(
        x.get("type") == c.COND_READY and x.get("status") == "True"
        for x in (body.get("status") or {}).get("conditions") or ()
    ):
        ep = yield from sandboxops.endpoint(sandboxops.SandboxRef(sandbox, sandbox, namespace))
    return (
        yield from _snapshot_claim(
            namespace,
            naming.pvc_name(volume, sandbox),
            name or _stamped(sandbox),
            owner={
                "apiVersion": SANDBOX.api_version,
                "kind": SANDBOX.kind,
                "name": sandbox,
                "uid": body["metadata"]["uid"],
            },
            retain=retain,
            flush=ep,
            environment=None,
            sources=(),
            timeout=timeout,
        )
    )


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
    sources: Sequence[Mapping[str, Any]],
    timeout: float,
) -> Op[Body]:
    pvc = yield from kube.get(PVC.path(namespace, claim), f"PersistentVolumeClaim {namespace}/{claim}")
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
            f"cannot snapshot {owner['kind']} {owner['name']}'s volume {claim}: {choice.reason}",
            hint="use a StorageClass whose CSI driver has a VolumeSnapshotClass (kubectl get volumesnapshotclass); "
            "`shadowctl fork` copies instead where it cannot snapshot",
        )
    # Flush what the workspace wrote to its volume, so the snapshot holds it.
    if flush is not None:
        result = yield from runtime.run_command(flush, "sync", timeout=120)
        if result.exit_code != 0:
            raise ShadowError(f"sync failed in the workspace: {result.stderr.strip()[:300]}")
    manifest = snapshots.build_volume_snapshot(
        name=name,
        namespace=namespace,
        pvc=claim,
        class_name=choice.name,
        environment=environment,
        snapshot_of=owner["name"],
        sources=sources,
    )
    if not retain:
        manifest["metadata"]["ownerReferences"] = [owner]
    what = f"VolumeSnapshot {namespace}/{name}"
    created = yield from kube.send(
        Call("POST", VOLUME_SNAPSHOT.path(namespace), f"create {what}", body=manifest)
    )
    return (yield from wait_snapshot(namespace, name, created, timeout))


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
