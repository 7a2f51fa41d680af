"""Forks' pure parts: the snapshot class choice, the VolumeSnapshot manifest and state, the restored volume of
the workspace Sandbox, and the fork manifest the SDK builds."""

from __future__ import annotations

import json
from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.common import snapshots
from shadow_operator.common.sources import plan_sources
from shadow_operator.resources import environment as res
from shadow_operator.sdk import fork as forkops

from tests.unit.test_resources_environment import environment, template

pytestmark = pytest.mark.unit


def klass(name: str, driver: str, default: bool = False) -> dict[str, Any]:
    annotations = {snapshots.DEFAULT_CLASS_ANNOTATION: "true"} if default else {}
    return {"metadata": {"name": name, "annotations": annotations}, "driver": driver}


def test_choose_class_prefers_the_drivers_default_then_the_first_by_name() -> None:
    classes = [klass("z-other", "b.csi"), klass("b-snap", "a.csi"), klass("a-snap", "a.csi")]
    assert snapshots.choose_class("a.csi", classes).name == "a-snap"
    assert (
        snapshots.choose_class("a.csi", [*classes, klass("m-default", "a.csi", default=True)]).name
        == "m-default"
    )
    # A default of another driver does not count.
    assert (
        snapshots.choose_class("a.csi", [*classes, klass("default-b", "b.csi", default=True)]).name
        == "a-snap"
    )
    choice = snapshots.choose_class("a.csi", classes)
    assert choice.reason == "VolumeSnapshotClass a-snap serves the volume's driver a.csi"


@pytest.mark.parametrize(
    ("driver", "classes", "installed", "reason"),
    [
        ("c.csi", [klass("a", "a.csi")], True, "no VolumeSnapshotClass serves the volume's driver c.csi"),
        (None, [klass("a", "a.csi")], True, "the source volume has no known provisioner"),
        ("a.csi", [], False, "the cluster has no VolumeSnapshot API"),
    ],
)
def test_choose_class_says_why_there_is_none(
    driver: str | None, classes: list[dict[str, Any]], installed: bool, reason: str
) -> None:
    choice = snapshots.choose_class(driver, classes, api_installed=installed)
    assert choice.name is None and choice.reason.startswith(reason)


def drive(plan: Any, answers: dict[Any, Any]) -> tuple[Any, list[Any]]:
    """Run a snapshot plan (common/snapshots.choose, cut) on fixed answers: its result and the steps it took."""
    taken: list[Any] = []
    try:
        step = next(plan)
        while True:
            taken.append(step)
            key = step.name if isinstance(step, snapshots.ReadStorageClass) else type(step)
            step = plan.send(answers.get(key))
    except StopIteration as done:
        return done.value, taken


def test_the_snapshot_plan_both_sides_drive() -> None:
    storage = {"fast": {"provisioner": "a.csi"}, "other": {"provisioner": "b.csi"}}
    listed = {**storage, snapshots.ListSnapshotClasses: [klass("a-snap", "a.csi")]}
    choice, taken = drive(snapshots.choose("fast"), listed)
    assert choice.name == "a-snap"
    assert taken == [snapshots.ReadStorageClass("fast"), snapshots.ListSnapshotClasses()]
    # Restored into a class of another driver: no class, and the snapshot classes are not even listed.
    choice, taken = drive(snapshots.choose("fast", "other"), listed)
    assert choice.name is None and "another driver" in choice.reason and len(taken) == 2
    # No VolumeSnapshot API (the driver answers None).
    choice, _ = drive(snapshots.choose("fast"), storage)
    assert choice.name is None and choice.reason.startswith("the cluster has no VolumeSnapshot API")
    args = {"name": "s", "namespace": "ns", "pvc": "ws", "class_name": "a-snap", "environment": "e"}
    created, taken = drive(snapshots.cut(flush=True, snapshot_of="e", **args), {snapshots.Create: {"ok": 1}})
    assert created == {"ok": 1} and isinstance(taken[0], snapshots.Flush)
    assert taken[1].manifest["spec"]["source"] == {"persistentVolumeClaimName": "ws"}
    _, taken = drive(snapshots.cut(flush=False, snapshot_of="e", **args), {})
    assert [type(t) for t in taken] == [snapshots.Create]


def test_volume_driver_is_the_provisioner_of_the_claims_class() -> None:
    assert snapshots.volume_driver({"provisioner": "a.csi"}) == "a.csi"
    assert snapshots.volume_driver(None) is None


def test_volume_snapshot_manifest_and_the_sources_it_records() -> None:
    sources = [{"name": "core", "repo": "shadow/core", "path": "core", "commit": "abc"}]
    vs = snapshots.build_volume_snapshot(
        name="f1-fork",
        namespace="team",
        pvc="workspace-src",
        class_name="snaps",
        environment="f1",
        snapshot_of="src",
        sources=sources,
    )
    assert vs["spec"] == {
        "volumeSnapshotClassName": "snaps",
        "source": {"persistentVolumeClaimName": "workspace-src"},
    }
    labels = vs["metadata"]["labels"]
    assert labels[c.LABEL_ENVIRONMENT] == "f1" and labels[c.LABEL_SNAPSHOT_OF] == "src"
    assert labels[c.LABEL_COMPONENT] == c.COMPONENT_SNAPSHOT
    recorded = vs["metadata"]["annotations"][c.ANNOTATION_SNAPSHOT_SOURCES]
    assert json.loads(recorded) == [{"name": "core", "repo": "shadow/core", "path": "core"}]
    assert snapshots.parse_sources_annotation(recorded) == [
        {"name": "core", "repo": "shadow/core", "path": "core"}
    ]
    # A Sandbox's snapshot belongs to no environment.
    plain = snapshots.build_volume_snapshot(
        name="s",
        namespace="team",
        pvc="workspace-sbx",
        class_name="snaps",
        environment=None,
        snapshot_of="sbx",
    )
    assert c.LABEL_ENVIRONMENT not in plain["metadata"]["labels"] and not plain["metadata"]["annotations"]


