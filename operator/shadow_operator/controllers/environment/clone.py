"""The clone step of a fork (spec.workspace.from): decide once how to clone, cut the snapshot after a flush and
restore the new workspace's volume from it, claimed while it is cut (or plan a copy streamed between the two
runtimes), then finish the clone once the new workspace's Pod is up.

The operator-side orchestration of a snapshot lives here alone; common/snapshots.py holds the pure pieces
(the manifest, the class choice, a snapshot's state) that the SDK's `shadowctl snapshot` uses as well.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.environment import (
    CloneStatus,
    InheritedSource,
    ShadowEnvironment,
    ShadowEnvironmentStatus,
)
from shadow_operator.api.kinds import (
    PVC,
    SANDBOX,
    SHADOW_ENVIRONMENT,
    STORAGE_CLASS,
    VOLUME_SNAPSHOT,
    VOLUME_SNAPSHOT_CLASS,
)
from shadow_operator.clients.kube import ApiError
from shadow_operator.clients.runtime import RuntimeRefused, RuntimeUnavailable
from shadow_operator.common import snapshots
from shadow_operator.controllers.environment.state import (
    RETRY_SECONDS,
    SNAPSHOT_EARLY_POLL_SECONDS,
    SNAPSHOT_EARLY_SECONDS,
    SNAPSHOT_POLL_SECONDS,
    Pass,
    Ports,
    StepFailed,
)
from shadow_operator.engine.cache import Body
from shadow_operator.resources import conditions as conds
from shadow_operator.resources.environment import parse_quantity

# The runtime's diff baseline, in its state directory on the volume (a copy-fork takes it along).
BASELINE_DIR = ".sandbox-runtime/baseline"


@dataclass(frozen=True)
class Restore:
    """What a fork's workspace volume is made from."""

    data_source: dict[str, str] | None  # a VolumeSnapshot, or None (an empty volume the copy fills)
    storage_class: str | None
    min_size: str | None
    # Seconds after which the step wants another pass (a snapshot still being cut); None: none of its own.
    poll: float | None = None


