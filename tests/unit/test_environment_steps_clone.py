"""The clone step with fakes: how a fork is cloned (snapshot or copy, decided once), the snapshot cut after a
flush and waited for, the clone finished once the new workspace runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.kinds import (
    PVC,
    SANDBOX,
    SECRET,
    SHADOW_ENVIRONMENT,
    STORAGE_CLASS,
    VOLUME_SNAPSHOT,
    VOLUME_SNAPSHOT_CLASS,
)
from shadow_operator.controllers.environment.clone import BASELINE_DIR, CloneStep
from shadow_operator.controllers.environment.state import (
    SNAPSHOT_EARLY_POLL_SECONDS,
    SNAPSHOT_POLL_SECONDS,
    StepFailed,
)

from tests.support.fakes import FIXED_NOW, NAMESPACE, World, environment, new_pass, settle, to_patch

pytestmark = pytest.mark.unit

ORIGIN_URL = "http://origin.team.svc:8080"
FORK_URL = "http://fork.team.svc:8080"
DRIVER = "hostpath.csi.k8s.io"


def origin_world(*, snapshot_class: bool) -> World:
    """The environment `origin`, copied in and running, on a volume of class `fast`."""
    world = World()
    world.cache.store(SHADOW_ENVIRONMENT).upsert(
        {
            "metadata": {"name": "origin", "namespace": NAMESPACE, "resourceVersion": "1"},
            "spec": {},
            "status": {
                "runtimeURL": ORIGIN_URL,
                "conditions": [{"type": c.COND_SOURCES_READY, "status": "True", "reason": "SourcesCopied"}],
                "sources": [
                    {
                        "name": "app",
                        "repo": "acme/app",
                        "path": "app",
                        "commit": "a" * 40,
                        "branch": "main",
                        "cloneURL": "",
                    }
                ],
            },
        }
    )
    world.cache.store(SANDBOX).upsert(
        {
            "metadata": {"name": "origin", "namespace": NAMESPACE, "resourceVersion": "1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    world.cache.store(SECRET).upsert(
        {
            "metadata": {
                "name": naming.token_secret_name("origin"),
                "namespace": NAMESPACE,
                "resourceVersion": "1",
            },
            "stringData": {c.RUNTIME_TOKEN_KEY: "origin-token"},
        }
    )
    world.cache.store(PVC).upsert(
        {
            "metadata": {
                "name": naming.pvc_name(c.WORKSPACE_VOLUME, "origin"),
                "namespace": NAMESPACE,
                "resourceVersion": "1",
            },
            "spec": {"storageClassName": "fast", "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"capacity": {"storage": "2Gi"}},
        }
    )
    world.client.put(STORAGE_CLASS, {"metadata": {"name": "fast"}, "provisioner": DRIVER})
    if snapshot_class:
        world.client.put(VOLUME_SNAPSHOT_CLASS, {"metadata": {"name": "snap"}, "driver": DRIVER})
    else:
        world.client.missing_kinds.add(VOLUME_SNAPSHOT_CLASS.kind)
    return world


def fork(method: str = "Auto", status: dict | None = None):
    spec = {"workspace": {"from": {"environment": "origin", "method": method}}}
    return environment("fork", spec=spec, status=status)


async def test_without_a_snapshot_api_auto_copies_through_the_runtimes() -> None:
    world = origin_world(snapshot_class=False)
    step = CloneStep(world.deps)
    state = new_pass(fork())
    restore = await step.restore(state)
    clone = state.status.clone
    assert clone is not None and clone.method == "Copy" and state.status.clone_method == "Copy"
    assert "no VolumeSnapshot API" in clone.reason
    assert [s.name for s in clone.sources or ()] == ["app"]
    assert restore.data_source is None and restore.storage_class == "fast" and restore.min_size == "2Gi"

    world.runtime(ORIGIN_URL).tree_bytes = 1234
    world.runtime(ORIGIN_URL).baseline = True
    state.status.runtime_url = FORK_URL
    await settle(world, state, lambda: step.finish(state))
    assert state.is_true(c.COND_CLONED) and clone.copied_bytes == 2468 and clone.completed_at is not None
    assert world.runtime(ORIGIN_URL).calls[-1] == f"copy {BASELINE_DIR} -> {FORK_URL}"
    assert world.runtime(FORK_URL).baseline is True
    assert state.status.timings is not None and state.status.timings.cloned is not None
    assert to_patch(state.status)["clone"]["copiedBytes"] == 2468


async def test_method_snapshot_without_a_class_is_snapshot_unsupported() -> None:
    world = origin_world(snapshot_class=False)
    with pytest.raises(StepFailed) as failed:
        await CloneStep(world.deps).restore(new_pass(fork("Snapshot")))
    assert failed.value.code == "SnapshotUnsupported"


def fork_claim(storage: str, *, version: str = "1") -> dict:
    """The fork's workspace claim as the Sandbox controller made it (in the cache)."""
    return {
        "metadata": {
            "name": naming.pvc_name(c.WORKSPACE_VOLUME, "fork"),
            "namespace": NAMESPACE,
            "uid": "uid-fork-claim",
            "resourceVersion": version,
        },
        "spec": {"resources": {"requests": {"storage": storage}}},
        "status": {"phase": "Pending"},
    }


