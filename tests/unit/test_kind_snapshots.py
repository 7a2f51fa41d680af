"""The kind manifests for snapshot-capable storage (hack/kind/snapshots): valid Kubernetes 1.34 objects that
agree with each other and with the driver and images they name.

The VolumeSnapshotClass is checked against its CRD on a real API server in
tests/integration/test_csi_hostpath.py (the CRDs come from the Go module cache).
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tests.support.snapshots import DRIVER_NAME, REPO_ROOT, manifest_placeholders, render_kind_manifests

pytestmark = pytest.mark.unit

KUBERNETES_VERSION = "1.34.0"


def docs() -> list[dict[str, Any]]:
    return render_kind_manifests(
        {name: f"registry.test/{name.lower()}:v0" for name in manifest_placeholders()}
    )


def one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_built_in_objects_are_valid_for_kubernetes_1_34() -> None:
    for doc in docs():
        if doc["apiVersion"].startswith("snapshot.storage.k8s.io/"):
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")


def test_every_image_is_one_that_hack_images_sh_builds() -> None:
    images_sh = (REPO_ROOT / "hack" / "images.sh").read_text()
    assert manifest_placeholders() == {
        "SNAPSHOT_CONTROLLER",
        "CSI_SNAPSHOTTER",
        "CSI_PROVISIONER",
        "CSI_HOSTPATH",
    }
    for name in manifest_placeholders():
        assert name.lower().replace("_", "-") in images_sh


def test_the_classes_name_the_driver_and_are_not_defaults() -> None:
    assert one("CSIDriver", DRIVER_NAME)["spec"]["attachRequired"] is False
    storage_class = one("StorageClass", "shadow-snapshots")
    assert storage_class["provisioner"] == DRIVER_NAME
    assert "storageclass.kubernetes.io/is-default-class" not in storage_class["metadata"].get(
        "annotations", {}
    )
    snapshot_class = one("VolumeSnapshotClass", "shadow-snapshots")
    assert snapshot_class["driver"] == DRIVER_NAME
    assert "snapshot.storage.kubernetes.io/is-default-class" not in snapshot_class["metadata"].get(
        "annotations", {}
    )


def test_the_driver_registers_where_the_kubelet_looks() -> None:
    pod = one("DaemonSet", "csi-hostpath")["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    containers = {c["name"]: c for c in pod["containers"]}
    args = dict(arg.removeprefix("--").split("=", 1) for arg in containers["driver"]["args"])
    mounts = {m["name"]: m for m in containers["driver"]["volumeMounts"]}
    # The kubelet's plugin watcher scans plugins_registry; the socket it is told about is on the node.
    assert volumes["registration-dir"] == "/var/lib/kubelet/plugins_registry"
    assert mounts["registration-dir"]["mountPath"] == args["registration-dir"]
    socket_dir = volumes["socket-dir"]
    assert socket_dir == f"/var/lib/kubelet/plugins/{DRIVER_NAME}"
    assert args["kubelet-registration-path"] == f"{socket_dir}/csi.sock"
    assert args["endpoint"] == f"unix://{mounts['socket-dir']['mountPath']}/csi.sock"
    # Bind mounts made in the container must reach the kubelet's view of pod volumes.
    assert volumes["pods-dir"] == "/var/lib/kubelet/pods"
    assert mounts["pods-dir"]["mountPropagation"] == "Bidirectional"
    assert containers["driver"]["securityContext"]["privileged"] is True
    for sidecar in ("csi-provisioner", "csi-snapshotter"):
        assert "--csi-address=/csi/csi.sock" in containers[sidecar]["args"]
        assert "--leader-election" in containers[sidecar]["args"]
