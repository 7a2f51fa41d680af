"""The snapshot part of the clone step: the snapshot class for the source's volume, the snapshot cut after a
flush (`common/snapshots.py`'s plan, which the SDK drives too, here on the operator's client), and the
workspace volume restored from it, claimed while it is cut."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar, cast

from shadow_operator.api import constants as c
from shadow_operator.api import kinds, naming
from shadow_operator.api.environment import CloneStatus, ShadowEnvironment, WorkspaceFrom
from shadow_operator.api.models import (
    PersistentVolumeClaim,
    StorageClass,
    VolumeSnapshot,
    VolumeSnapshotClass,
)
from shadow_operator.clients.kube import ApiError
from shadow_operator.clients.runtime import RuntimeUnavailable
from shadow_operator.common import snapshots
from shadow_operator.controllers.environment.clone.restore import Restore, instance, runtime_url, size_or_none
from shadow_operator.controllers.environment.state import (
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

T = TypeVar("T")


class SnapshotPart:
    def __init__(self, deps: Ports) -> None:
        self.deps = deps

    async def restore(self, state: Pass, clone: CloneStatus, origin: WorkspaceFrom) -> Restore:
        """Take the snapshot (once) and restore the workspace volume from it (see CloneStep.restore)."""
        env = state.env
        name = clone.snapshot
        assert name is not None
        restore = Restore(snapshots.data_source(name), clone.storage_class_name, None)
        if clone.completed_at is not None:
            return replace(restore, min_size=size_or_none(clone.restore_size))
        cloned = state.conditions.find(c.COND_CLONED)
        reason = cloned.reason if cloned is not None else None
        if reason == "Restoring":  # the snapshot was ready in an earlier pass: it is not read again
            await self._check_claim(state, name, clone.restore_size or "0", wake=False)
            return replace(restore, min_size=size_or_none(clone.restore_size))
        snapshot = await self.deps.client.get_live(kinds.VOLUME_SNAPSHOT, env.namespace, name)
        if snapshot is None:
            if origin.snapshot:
                raise StepFailed(
                    "CloneSourceNotFound",
                    "CloneSourceNotFound",
                    f"VolumeSnapshot {name!r} does not exist in namespace {env.namespace} any more",
                    retry=None,
                )
            snapshot = await self._take(env, clone)
        phase, detail = snapshots.snapshot_state(snapshot)
        if phase == "Failed":
            raise StepFailed(
                "SnapshotFailed", "SnapshotFailed", f"VolumeSnapshot {name}: {detail}", retry=None
            )
        cut = VolumeSnapshot.from_body(snapshot)
        size = cut.status.restore_size
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
            clone.restore_size = clone.restore_size or size or self._source_size(cut)
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
        if size and (not planned or parse_quantity(size) > parse_quantity(planned)):
            clone.restore_size = size  # the Sandbox asks for it from this pass on
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
        return replace(restore, min_size=size_or_none(clone.restore_size))

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
        body = self.deps.cache.store(kinds.PVC).get(env.namespace, claim_name)
        claim = PersistentVolumeClaim.from_body(body) if body is not None else None
        if claim is None or claim.status.phase == "Bound":
            return
        requested = claim.requested_storage
        if requested and size != "0" and parse_quantity(requested) < parse_quantity(size):
            await client.delete(kinds.PVC, env.namespace, claim_name, uid=claim.metadata.uid or None)
            return
        if wake and claim.metadata.annotations.get(c.ANNOTATION_SNAPSHOT_READY) != snapshot:
            await client.patch(
                kinds.PVC,
                env.namespace,
                claim_name,
                {"metadata": {"annotations": {c.ANNOTATION_SNAPSHOT_READY: snapshot}}},
            )

    def _source_claim(self, snapshot: VolumeSnapshot) -> PersistentVolumeClaim | None:
        """The claim the snapshot was cut from, while it exists (from the cache)."""
        claim_name = snapshot.spec.source.persistent_volume_claim_name
        body = self.deps.cache.store(kinds.PVC).get(snapshot.namespace, claim_name) if claim_name else None
        return PersistentVolumeClaim.from_body(body) if body is not None else None

    def _source_size(self, snapshot: VolumeSnapshot) -> str | None:
        """The size of the volume the snapshot was cut from (its capacity, or what it asked for if more)."""
        claim = self._source_claim(snapshot)
        if claim is None:
            return None
        sizes = [q for q in (claim.requested_storage, claim.capacity_storage) if q]
        return max(sizes, key=parse_quantity) if sizes else None

    async def choose(self, source_class: str | None, target_class: str | None) -> snapshots.ClassChoice:
        """The VolumeSnapshotClass for the source's volume, restored into `target_class`."""
        return await self._drive(snapshots.choose(source_class, target_class))

    async def class_for_snapshot(self, snapshot: VolumeSnapshot) -> str | None:
        """The StorageClass to restore a snapshot into: the class of the volume it was cut from while that
        claim exists (its driver holds the snapshot; the SDK's shared fork snapshots rely on this), else a
        class of the snapshot's driver (the default one if it is)."""
        claim = self._source_claim(snapshot)
        if claim is not None and claim.spec.storage_class_name:
            return claim.spec.storage_class_name
        class_name = snapshot.spec.volume_snapshot_class_name
        client = self.deps.client
        klass = await client.get_live(kinds.VOLUME_SNAPSHOT_CLASS, "", class_name) if class_name else None
        driver = VolumeSnapshotClass.from_body(klass).driver if klass is not None else ""
        if not driver:
            return None
        classes = [StorageClass.from_body(sc) for sc in await client.list_live(kinds.STORAGE_CLASS)]
        candidates = sorted(
            (sc for sc in classes if sc.provisioner == driver), key=lambda sc: (not sc.is_default, sc.name)
        )
        return candidates[0].name if candidates else None

    async def _take(self, env: ShadowEnvironment, clone: CloneStatus) -> Body:
        """Flush the source workspace's writes to its volume, then snapshot the volume."""
        origin = env.spec.workspace.from_
        assert origin is not None and origin.environment and clone.snapshot and clone.snapshot_class_name
        source_name, ns, deps = origin.environment, env.namespace, self.deps
        source = deps.cache.store(kinds.SHADOW_ENVIRONMENT).get(ns, source_name)
        named = instance(source) if source else source_name
        sandbox = deps.cache.store(kinds.SANDBOX).get(ns, named)
        plan = snapshots.cut(
            # A suspended workspace has no Pod and nothing to flush; a running one must flush first.
            flush=conds.is_true(conds.of(sandbox), c.COND_READY),
            name=clone.snapshot,
            namespace=ns,
            pvc=naming.pvc_name(c.WORKSPACE_VOLUME, named),
            class_name=clone.snapshot_class_name,
            environment=env.name,
            snapshot_of=source_name,
            sources=[s.model_dump(by_alias=True) for s in clone.sources or ()],
        )
        created = await self._drive(plan, env=env, source=source, retain=origin.retain_snapshot)
        deps.recorder.info(
            env.body,
            reason="SnapshotCreated",
            message=f"VolumeSnapshot {clone.snapshot} of environment {source_name}'s workspace "
            f"(class {clone.snapshot_class_name})",
        )
        return created

    async def _drive(
        self,
        plan: snapshots.Plan[T],
        *,
        env: ShadowEnvironment | None = None,
        source: Body | None = None,
        retain: bool = False,
    ) -> T:
        """Run a snapshot plan (common/snapshots.py) on the operator's client: the snapshot a child of `env`
        unless `retain`, the workspace of the environment `source` flushed through its runtime."""
        try:
            step = next(plan)
            while True:
                step = plan.send(await self._answer(step, env, source, retain))
        except StopIteration as done:
            return cast(T, done.value)

    async def _answer(
        self, step: snapshots.Step, env: ShadowEnvironment | None, source: Body | None, retain: bool
    ) -> Any:
        client = self.deps.client
        if isinstance(step, snapshots.ReadStorageClass):
            return await client.get_live(kinds.STORAGE_CLASS, "", step.name)
        if isinstance(step, snapshots.ListSnapshotClasses):
            try:
                return await client.list_live(kinds.VOLUME_SNAPSHOT_CLASS)
            except ApiError as exc:
                if exc.not_found:
                    return None
                raise
        assert env is not None
        if isinstance(step, snapshots.Flush):
            origin = env.spec.workspace.from_
            source_name = str(origin.environment if origin else "")
            named = instance(source) if source else source_name
            try:
                async with self.deps.runtime_for(env.namespace, named, runtime_url(source)) as rt:
                    await rt.flush()
            except RuntimeUnavailable as exc:
                raise StepFailed(
                    None, "WaitingForSource", f"flushing environment {source_name}'s workspace: {exc}"
                ) from None
            return None
        manifest = step.manifest
        if not retain:
            return await self.deps.apply(kinds.VOLUME_SNAPSHOT, manifest, env)
        try:
            return await client.create(kinds.VOLUME_SNAPSHOT, manifest)
        except ApiError as exc:
            if not exc.already_exists:
                raise
        meta = manifest["metadata"]
        return await client.get_live(kinds.VOLUME_SNAPSHOT, meta["namespace"], meta["name"]) or manifest
