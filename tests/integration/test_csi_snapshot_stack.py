"""VolumeSnapshots end to end on the local control plane: the pinned snapshot-controller, csi-provisioner and
csi-snapshotter (hack/build-tools.sh snapshots) against the project's CSI driver, with the VolumeSnapshot
CRDs and the kind manifests' StorageClass and VolumeSnapshotClass.

What the kind cluster will do, minus pods: a claim is provisioned, snapshotted (readyToUse), restored into a
new claim and cloned from the claim; each is an independent copy; deleting claims and snapshots removes their
directories. The controllers run as processes, each with a token of the kind manifests' service account, so
the manifests' RBAC (leader election included) is what lets them work. No kubelet is involved, so the
provisioner is not asked for topology (kind's kubelet registers the driver's topology; here nothing does).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from tests.support.controlplane import absent, wait_for
from tests.support.sandbox_operator import apply_crds
from tests.support.snapshots import (
    build_driver,
    crd_dir,
    manifest_placeholders,
    missing,
    render_kind_manifests,
    require,
    running_driver,
    snapshot_crds,
    snapshots_tool,
)

# Its own tier: the three controllers it runs take 15-35 min to build cold (make snapshot-test).
pytestmark = pytest.mark.storage

CLASS = "shadow-snapshots"
SNAPSHOTS = ("snapshot.storage.k8s.io/v1", "VolumeSnapshot")


@pytest.fixture(scope="module")
def stack(
    k8s_api: client.ApiClient, kubeconfig: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """Driver, sidecars and snapshot controller running; yields the driver's state directory."""
    tools = [snapshots_tool(name) for name in ("snapshot-controller", "csi-provisioner", "csi-snapshotter")]
    require(missing(crd_dir(), *tools))
    apply_crds(k8s_api, snapshot_crds())
    api = dynamic.DynamicClient(k8s_api)
    created = []
    for doc in deployment_objects():
        resource = api.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        try:
            resource.create(body=doc, namespace=doc["metadata"].get("namespace"))
            created.append((resource, doc))
        except ApiException as exc:
            if exc.status != 409:
                raise
    work = tmp_path_factory.mktemp("snapshot-stack")
    build_driver(work / "csi-hostpath")
    procs: list[subprocess.Popen[bytes]] = []
    with running_driver(work / "csi-hostpath", work) as socket:
        controller, provisioner, snapshotter = tools
        as_controller = service_account_kubeconfig(k8s_api, kubeconfig, "snapshot-controller", work)
        as_driver = service_account_kubeconfig(k8s_api, kubeconfig, "csi-hostpath", work)
        # The manifests' own flags, with this machine's kubeconfigs and socket.
        args = manifest_args()
        csi_address = f"--csi-address={socket}"
        commands = {
            "snapshot-controller": [
                str(controller),
                *args["snapshot-controller"],
                f"--kubeconfig={as_controller}",
            ],
            "csi-provisioner": [
                str(provisioner),
                *args["csi-provisioner"],
                csi_address,
                f"--kubeconfig={as_driver}",
                "--immediate-topology=false",
            ],
            "csi-snapshotter": [
                str(snapshotter),
                *args["csi-snapshotter"],
                csi_address,
                f"--kubeconfig={as_driver}",
            ],
        }
        try:
            for name, command in commands.items():
                with (work / f"{name}.log").open("wb") as log:
                    procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
            yield work / "state"
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=30)
            for resource, doc in reversed(created):
                resource.delete(name=doc["metadata"]["name"], namespace=doc["metadata"].get("namespace"))


# From the kind manifests: what the controllers need to run as their service accounts, and the classes.
DEPLOYED_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "CSIDriver",
    "StorageClass",
    "VolumeSnapshotClass",
}


def deployment_objects() -> list[dict[str, Any]]:
    """The kind manifests' objects but the workloads (their images do not matter here)."""
    docs = render_kind_manifests({name: "unused" for name in manifest_placeholders()})
    return [d for d in docs if d["kind"] in DEPLOYED_KINDS]


def manifest_args() -> dict[str, list[str]]:
    """Each controller container's args in the kind manifests, but the CSI socket's address."""
    docs = render_kind_manifests({name: "unused" for name in manifest_placeholders()})
    args = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "DaemonSet"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                args[container["name"]] = [
                    a for a in container.get("args", []) if not a.startswith("--csi-address=")
                ]
    return args