@pytest.mark.parametrize(
    "value", [None, "", "not json", "{}", '[{"name": 1}]', '[{"name": "a", "repo": "b"}]']
)
def test_foreign_sources_annotations_are_ignored(value: str | None) -> None:
    assert snapshots.parse_sources_annotation(value) is None


@pytest.mark.parametrize(
    ("status", "phase"),
    [
        ({}, "Pending"),
        ({"readyToUse": False, "boundVolumeSnapshotContentName": "x"}, "Pending"),
        ({"readyToUse": True, "restoreSize": "1Gi"}, "Ready"),
        ({"error": {"message": "driver refused"}}, "Failed"),
        # An error after the content exists is the sidecar retrying: keep waiting (the timeout decides).
        ({"error": {"message": "transient"}, "boundVolumeSnapshotContentName": "x"}, "Pending"),
    ],
)
def test_snapshot_state(status: dict[str, Any], phase: str) -> None:
    assert snapshots.snapshot_state({"status": status})[0] == phase


def test_restored_workspace_volume() -> None:
    env = environment()
    sandbox = res.build_workspace_sandbox(
        env,
        template(),
        gitea_base_url=None,
        data_source=snapshots.data_source("demo-fork"),
        storage_class="snaps",
        min_size="20Gi",
    )
    vct = next(
        t for t in sandbox["spec"]["volumeClaimTemplates"] if t["metadata"]["name"] == c.WORKSPACE_VOLUME
    )
    assert vct["spec"]["dataSource"] == {
        "apiGroup": "snapshot.storage.k8s.io",
        "kind": "VolumeSnapshot",
        "name": "demo-fork",
    }
    assert vct["spec"]["storageClassName"] == "snaps"
    assert vct["spec"]["resources"]["requests"]["storage"] == "20Gi"  # the snapshot is larger than spec.size
    # The kubelet must not rewrite every restored file's group and mode on mount.
    assert (
        sandbox["spec"]["podTemplate"]["spec"]["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    )
    smaller = res.build_workspace_sandbox(env, template(), gitea_base_url=None, min_size="1Mi")
    vct = next(
        t for t in smaller["spec"]["volumeClaimTemplates"] if t["metadata"]["name"] == c.WORKSPACE_VOLUME
    )
    assert vct["spec"]["resources"]["requests"]["storage"] == env["spec"].get("workspace", {}).get(
        "size", "10Gi"
    )
    assert "dataSource" not in vct["spec"]


@pytest.mark.parametrize(
    ("quantity", "size"),
    [("10Gi", 10 * 1024**3), ("1.5G", 1.5e9), ("500M", 5e8), ("1024", 1024.0), ("2Ki", 2048)],
)
def test_parse_quantity(quantity: str, size: float) -> None:
    assert res.parse_quantity(quantity) == size


def test_inherited_sources_are_planned_like_uploads() -> None:
    env = environment()
    del env["spec"]["sources"]
    plans = plan_sources(env, [{"name": "core", "repo": "microsoft/core", "path": "src/core"}])
    assert [(p.name, p.org, p.repo, p.path, p.upload) for p in plans] == [
        ("core", "microsoft", "core", "src/core", True)
    ]


def test_fork_manifest_keeps_what_makes_the_clone_behave_like_its_source() -> None:
    source = environment(
        workspace={"mountPath": "/home/me/src", "size": "5Gi", "storageClassName": "snaps"},
        gitRewrites=[{"from": "https://github.com/microsoft/", "to": "microsoft"}],
        template="custom",
        runtimeClassName="gvisor",
    )
    source["metadata"]["annotations"] = {
        "local.shadow.dev/core": "/home/me/src/core",
        c.ANNOTATION_PREVIEW_ACCESS: "private",
        c.ANNOTATION_UPLOAD_PREFIX + "core": "sha256:1",
        c.ANNOTATION_VERIFY_REQUEST: "now",
    }
    fork = forkops.build_fork(
        source, "demo-1", method="Copy", timeout_seconds=60, retain_snapshot=True, verify=False
    )
    spec = fork["spec"]
    assert "sources" not in spec  # they come with the clone
    assert spec["workspace"] == {
        "mountPath": "/home/me/src",
        "size": "5Gi",
        "from": {"environment": "demo", "method": "Copy", "timeoutSeconds": 60, "retainSnapshot": True},
    }
    assert spec["gitRewrites"] == source["spec"]["gitRewrites"] and spec["template"] == "custom"
    assert spec["runtimeClassName"] == "gvisor"  # a fork of a gVisor workspace runs under gVisor too
    assert spec["verify"]["enabled"] is False
    # Where promote writes, and who may see previews, carry over; upload and verify requests do not.
    assert fork["metadata"]["annotations"] == {
        "local.shadow.dev/core": "/home/me/src/core",
        c.ANNOTATION_PREVIEW_ACCESS: "private",
    }
    assert fork["metadata"]["namespace"] == "team"


def test_fork_manifest_restoring_a_shared_snapshot() -> None:
    fork = forkops.build_fork(environment(), "demo-2", snapshot="demo-fork-1", storage_class="snaps")
    assert fork["spec"]["workspace"]["from"] == {"snapshot": "demo-fork-1"}
    assert fork["spec"]["workspace"]["storageClassName"] == "snaps"