async def test_the_volume_is_claimed_while_the_snapshot_is_cut_and_provisioned_once_ready() -> None:
    world = origin_world(snapshot_class=True)
    step = CloneStep(world.deps)
    state = new_pass(fork())
    restore = await step.restore(state)
    assert world.runtime(ORIGIN_URL).calls == ["flush"]
    assert world.runtime(ORIGIN_URL).token == "origin-token"
    clone = state.status.clone
    assert clone is not None and clone.method == "Snapshot" and clone.snapshot_class_name == "snap"
    snapshot = await world.client.get_live(VOLUME_SNAPSHOT, NAMESPACE, clone.snapshot or "")
    assert snapshot is not None and snapshot["spec"]["volumeSnapshotClassName"] == "snap"
    # Not ready yet, and its restoreSize unknown: the volume is claimed now, as large as the one it is cut
    # from (capacity 2Gi beyond the 1Gi asked for), and the step looks again soon.
    data_source = {"apiGroup": c.SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": clone.snapshot}
    assert (
        restore.data_source == data_source and restore.min_size == "2Gi" and restore.storage_class == "fast"
    )
    assert restore.poll == SNAPSHOT_EARLY_POLL_SECONDS
    assert state.conditions.items()[0].reason == "Snapshotting" and not state.is_true(c.COND_CLONED)

    # The next pass starts from the status written: the decision is not taken again, nor the snapshot cut.
    state = new_pass(fork(status=to_patch(state.finish())))
    assert (await step.restore(state)) == restore
    world.cache.store(PVC).upsert(fork_claim("2Gi"))
    snapshot["status"] = {"readyToUse": True, "restoreSize": "1Gi"}
    state = new_pass(fork(status=to_patch(state.finish())))
    restore = await step.restore(state)
    assert restore.data_source == data_source and restore.min_size == "2Gi" and restore.poll is None
    assert state.conditions.items()[0].reason == "Restoring" and world.runtime(ORIGIN_URL).calls == ["flush"]
    # Ready now: the claim made meanwhile is updated, which wakes csi-provisioner out of its backoff; once.
    claim = await world.client.get_live(PVC, NAMESPACE, naming.pvc_name(c.WORKSPACE_VOLUME, "fork"))
    assert claim is not None
    assert claim["metadata"]["annotations"] == {c.ANNOTATION_SNAPSHOT_READY: clone.snapshot}
    writes = list(world.client.writes)
    state = new_pass(fork(status=to_patch(state.finish())))
    await step.restore(state)
    assert world.client.writes == writes

    await step.finish(state)
    assert state.conditions.items()[0].reason == "SnapshotRestored" and state.is_true(c.COND_CLONED)


async def test_a_snapshot_seen_ready_is_not_read_again_nor_cut_again() -> None:
    """Its restore is under way (or done): a snapshot deleted meanwhile is not taken again of a newer state."""
    world = origin_world(snapshot_class=True)
    step = CloneStep(world.deps)
    state = new_pass(fork())
    await step.restore(state)
    snapshot = await world.client.get_live(VOLUME_SNAPSHOT, NAMESPACE, "fork-fork")
    assert snapshot is not None
    snapshot["status"] = {"readyToUse": True, "restoreSize": "1Gi"}
    state = new_pass(fork(status=to_patch(state.finish())))
    await step.restore(state)
    del world.client.objects[(VOLUME_SNAPSHOT.kind, NAMESPACE, "fork-fork")]
    state = new_pass(fork(status=to_patch(state.finish())))
    restore = await step.restore(state)
    assert restore.min_size == "2Gi" and state.conditions.items()[0].reason == "Restoring"
    assert world.runtime(ORIGIN_URL).calls == ["flush"]
    assert await world.client.get_live(VOLUME_SNAPSHOT, NAMESPACE, "fork-fork") is None


async def test_a_snapshot_ready_at_once_is_restored_without_touching_the_claim() -> None:
    world = origin_world(snapshot_class=True)
    world.client.put(
        VOLUME_SNAPSHOT,
        {
            "metadata": {"name": "fork-fork", "namespace": NAMESPACE},
            "spec": {"source": {"persistentVolumeClaimName": naming.pvc_name(c.WORKSPACE_VOLUME, "origin")}},
            "status": {"readyToUse": True, "restoreSize": "3Gi"},
        },
    )
    step = CloneStep(world.deps)
    state = new_pass(fork())
    restore = await step.restore(state)
    assert restore.min_size == "3Gi" and restore.poll is None
    world.cache.store(PVC).upsert(fork_claim("3Gi"))
    await step.restore(new_pass(fork(status=to_patch(state.finish()))))
    assert not [w for w in world.client.writes if w[1] == PVC.kind]


async def test_a_restore_larger_than_the_claim_makes_the_claim_again() -> None:
    """A driver that does not hold volumes to their size may report a restoreSize beyond it."""
    world = origin_world(snapshot_class=True)
    step = CloneStep(world.deps)
    state = new_pass(fork())
    assert (await step.restore(state)).min_size == "2Gi"
    world.cache.store(PVC).upsert(fork_claim("2Gi"))
    snapshot = await world.client.get_live(VOLUME_SNAPSHOT, NAMESPACE, "fork-fork")
    assert snapshot is not None
    snapshot["status"] = {"readyToUse": True, "restoreSize": "5Gi"}
    # First the Sandbox asks for the size; the claim, which can never be provisioned, goes in the next pass.
    state = new_pass(fork(status=to_patch(state.finish())))
    assert (await step.restore(state)).min_size == "5Gi"
    assert ("delete", PVC.kind, naming.pvc_name(c.WORKSPACE_VOLUME, "fork")) not in world.client.writes
    state = new_pass(fork(status=to_patch(state.finish())))
    assert (await step.restore(state)).min_size == "5Gi"
    assert world.client.writes[-1] == ("delete", PVC.kind, naming.pvc_name(c.WORKSPACE_VOLUME, "fork"))
    # Made again at that size: left alone.
    world.cache.store(PVC).upsert(fork_claim("5Gi", version="2"))
    writes = list(world.client.writes)
    await step.restore(new_pass(fork(status=to_patch(state.finish()))))
    assert world.client.writes == writes


async def test_a_snapshot_of_a_volume_that_is_gone_is_waited_for_before_the_claim() -> None:
    """Nothing to size the restore by: the volume is claimed once the snapshot reports its size."""
    world = origin_world(snapshot_class=True)
    shared = {
        "metadata": {"name": "kept", "namespace": NAMESPACE},
        "spec": {
            "volumeSnapshotClassName": "snap",
            "source": {"persistentVolumeClaimName": "workspace-gone"},
        },
        "status": {"boundVolumeSnapshotContentName": "content-1"},
    }
    world.client.put(VOLUME_SNAPSHOT, shared)
    spec = {"workspace": {"from": {"snapshot": "kept"}}}
    step = CloneStep(world.deps)
    state = new_pass(environment("fork", spec=spec))
    with pytest.raises(StepFailed) as waiting:
        await step.restore(state)
    assert waiting.value.code is None and waiting.value.reason == "Snapshotting"
    assert waiting.value.retry == SNAPSHOT_EARLY_POLL_SECONDS
    shared["status"] = {"readyToUse": True, "restoreSize": "3Gi"}
    state = new_pass(environment("fork", spec=spec, status=to_patch(state.finish())))
    restore = await step.restore(state)
    assert restore.min_size == "3Gi" and restore.data_source is not None


async def test_a_failed_snapshot_fails_the_fork_after_the_claim_was_made() -> None:
    world = origin_world(snapshot_class=True)
    step = CloneStep(world.deps)
    state = new_pass(fork())
    await step.restore(state)
    snapshot = await world.client.get_live(VOLUME_SNAPSHOT, NAMESPACE, "fork-fork")
    assert snapshot is not None
    snapshot["status"] = {"error": {"message": "the driver refused"}}
    with pytest.raises(StepFailed) as failed:
        await step.restore(new_pass(fork(status=to_patch(state.finish()))))
    assert failed.value.code == "SnapshotFailed" and "the driver refused" in failed.value.message


async def test_a_snapshot_is_read_often_in_its_first_seconds_only() -> None:
    world = origin_world(snapshot_class=True)
    step = CloneStep(world.deps)
    state = new_pass(fork())
    assert (await step.restore(state)).poll == SNAPSHOT_EARLY_POLL_SECONDS
    later = new_pass(fork(status=to_patch(state.finish())), now=FIXED_NOW + timedelta(seconds=6))
    assert (await step.restore(later)).poll == SNAPSHOT_POLL_SECONDS


async def test_a_snapshot_that_stays_pending_times_out() -> None:
    world = origin_world(snapshot_class=True)
    status = {
        "clone": {
            "method": "Snapshot",
            "reason": "r",
            "source": "environment/origin",
            "snapshot": "fork-fork",
            "snapshotClassName": "snap",
            "startedAt": "2025-12-31T23:00:00Z",
        }
    }
    world.client.put(
        VOLUME_SNAPSHOT, {"metadata": {"name": "fork-fork", "namespace": NAMESPACE}, "status": {}}
    )
    with pytest.raises(StepFailed) as failed:
        await CloneStep(world.deps).restore(new_pass(fork(status=status)))
    assert failed.value.code == "SnapshotTimeout"


async def test_forking_a_missing_or_unfinished_environment() -> None:
    world = World()
    with pytest.raises(StepFailed) as failed:
        await CloneStep(world.deps).restore(new_pass(fork()))
    assert failed.value.code == "CloneSourceNotFound" and failed.value.retry is None
    world.cache.store(SHADOW_ENVIRONMENT).upsert(
        {"metadata": {"name": "origin", "namespace": NAMESPACE, "resourceVersion": "1"}, "spec": {}}
    )
    with pytest.raises(StepFailed) as failed:
        await CloneStep(world.deps).restore(new_pass(fork()))
    assert failed.value.code is None and failed.value.reason == "WaitingForSource"


async def test_a_snapshot_is_restored_into_the_class_of_the_volume_it_was_cut_from() -> None:
    """The SDK's shared fork snapshot names no class: the clone step decides, as for a single fork."""
    world = origin_world(snapshot_class=True)
    world.client.put(
        STORAGE_CLASS,
        {
            "metadata": {
                "name": "a-default",
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": DRIVER,
        },
    )
    shared = {
        "metadata": {"name": "origin-fork-1", "namespace": NAMESPACE},
        "spec": {
            "volumeSnapshotClassName": "snap",
            "source": {"persistentVolumeClaimName": naming.pvc_name(c.WORKSPACE_VOLUME, "origin")},
        },
        "status": {"readyToUse": True, "restoreSize": "2Gi"},
    }
    world.client.put(VOLUME_SNAPSHOT, shared)
    env = environment("fork", spec={"workspace": {"from": {"snapshot": "origin-fork-1"}}})
    restore = await CloneStep(world.deps).restore(new_pass(env))
    assert restore.storage_class == "fast" and restore.min_size == "2Gi"
    # Once the source volume is gone, a class of the snapshot's driver, the default one first.
    world.cache.store(PVC).remove(NAMESPACE, naming.pvc_name(c.WORKSPACE_VOLUME, "origin"))
    restore = await CloneStep(world.deps).restore(new_pass(env))
    assert restore.storage_class == "a-default"