def service_account_kubeconfig(
    api: client.ApiClient, admin_kubeconfig: str, name: str, directory: Path
) -> Path:
    """A kubeconfig for the API server of `admin_kubeconfig` with a token of kube-system/`name`."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    token = (
        client.CoreV1Api(api)
        .create_namespaced_service_account_token(name, "kube-system", request)
        .status.token
    )
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    path = directory / f"{name}.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": name, "user": {"token": token}}],
                "contexts": [{"name": name, "context": {"cluster": cluster["name"], "user": name}}],
                "current-context": name,
            }
        )
    )
    path.chmod(0o600)
    return path


def claim(name: str, source: dict[str, str] | None = None) -> client.V1PersistentVolumeClaim:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": CLASS,
        "resources": {"requests": {"storage": "1Mi"}},
    }
    if source:
        spec["dataSource"] = source
    return client.V1PersistentVolumeClaim(metadata=client.V1ObjectMeta(name=name), spec=spec)


def bound_volume_dir(core: client.CoreV1Api, namespace: str, name: str, state: Path) -> Path:
    """Wait until the claim is Bound; the directory of its volume on the 'node'."""

    def bound() -> bool:
        return core.read_namespaced_persistent_volume_claim(name, namespace).status.phase == "Bound"

    wait_for(bound, timeout=90, what=f"claim {name} to be bound")
    pv = core.read_persistent_volume(
        core.read_namespaced_persistent_volume_claim(name, namespace).spec.volume_name
    )
    return state / "volumes" / pv.spec.csi.volume_handle / "data"


def test_snapshot_restore_and_clone(stack: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    snapshots = dynamic.DynamicClient(k8s_api).resources.get(api_version=SNAPSHOTS[0], kind=SNAPSHOTS[1])

    core.create_namespaced_persistent_volume_claim(namespace, claim("source"))
    source_dir = bound_volume_dir(core, namespace, "source", stack)
    (source_dir / "work.txt").write_text("uncommitted work\n")

    snapshots.create(
        namespace=namespace,
        body={
            "apiVersion": SNAPSHOTS[0],
            "kind": SNAPSHOTS[1],
            "metadata": {"name": "baseline"},
            "spec": {"volumeSnapshotClassName": CLASS, "source": {"persistentVolumeClaimName": "source"}},
        },
    )

    def ready() -> bool:
        status = snapshots.get(name="baseline", namespace=namespace).to_dict().get("status") or {}
        return bool(status.get("readyToUse"))

    wait_for(ready, timeout=90, what="VolumeSnapshot baseline to be readyToUse")
    status = snapshots.get(name="baseline", namespace=namespace).to_dict()["status"]
    content_name = status["boundVolumeSnapshotContentName"]
    (source_dir / "work.txt").write_text("changed after the snapshot\n")

    for name in ("fork-1", "fork-2"):
        source = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "baseline"}
        core.create_namespaced_persistent_volume_claim(namespace, claim(name, source))
    core.create_namespaced_persistent_volume_claim(
        namespace, claim("clone", {"kind": "PersistentVolumeClaim", "name": "source"})
    )
    forks = [bound_volume_dir(core, namespace, name, stack) for name in ("fork-1", "fork-2")]
    clone = bound_volume_dir(core, namespace, "clone", stack)

    assert [(d / "work.txt").read_text() for d in forks] == ["uncommitted work\n"] * 2
    assert (clone / "work.txt").read_text() == "changed after the snapshot\n"
    (forks[0] / "work.txt").write_text("fork-1's change\n")
    assert (forks[1] / "work.txt").read_text() == "uncommitted work\n"
    assert (source_dir / "work.txt").read_text() == "changed after the snapshot\n"

    # Deleting the snapshot and the forks removes their copies and leaves the source.
    snapshots.delete(name="baseline", namespace=namespace)
    for name in ("fork-1", "fork-2", "clone"):
        core.delete_namespaced_persistent_volume_claim(name, namespace)
    wait_for(
        lambda: not any(d.exists() for d in [*forks, clone]),
        timeout=90,
        what="the forks' volumes to be deleted",
    )
    wait_for(
        lambda: not list((stack / "snapshots").iterdir()),
        timeout=90,
        what="the snapshot's copy to be deleted",
    )
    contents = dynamic.DynamicClient(k8s_api).resources.get(
        api_version=SNAPSHOTS[0], kind="VolumeSnapshotContent"
    )

    wait_for(
        lambda: absent(lambda: contents.get(name=content_name)),
        timeout=90,
        what=f"VolumeSnapshotContent {content_name} to be deleted",
    )
    assert (source_dir / "work.txt").read_text() == "changed after the snapshot\n"
    # The source too, while the provisioner still runs to delete its volume.
    core.delete_namespaced_persistent_volume_claim("source", namespace)
    wait_for(lambda: not source_dir.exists(), timeout=90, what="the source's volume to be deleted")
