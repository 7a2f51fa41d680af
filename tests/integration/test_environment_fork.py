"""Forks (spec.workspace.from) on the local control plane, with the VolumeSnapshot CRDs installed.

kwok plays the kubelet, so no Pod runs: one real sandbox-runtime on loopback answers for every workspace
(SHADOW_RUNTIME_API_URL), and the sources really are snapshotted by git in it. No snapshot controller or CSI
driver runs either, so a VolumeSnapshot the operator takes is never cut: that is the "never hang" case.
What is checked here is the operator's side: the method chosen and why, the VolumeSnapshot it writes and who
owns it, the timeout, the copy through the runtimes and the errors. The kind e2e tests (tests/e2e/
test_fork.py) check the files in real, separate volumes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from shadow_operator.api import constants as c
from shadow_operator.sdk import cleanup, kube

from tests.runtime.conftest import Server
from tests.support.controlplane import wait_for
from tests.support.sandbox_operator import (
    ENVIRONMENT,
    SANDBOX,
    TEMPLATE,
    Objects,
    apply_crds,
    condition,
    in_process_operator,
    install_crds,
    template_body,
)
from tests.support.snapshots import crd_dir, missing, require, snapshot_crds
from tests.support.volumes import bind_volumes

pytestmark = pytest.mark.integration
V = "v1alpha1"
SNAP = ("snapshot.storage.k8s.io", "v1")
CSI_DRIVER = "csi.example.com"  # a StorageClass of this provisioner has a VolumeSnapshotClass
PLAIN_PROVISIONER = "example.com/no-snapshots"


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient, runtime: Server) -> Iterator[Any]:
    require(missing(crd_dir()))
    install_crds(k8s_api)
    apply_crds(k8s_api, snapshot_crds())
    storage = client.StorageV1Api(k8s_api)
    custom = client.CustomObjectsApi(k8s_api)
    for name, provisioner in (("csi", CSI_DRIVER), ("plain", PLAIN_PROVISIONER)):
        try:
            storage.create_storage_class(
                {
                    "metadata": {"name": f"fork-{name}"},
                    "provisioner": provisioner,
                    "volumeBindingMode": "Immediate",
                }
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
    try:
        custom.create_cluster_custom_object(
            *SNAP,
            "volumesnapshotclasses",
            {
                "apiVersion": "snapshot.storage.k8s.io/v1",
                "kind": "VolumeSnapshotClass",
                "metadata": {"name": "fork-csi-snapshots"},
                "driver": CSI_DRIVER,
                "deletionPolicy": "Delete",
            },
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
    with in_process_operator(SHADOW_RUNTIME_API_URL=runtime.url) as runner:
        yield runner


def env_body(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "gitea": {"enabled": False},
            "verify": {"enabled": False},
            "workspace": {"size": "1Gi"},
            **spec,
        },
    }


def source_env(
    objs: Objects, runtime: Server, name: str, storage_class: str, tmp_path: Path
) -> dict[str, Any]:
    """An environment with one uploaded source, its sources in (copy-in ran git in the loopback runtime)."""
    bind_volumes(objs, [f"workspace-{name}"], tmp_path, storage_class=storage_class)
    objs.create(
        ENVIRONMENT,
        env_body(
            name,
            sources=[{"name": "core", "repo": "shadow/core", "upload": {}}],
            workspace={"size": "1Gi", "storageClassName": storage_class},
        ),
        version=V,
    )
    objs.wait_condition(
        ENVIRONMENT, name, "False", "WaitingForUpload", type_="SourcesReady", timeout=60, version=V
    )
    core = runtime.root / "core"
    core.mkdir(exist_ok=True)
    (core / "main.py").write_text("print('uncommitted work')\n")
    objs.custom.patch_namespaced_custom_object(
        "shadow.dev", V, objs.namespace, "shadowenvironments", name,
        {"metadata": {"annotations": {c.ANNOTATION_UPLOAD_PREFIX + "core": "sha256:test"}}},
    )  # fmt: skip
    return objs.wait_condition(ENVIRONMENT, name, type_="SourcesReady", timeout=60, version=V)


def snapshots(objs: Objects) -> dict[str, dict[str, Any]]:
    items = objs.custom.list_namespaced_custom_object(*SNAP, objs.namespace, "volumesnapshots")["items"]
    return {s["metadata"]["name"]: s for s in items}


def failure(objs: Objects, name: str, code: str, timeout: float = 60) -> dict[str, Any]:
    return objs.wait(
        ENVIRONMENT,
        name,
        lambda o: ((o.get("status") or {}).get("failure") or {}).get("code") == code,
        timeout=timeout,
        what=f"{name} to fail with {code}",
        version=V,
    )


def test_fork_by_snapshot_owns_its_snapshot_and_times_out(
    objs: Objects, runtime: Server, k8s_api: client.ApiClient, tmp_path: Path
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    source_env(objs, runtime, "src", "fork-csi", tmp_path)

    fork = objs.create(
        ENVIRONMENT,
        env_body("f1", workspace={"from": {"environment": "src", "timeoutSeconds": 10}}),
        version=V,
    )
    env = objs.wait(
        ENVIRONMENT, "f1", lambda o: condition(o, "Cloned").get("reason") == "Snapshotting", version=V
    )
    assert env["status"]["cloneMethod"] == "Snapshot"
    assert (
        env["status"]["clone"]["reason"]
        == f"VolumeSnapshotClass fork-csi-snapshots serves the volume's driver {CSI_DRIVER}"
    )
    assert env["status"]["clone"]["sources"] == [{"name": "core", "repo": "shadow/core", "path": "core"}]

    snap = snapshots(objs)["f1-fork"]
    assert snap["spec"] == {
        "source": {"persistentVolumeClaimName": "workspace-src"},
        "volumeSnapshotClassName": "fork-csi-snapshots",
    }
    owner = snap["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "ShadowEnvironment", "f1", fork["metadata"]["uid"], True,
    )  # fmt: skip
    labels = snap["metadata"]["labels"]
    assert labels[c.LABEL_ENVIRONMENT] == "f1" and labels[c.LABEL_SNAPSHOT_OF] == "src"
    assert json.loads(snap["metadata"]["annotations"][c.ANNOTATION_SNAPSHOT_SOURCES]) == [
        {"name": "core", "repo": "shadow/core", "path": "core"}
    ]
    # No snapshot controller here: after timeoutSeconds the fork fails with a code instead of hanging.
    env = failure(objs, "f1", "SnapshotTimeout", timeout=30)
    assert "f1-fork was not ready to use 10s after it was requested" in env["status"]["failure"]["message"]
    assert condition(env, "Ready")["status"] == "False"
    src = objs.get(ENVIRONMENT, "src", V)
    assert src is not None and condition(src, "Ready")["status"] == "True"  # the source keeps running

    # Owned: deleting the fork deletes its snapshot (garbage collection).
    objs.custom.delete_namespaced_custom_object("shadow.dev", V, objs.namespace, "shadowenvironments", "f1")
    wait_for(lambda: "f1-fork" not in snapshots(objs), timeout=60, what="the fork's VolumeSnapshot to go")


def test_fork_volume_is_claimed_while_the_snapshot_is_cut(
    objs: Objects, runtime: Server, tmp_path: Path
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    source_env(objs, runtime, "src", "fork-csi", tmp_path)
    objs.create(ENVIRONMENT, env_body("f4", workspace={"from": {"environment": "src"}}), version=V)

    # The Sandbox (so its claim and Pod) is made while the snapshot is cut: restored from it, and as large
    # as the volume it is cut from (its PersistentVolume has 10Gi; restoreSize is not known yet).
    sandbox = objs.wait(SANDBOX, "f4", lambda _: True, what="the fork's Sandbox")
    # The pass writes the status after it made the Sandbox: a read at once may see it without Cloned yet.
    objs.wait(ENVIRONMENT, "f4", lambda o: condition(o, "Cloned").get("reason") == "Snapshotting", version=V)
    assert "f4-fork" in snapshots(objs) and "readyToUse" not in (
        snapshots(objs)["f4-fork"].get("status") or {}
    )
    claim = sandbox["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["dataSource"] == {"apiGroup": SNAP[0], "kind": "VolumeSnapshot", "name": "f4-fork"}
    assert claim["resources"]["requests"]["storage"] == "10Gi"

    # Cut (there is no snapshot controller here: the test says so): csi-provisioner is woken for the claim.
    objs.custom.patch_namespaced_custom_object_status(
        *SNAP,
        objs.namespace,
        "volumesnapshots",
        "f4-fork",
        {"status": {"readyToUse": True, "restoreSize": "1Gi"}},
    )
    wait_for(
        lambda: (objs.core.read_namespaced_persistent_volume_claim("workspace-f4", objs.namespace).metadata.annotations
                 or {}).get(c.ANNOTATION_SNAPSHOT_READY) == "f4-fork",
        timeout=30,
        what="the fork's claim to be annotated",
    )  # fmt: skip

    # Restored (a volume bound to the claim), the Pod runs: Cloned is written as soon as it is known, in a
    # status of its own, before the copy-in that follows it (for a fork: a snapshot of its sources).
    rv = objs.custom.get_namespaced_custom_object(
        "shadow.dev", V, objs.namespace, "shadowenvironments", "f4"
    )["metadata"]["resourceVersion"]
    bind_volumes(objs, ["workspace-f4"], tmp_path, storage_class="fork-csi")
    seen: list[tuple[str | None, str | None]] = []
    # Every change from the bind on, in order: the watch is re-opened from the last version it saw should the
    # API server end it early. Seconds on a quiet machine; generous for a loaded one (CI builds beside the tests).
    deadline = time.monotonic() + 200
    ready = False
    while not ready and (left := deadline - time.monotonic()) > 0:
        for event in watch.Watch().stream(
            objs.custom.list_namespaced_custom_object, "shadow.dev", V, objs.namespace, "shadowenvironments",
            field_selector="metadata.name=f4", resource_version=rv, timeout_seconds=max(1, int(left)),
        ):  # fmt: skip
            obj = event["object"]
            rv = obj["metadata"]["resourceVersion"]
            seen.append(
                (condition(obj, "Cloned").get("status"), condition(obj, "SourcesReady").get("status"))
            )
            if ready := condition(obj, "Ready").get("status") == "True":
                break
    assert ready, f"the fork was not Ready in 200 s; its conditions went (Cloned, SourcesReady): {seen}"
    assert seen[-1] == ("True", "True")
    assert any(cloned == "True" and sources != "True" for cloned, sources in seen), seen
    env = objs.get(ENVIRONMENT, "f4", V)
    assert env is not None and condition(env, "Cloned")["reason"] == "SnapshotRestored"
    assert env["status"]["clone"]["restoreSize"] == "10Gi"


def test_retained_snapshot_outlives_the_fork_and_cleanup_finds_it(
    objs: Objects, runtime: Server, kubeconfig: str, tmp_path: Path
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    source_env(objs, runtime, "src", "fork-csi", tmp_path)
    objs.create(
        ENVIRONMENT,
        env_body(
            "keep", workspace={"from": {"environment": "src", "retainSnapshot": True, "timeoutSeconds": 10}}
        ),
        version=V,
    )
    wait_for(lambda: "keep-fork" in snapshots(objs), timeout=60, what="the retained snapshot")
    assert not snapshots(objs)["keep-fork"]["metadata"].get("ownerReferences")
    objs.custom.delete_namespaced_custom_object("shadow.dev", V, objs.namespace, "shadowenvironments", "keep")
    wait_for(lambda: objs.get(ENVIRONMENT, "keep", V) is None, timeout=60, what="the fork to go")
    assert "keep-fork" in snapshots(objs)

    with kube.connect() as http:
        orphans = kube.run(http, cleanup.find(objs.namespace))
    assert [(o.kind, o.name, o.environment) for o in orphans] == [("VolumeSnapshot", "keep-fork", "keep")]


def test_fork_copies_where_no_snapshot_class_serves_the_volume(
    objs: Objects, runtime: Server, tmp_path: Path
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    source_env(objs, runtime, "src", "fork-plain", tmp_path)
    bind_volumes(objs, ["workspace-f2"], tmp_path, storage_class="fork-plain")
    objs.create(ENVIRONMENT, env_body("f2", workspace={"from": {"environment": "src"}}), version=V)

    env = objs.wait_condition(ENVIRONMENT, "f2", timeout=90, version=V)
    assert env["status"]["cloneMethod"] == "Copy"
    assert env["status"]["clone"]["reason"] == (
        f"no VolumeSnapshotClass serves the volume's driver {PLAIN_PROVISIONER}: copying through the runtimes"
    )
    cloned = condition(env, "Cloned")
    assert (cloned["status"], cloned["reason"]) == ("True", "Copied")
    assert env["status"]["clone"]["copiedBytes"] > 0 and env["status"]["clone"]["completedAt"]
    assert env["status"]["clone"]["storageClassName"] == "fork-plain"
    assert condition(env, "SourcesReady")["message"].endswith("the diff baseline came with the clone")
    assert [s["name"] for s in env["status"]["sources"]] == ["core"]
    assert not snapshots(objs)
    claim = objs.core.read_namespaced_persistent_volume_claim("workspace-f2", objs.namespace)
    assert claim.spec.data_source is None and claim.spec.storage_class_name == "fork-plain"

    # Forcing a snapshot where none can be taken fails with a code that says what to do.
    objs.create(
        ENVIRONMENT,
        env_body("f3", workspace={"from": {"environment": "src", "method": "Snapshot"}}),
        version=V,
    )
    env = failure(objs, "f3", "SnapshotUnsupported")
    assert "install a VolumeSnapshotClass" in env["status"]["failure"]["message"]


def test_fork_of_what_does_not_exist(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    objs.create(ENVIRONMENT, env_body("orphan", workspace={"from": {"environment": "nowhere"}}), version=V)
    env = failure(objs, "orphan", "CloneSourceNotFound")
    assert "environment 'nowhere' does not exist" in env["status"]["failure"]["message"]
    objs.create(
        ENVIRONMENT, env_body("lost", workspace={"from": {"snapshot": "no-such-snapshot"}}), version=V
    )
    env = failure(objs, "lost", "CloneSourceNotFound")
    assert "VolumeSnapshot 'no-such-snapshot' does not exist" in env["status"]["failure"]["message"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"workspace": {}}, "spec.sources is required unless spec.workspace.from"),
        ({"workspace": {"from": {}}}, "workspace.from needs exactly one of environment"),
        (
            {"workspace": {"from": {"environment": "a", "snapshot": "b"}}},
            "workspace.from needs exactly one of",
        ),
        ({"workspace": {"from": {"snapshot": "b", "method": "Copy"}}}, "method Copy needs from.environment"),
        ({"workspace": {"from": {"environment": "a", "timeoutSeconds": 1}}}, "timeoutSeconds"),
    ],
)
def test_admission_rejects_bad_forks(objs: Objects, spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiException) as raised:
        objs.create(ENVIRONMENT, {"metadata": {"name": "bad"}, "spec": spec}, version=V)
    assert raised.value.status == 422 and message in str(raised.value.body)