class CloneStep:
    def __init__(self, deps: Ports) -> None:
        self.deps = deps

    async def restore(self, state: Pass) -> Restore:
        """Decide how to clone (once), take the snapshot, and say what the workspace volume is made from.

        The volume is claimed as soon as the snapshot exists, not once it is ready to use, so that the Sandbox's
        Pod is created and waits beside it: csi-provisioner restores the claim once the snapshot is ready (this
        step then wakes it up, see `_check_claim`). The claim must be at least the snapshot's restoreSize,
        which drivers report with readiness: until then it is the size of the volume the snapshot was cut from,
        which a restore of that volume does not exceed. Where neither is known (the snapshot's volume is gone),
        this raises StepFailed until the snapshot is ready, as it does while the snapshot does not exist yet.
        """
        env = state.env
        origin = env.spec.workspace.from_
        assert origin is not None
        clone = state.status.clone
        if clone is None:
            clone = await self._plan(env, state.now())
            state.status.clone, state.status.clone_method = clone, clone.method
            self.deps.recorder.info(env.body, reason="Cloning", message=f"{clone.method}: {clone.reason}")
        if clone.method == "Copy":
            if clone.completed_at is None:
                state.set(c.COND_CLONED, False, "Copying", f"copy planned: {clone.reason}")
            return Restore(None, clone.storage_class_name, clone.restore_size)
        name = clone.snapshot
        assert name is not None
        restore = Restore(snapshots.data_source(name), clone.storage_class_name, None)
        if clone.completed_at is not None:
            return replace(restore, min_size=_size_or_none(clone.restore_size))
        cloned = state.conditions.find(c.COND_CLONED)
        reason = cloned.reason if cloned is not None else None
        if reason == "Restoring":  # the snapshot was ready in an earlier pass: it is not read again
            await self._check_claim(state, name, clone.restore_size or "0", wake=False)
            return replace(restore, min_size=_size_or_none(clone.restore_size))
        snapshot = await self.deps.client.get_live(VOLUME_SNAPSHOT, env.namespace, name)
        if snapshot is None:
            if origin.snapshot:
                raise StepFailed(
                    "CloneSourceNotFound",
                    "CloneSourceNotFound",
                    f"VolumeSnapshot {name!r} does not exist in namespace {env.namespace} any more",
                    retry=None,
                )
            snapshot = await self._take_snapshot(env, clone)
        phase, detail = snapshots.snapshot_state(snapshot)
        if phase == "Failed":
            raise StepFailed(
                "SnapshotFailed", "SnapshotFailed", f"VolumeSnapshot {name}: {detail}", retry=None
            )
        size = (snapshot.get("status") or {}).get("restoreSize")
        if phase == "Pending":
            timeout = origin.timeout_seconds
            elapsed = (state.now() - (clone.started_at or state.now())).total_seconds()
            if elapsed > timeout:
                raise StepFailed(
                    "SnapshotTimeout",
                    "SnapshotTimeout",
                    f"VolumeSnapshot {name} was not ready to use {timeout}s after it was requested "
                    f"({detail}); check the snapshot controller and the CSI driver "
                    "(kubectl describe volumesnapshot), or fork with spec.workspace.from.method: Copy",
                    retry=None,
                )
            message = f"VolumeSnapshot {name}: {detail}"
            poll = SNAPSHOT_EARLY_POLL_SECONDS if elapsed < SNAPSHOT_EARLY_SECONDS else SNAPSHOT_POLL_SECONDS
            clone.restore_size = clone.restore_size or (str(size) if size else self._source_size(snapshot))
            if not clone.restore_size:
                state.set(c.COND_CLONED, False, "Snapshotting", message)
                raise StepFailed(None, "Snapshotting", message, retry=poll)
            state.set(
                c.COND_CLONED,
                False,
                "Snapshotting",
                f"{message}; the workspace volume is restored from it once it is ready",
            )
            return replace(restore, min_size=clone.restore_size, poll=poll)
        planned = clone.restore_size
        if size and (not planned or parse_quantity(str(size)) > parse_quantity(planned)):
            clone.restore_size = str(size)  # the Sandbox asks for it from this pass on
        clone.restore_size = clone.restore_size or "0"
        if planned is not None and clone.restore_size == planned:
            # The last pass saw it being cut: the claim may have been made, and refused, meanwhile.
            await self._check_claim(state, name, planned, wake=reason == "Snapshotting")
        state.set(
            c.COND_CLONED,
            False,
            "Restoring",
            f"restoring VolumeSnapshot {name} into the workspace volume",
        )
        return replace(restore, min_size=_size_or_none(clone.restore_size))

    async def _check_claim(self, state: Pass, snapshot: str, size: str, *, wake: bool) -> None:
        """The snapshot is ready; the workspace's claim, if made and not bound yet, is restored from it.

        `wake`: the claim was made while the snapshot was being cut, and csi-provisioner retries such a claim
        with a growing backoff (1 s, 2 s, 4 s, ...); an update of the claim requeues it at once, so it gets an
        annotation. A claim that asks for less than `size` (a driver reported a restoreSize beyond the size of
        the volume it was cut from) can never be provisioned: it is deleted, and the Sandbox, which asks for
        `size` since an earlier pass, makes it again.
        """
        env, client = state.env, self.deps.client
        claim_name = naming.pvc_name(c.WORKSPACE_VOLUME, state.instance)
        claim = self.deps.cache.store(PVC).get(env.namespace, claim_name)
        if claim is None or (claim.get("status") or {}).get("phase") == "Bound":
            return
        meta = claim["metadata"]
        requested = ((claim["spec"].get("resources") or {}).get("requests") or {}).get("storage")
        if requested and size != "0" and parse_quantity(str(requested)) < parse_quantity(size):
            await client.delete(PVC, env.namespace, claim_name, uid=meta.get("uid"))
            return
        if wake and (meta.get("annotations") or {}).get(c.ANNOTATION_SNAPSHOT_READY) != snapshot:
            await client.patch(
                PVC,
                env.namespace,
                claim_name,
                {"metadata": {"annotations": {c.ANNOTATION_SNAPSHOT_READY: snapshot}}},
            )

    def _source_size(self, snapshot: Body) -> str | None:
        """The size of the volume the snapshot was cut from (its capacity, or what it asked for if more)."""
        claim_name = ((snapshot.get("spec") or {}).get("source") or {}).get("persistentVolumeClaimName")
        namespace = snapshot["metadata"].get("namespace") or ""
        claim = self.deps.cache.store(PVC).get(namespace, claim_name) if claim_name else None
        if claim is None:
            return None
        requested = ((claim["spec"].get("resources") or {}).get("requests") or {}).get("storage")
        capacity = ((claim.get("status") or {}).get("capacity") or {}).get("storage")
        sizes = [str(q) for q in (requested, capacity) if q]
        return max(sizes, key=parse_quantity) if sizes else None

    async def _plan(self, env: ShadowEnvironment, started: datetime) -> CloneStatus:
        origin = env.spec.workspace.from_
        assert origin is not None
        ns, client = env.namespace, self.deps.client
        if origin.snapshot:
            snapshot = await client.get_live(VOLUME_SNAPSHOT, ns, origin.snapshot)
            if snapshot is None:
                raise StepFailed(
                    "CloneSourceNotFound",
                    "CloneSourceNotFound",
                    f"VolumeSnapshot {origin.snapshot!r} does not exist in namespace {ns}; take one with "
                    "`shadowctl snapshot ENV` or name an existing one (kubectl get volumesnapshot)",
                    retry=RETRY_SECONDS,
                )
            annotations = snapshot["metadata"].get("annotations") or {}
            inherited = snapshots.parse_sources_annotation(annotations.get(c.ANNOTATION_SNAPSHOT_SOURCES))
            return CloneStatus(
                method="Snapshot",
                reason=f"restoring VolumeSnapshot {origin.snapshot}",
                source=f"volumesnapshot/{origin.snapshot}",
                snapshot=origin.snapshot,
                storage_class_name=env.spec.workspace.storage_class_name
                or await self._class_for_snapshot(snapshot),
                sources=None if inherited is None else [InheritedSource.model_validate(s) for s in inherited],
                started_at=started,
            )
        name = origin.environment
        assert name is not None
        source = self.deps.cache.store(SHADOW_ENVIRONMENT).get(ns, name)
        if source is None or name == env.name:
            raise StepFailed(
                "CloneSourceNotFound",
                "CloneSourceNotFound",
                f"environment {name!r} does not exist in namespace {ns}"
                if source is None
                else "an environment cannot fork itself",
                retry=None,  # its creation wakes us
            )
        src_status = ShadowEnvironment.from_body(source).status or ShadowEnvironmentStatus()
        if not any(
            x.type == c.COND_SOURCES_READY and x.status == "True" for x in src_status.conditions or ()
        ):
            raise StepFailed(
                None,
                "WaitingForSource",
                f"waiting for environment {name} to have its sources copied in",
                retry=None,
            )
        pvc = self.deps.cache.store(PVC).get(ns, naming.pvc_name(c.WORKSPACE_VOLUME, _instance(source)))
        if pvc is None:
            raise StepFailed(None, "WaitingForSource", f"environment {name} has no workspace volume yet")
        source_class = pvc["spec"].get("storageClassName")
        target_class = env.spec.workspace.storage_class_name or source_class
        clone = CloneStatus(
            method="Copy",
            reason="spec.workspace.from.method is Copy",
            source=f"environment/{name}",
            storage_class_name=target_class,
            restore_size=((pvc.get("status") or {}).get("capacity") or {}).get("storage")
            or pvc["spec"]["resources"]["requests"]["storage"],
            sources=[
                InheritedSource(name=s.name, repo=s.repo, path=s.path) for s in src_status.sources or ()
            ],
            started_at=started,
        )
        if origin.method == "Copy":
            return clone
        choice = await self._snapshot_class(source_class, target_class)
        if choice.name is None:
            if origin.method == "Snapshot":
                raise StepFailed(
                    "SnapshotUnsupported",
                    "SnapshotUnsupported",
                    f"cannot snapshot environment {name}'s volume: {choice.reason}; install a "
                    "VolumeSnapshotClass for its driver, or set spec.workspace.from.method to Auto to copy",
                    retry=RETRY_SECONDS,
                )
            clone.reason = f"{choice.reason}: copying through the runtimes"
            return clone
        clone.method, clone.reason = "Snapshot", choice.reason
        clone.snapshot = naming.bounded(f"{env.name}-fork")
        clone.snapshot_class_name = choice.name
        clone.restore_size = None
        return clone

    async def _snapshot_class(
        self, source_class: str | None, target_class: str | None
    ) -> snapshots.ClassChoice:
        client = self.deps.client
        storage_class = await client.get_live(STORAGE_CLASS, "", source_class) if source_class else None
        driver = snapshots.volume_driver(storage_class)
        if target_class != source_class:
            target = await client.get_live(STORAGE_CLASS, "", target_class) if target_class else None
            if snapshots.volume_driver(target) != driver:
                return snapshots.ClassChoice(
                    None, f"StorageClass {target_class} is served by another driver than the source volume"
                )
        try:
            classes = await client.list_live(VOLUME_SNAPSHOT_CLASS)
        except ApiError as exc:
            if exc.not_found:
                return snapshots.choose_class(driver, (), api_installed=False)
            raise
        return snapshots.choose_class(driver, classes)

    async def _class_for_snapshot(self, snapshot: Body) -> str | None:
        """The StorageClass to restore a snapshot into: the class of the volume it was cut from while that
        claim exists (its driver holds the snapshot; the SDK's shared fork snapshots rely on this), else a
        class of the snapshot's driver (the default one if it is)."""
        meta = snapshot["metadata"]
        claim_name = ((snapshot.get("spec") or {}).get("source") or {}).get("persistentVolumeClaimName")
        claim = (
            self.deps.cache.store(PVC).get(meta.get("namespace") or "", claim_name) if claim_name else None
        )
        if claim is not None and claim["spec"].get("storageClassName"):
            return str(claim["spec"]["storageClassName"])
        class_name = (snapshot.get("spec") or {}).get("volumeSnapshotClassName")
        client = self.deps.client
        klass = await client.get_live(VOLUME_SNAPSHOT_CLASS, "", class_name) if class_name else None
        driver = (klass or {}).get("driver")
        if not driver:
            return None
        candidates = [sc for sc in await client.list_live(STORAGE_CLASS) if sc.get("provisioner") == driver]
        candidates.sort(
            key=lambda sc: (
                (sc["metadata"].get("annotations") or {}).get("storageclass.kubernetes.io/is-default-class")
                != "true",
                sc["metadata"]["name"],
            )
        )
        return str(candidates[0]["metadata"]["name"]) if candidates else None

    async def _take_snapshot(self, env: ShadowEnvironment, clone: CloneStatus) -> Body:
        """Flush the source workspace's writes to its volume, then snapshot the volume."""
        origin = env.spec.workspace.from_
        assert origin is not None and origin.environment and clone.snapshot and clone.snapshot_class_name
        source_name, ns, deps = origin.environment, env.namespace, self.deps
        source = deps.cache.store(SHADOW_ENVIRONMENT).get(ns, source_name)
        instance = _instance(source) if source else source_name
        sandbox = deps.cache.store(SANDBOX).get(ns, instance)
        # A suspended workspace has no Pod and nothing to flush; a running one must flush first.
        if conds.is_true(conds.of(sandbox), c.COND_READY):
            try:
                async with deps.runtime_for(ns, instance, _runtime_url(source)) as rt:
                    await rt.flush()
            except RuntimeUnavailable as exc:
                raise StepFailed(
                    None, "WaitingForSource", f"flushing environment {source_name}'s workspace: {exc}"
                ) from None
        manifest = snapshots.build_volume_snapshot(
            name=clone.snapshot,
            namespace=ns,
            pvc=naming.pvc_name(c.WORKSPACE_VOLUME, instance),
            class_name=clone.snapshot_class_name,
            environment=env.name,
            snapshot_of=source_name,
            sources=[s.model_dump(by_alias=True) for s in clone.sources or ()],
        )
        if origin.retain_snapshot:
            try:
                created = await deps.client.create(VOLUME_SNAPSHOT, manifest)
            except ApiError as exc:
                if not exc.already_exists:
                    raise
                created = await deps.client.get_live(VOLUME_SNAPSHOT, ns, clone.snapshot) or manifest
        else:
            created = await deps.apply(VOLUME_SNAPSHOT, manifest, env)
        deps.recorder.info(
            env.body,
            reason="SnapshotCreated",
            message=f"VolumeSnapshot {clone.snapshot} of environment {source_name}'s workspace "
            f"(class {clone.snapshot_class_name})",
        )
        return created

    async def finish(self, state: Pass) -> None:
        """The workspace Pod is up on its new volume: a snapshot is restored; a copy is streamed in now."""
        clone = state.status.clone
        assert clone is not None
        if clone.completed_at is not None:
            return
        origin = state.env.spec.workspace.from_
        assert origin is not None
        if clone.method == "Copy":
            clone.copied_bytes = await self._copy_workspace(state, clone, origin.timeout_seconds)
            reason, message = "Copied", f"copied from {clone.source} through the runtimes ({clone.reason})"
        else:
            reason, message = "SnapshotRestored", f"restored from VolumeSnapshot {clone.snapshot}"
        clone.completed_at = state.now().replace(microsecond=0)
        state.set(c.COND_CLONED, True, reason, message)
        state.mark("cloned")
        self.deps.recorder.info(state.env.body, reason="Cloned", message=message)

    async def _copy_workspace(self, state: Pass, clone: CloneStatus, timeout: int) -> int:
        env, deps = state.env, self.deps
        source_name = clone.source.partition("/")[2]
        source = deps.cache.store(SHADOW_ENVIRONMENT).get(env.namespace, source_name)
        if source is None:
            raise StepFailed(
                "CloneSourceNotFound",
                "CloneSourceNotFound",
                f"environment {source_name!r} was deleted before its workspace was copied",
                retry=None,
            )
        started = clone.started_at or datetime.now(UTC)
        remaining = timeout - (state.now() - started).total_seconds()
        if remaining <= 0:
            raise StepFailed(
                "CopyFailed",
                "CopyFailed",
                f"environment {source_name}'s workspace was not copied within {timeout}s; is it running "
                "(not suspended)? Raise spec.workspace.from.timeoutSeconds for large workspaces",
                retry=None,
            )
        url = _runtime_url(source)
        try:
            async with (
                deps.runtime_for(env.namespace, _instance(source), url) as origin,
                deps.runtime_for(env.namespace, state.instance, state.status.runtime_url) as target,
            ):
                async with asyncio.timeout(remaining):
                    copied = await origin.copy_tree_to(target, "", timeout=remaining)
                    if await origin.has_baseline():
                        # The diff baseline comes along, so the fork diffs (and promotes) against the sources
                        # as they were copied in, like a snapshot's clone.
                        copied += await origin.copy_tree_to(target, BASELINE_DIR, timeout=remaining)
        except TimeoutError:
            raise StepFailed(
                "CopyFailed",
                "CopyFailed",
                f"copying environment {source_name}'s workspace took longer than {timeout}s; raise "
                "spec.workspace.from.timeoutSeconds for large workspaces",
                retry=None,
            ) from None
        except RuntimeRefused as exc:
            raise StepFailed(
                "CopyFailed", "CopyFailed", f"copying the workspace: {exc}", retry=RETRY_SECONDS
            ) from None
        except RuntimeUnavailable as exc:
            message = f"copying from environment {source_name} (it must be running): {exc}"
            state.set(c.COND_CLONED, False, "Copying", message)
            raise StepFailed(None, "Copying", message) from None
        return copied


def _runtime_url(source: Body | None) -> str | None:
    """The runtime URL of the environment being forked (its status, validated into the model)."""
    status = ShadowEnvironment.from_body(source).status if source else None
    return status.runtime_url if status else None


def _size_or_none(size: str | None) -> str | None:
    """A restore size to ask for; "0" records a snapshot that reported none."""
    return size if size and size != "0" else None


def _instance(source: Body) -> str:
    """What the workspace of the environment being forked is named after (its status.sandbox: a pool
    instance it took, or its own name)."""
    status = ShadowEnvironment.from_body(source).status
    return (status.sandbox if status else None) or source["metadata"]["name"]
