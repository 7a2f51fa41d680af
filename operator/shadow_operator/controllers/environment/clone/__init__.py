"""The clone step of a fork (spec.workspace.from): decide once how to clone, then either restore the new
workspace's volume from a snapshot (`snapshot.py`: cut after a flush, claimed while it is cut) or plan a copy
streamed between the two runtimes (`copy.py`), and finish the clone once the new workspace's Pod is up.

Cutting a snapshot is written once, in common/snapshots.py (the class choice, the flush, the manifest), and
driven here on the operator's client and by the SDK's `shadowctl snapshot` and shared fork snapshots.
"""

from __future__ import annotations

from datetime import datetime

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.environment import (
    CloneStatus,
    InheritedSource,
    ShadowEnvironment,
    ShadowEnvironmentStatus,
)
from shadow_operator.api.kinds import PVC, SHADOW_ENVIRONMENT, VOLUME_SNAPSHOT
from shadow_operator.api.models import PersistentVolumeClaim, VolumeSnapshot
from shadow_operator.common import snapshots
from shadow_operator.controllers.environment.clone.copy import CopyPart
from shadow_operator.controllers.environment.clone.restore import BASELINE_DIR, Restore, instance
from shadow_operator.controllers.environment.clone.snapshot import SnapshotPart
from shadow_operator.controllers.environment.state import RETRY_SECONDS, Pass, Ports, StepFailed

__all__ = ["BASELINE_DIR", "CloneStep", "Restore"]


class CloneStep:
    def __init__(self, deps: Ports) -> None:
        self.deps = deps
        self.snapshot = SnapshotPart(deps)
        self.copy = CopyPart(deps)

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
        return await self.snapshot.restore(state, clone, origin)

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
            cut = VolumeSnapshot.from_body(snapshot)
            inherited = snapshots.parse_sources_annotation(
                cut.metadata.annotations.get(c.ANNOTATION_SNAPSHOT_SOURCES)
            )
            return CloneStatus(
                method="Snapshot",
                reason=f"restoring VolumeSnapshot {origin.snapshot}",
                source=f"volumesnapshot/{origin.snapshot}",
                snapshot=origin.snapshot,
                storage_class_name=env.spec.workspace.storage_class_name
                or await self.snapshot.class_for_snapshot(cut),
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
        body = self.deps.cache.store(PVC).get(ns, naming.pvc_name(c.WORKSPACE_VOLUME, instance(source)))
        if body is None:
            raise StepFailed(None, "WaitingForSource", f"environment {name} has no workspace volume yet")
        pvc = PersistentVolumeClaim.from_body(body)
        source_class = pvc.spec.storage_class_name
        target_class = env.spec.workspace.storage_class_name or source_class
        clone = CloneStatus(
            method="Copy",
            reason="spec.workspace.from.method is Copy",
            source=f"environment/{name}",
            storage_class_name=target_class,
            restore_size=pvc.capacity_storage or pvc.requested_storage,
            sources=[
                InheritedSource(name=s.name, repo=s.repo, path=s.path) for s in src_status.sources or ()
            ],
            started_at=started,
        )
        if origin.method == "Copy":
            return clone
        choice = await self.snapshot.choose(source_class, target_class)
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

    async def finish(self, state: Pass) -> None:
        """The workspace Pod is up on its new volume: a snapshot is restored; a copy is streamed in now."""
        clone = state.status.clone
        assert clone is not None
        if clone.completed_at is not None:
            return
        origin = state.env.spec.workspace.from_
        assert origin is not None
        if clone.method == "Copy":
            copied = await self.copy.copy(state, clone, origin.timeout_seconds)
            if copied is None:
                message = f"copying from {clone.source} through the runtimes"
                state.set(c.COND_CLONED, False, "Copying", message)
                raise StepFailed(None, "Copying", message, retry=None)  # its end wakes the pass
            clone.copied_bytes = copied
            reason, message = "Copied", f"copied from {clone.source} through the runtimes ({clone.reason})"
        else:
            reason, message = "SnapshotRestored", f"restored from VolumeSnapshot {clone.snapshot}"
        clone.completed_at = state.now().replace(microsecond=0)
        state.set(c.COND_CLONED, True, reason, message)
        state.mark("cloned")
        self.deps.recorder.info(state.env.body, reason="Cloned", message=message)
