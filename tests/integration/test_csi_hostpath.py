"""The project's host-path CSI driver (images/csi-hostpath), for real and without a cluster.

csi-sanity, the Kubernetes CSI conformance suite, drives the built driver over its socket: identity,
volumes, snapshots, volumes from snapshots and clones, and (as root) NodePublish as real bind mounts in a
temporary directory. The driver's Go unit tests run here too, and the kind manifests
(hack/kind/snapshots) are created with dry-run on the local API server with the VolumeSnapshot CRDs
installed, which checks the VolumeSnapshotClass against its CRD and the rest against Kubernetes 1.34.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, dynamic

from tests.support.sandbox_operator import apply_crds
from tests.support.snapshots import (
    DRIVER_DIR,
    build_driver,
    crd_dir,
    csi_sanity,
    manifest_placeholders,
    missing,
    render_kind_manifests,
    require,
    running_driver,
    snapshot_crds,
)

pytestmark = pytest.mark.integration

# Without root, bind mounts are refused: the NodePublish specs that mount are skipped then.
MOUNTING_SPECS = r"Node Service should work|Node Service should be idempotent|should remove target path"
# What the driver is for: if any of these did not pass, the run proves nothing about snapshots.
REQUIRED_SPECS = (
    "CreateVolume should create volume from an existing source snapshot",
    "CreateVolume should create volume from an existing source volume",
    "CreateSnapshot [Controller Server] should succeed when requesting to create a snapshot with already existing name and same source volume ID",
    "ListSnapshots [Controller Server] should return next token when a limited number of entries are requested",
    "ListSnapshots [Controller Server] should return snapshots that match the specified source volume id",
)


def go() -> str:
    path = shutil.which("go")
    require(None if path else "Go is not installed (it builds images/csi-hostpath)")
    assert path is not None
    return path


@pytest.fixture(scope="module")
def driver_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    go()
    out = tmp_path_factory.mktemp("csi-hostpath-bin") / "csi-hostpath"
    build_driver(out)
    return out


@pytest.fixture
def driver_socket(driver_binary: Path, tmp_path: Path) -> Iterator[Path]:
    with running_driver(driver_binary, tmp_path, node_id="sanity-node") as socket:
        yield socket


def test_csi_sanity_passes(driver_socket: Path, tmp_path: Path) -> None:
    require(missing(csi_sanity()))
    report = tmp_path / "junit.xml"
    args = [
        str(csi_sanity()),
        f"--csi.endpoint=unix://{driver_socket}",
        f"--csi.mountdir={tmp_path / 'mount'}",
        f"--csi.stagingdir={tmp_path / 'staging'}",
        f"--csi.testvolumesize={1 << 20}",
        f"--ginkgo.junit-report={report}",
        "--ginkgo.no-color",
    ]
    if os.geteuid() != 0:
        args.append(f"--ginkgo.skip={MOUNTING_SPECS}")
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    driver_log = (tmp_path / "driver.log").read_text()
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n--- driver log ---\n{driver_log[-3000:]}"

    passed = {
        case.get("name", "").removeprefix("[It] ")
        for case in ET.parse(report).getroot().iter("testcase")
        if not any(case.find(tag) is not None for tag in ("skipped", "failure", "error"))
    }
    for spec in REQUIRED_SPECS:
        assert any(spec in name for name in passed), f"{spec!r} did not pass; passed: {sorted(passed)}"
    if os.geteuid() == 0:
        assert "Node Service should work" in passed
    # No bind mount outlives the run.
    assert str(tmp_path) not in Path("/proc/self/mountinfo").read_text()


def test_go_unit_tests() -> None:
    result = subprocess.run(
        [go(), "test", "-count=1", "./..."],
        cwd=DRIVER_DIR,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_kind_manifests_are_accepted_by_the_api_server(k8s_api: client.ApiClient) -> None:
    require(missing(crd_dir()))
    apply_crds(k8s_api, snapshot_crds())
    api = dynamic.DynamicClient(k8s_api)
    images = {name: f"registry.test/{name.lower()}:v0" for name in manifest_placeholders()}
    for doc in render_kind_manifests(images):
        resource = api.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        namespace = doc["metadata"].get("namespace")
        # Dry run: the object passes validation and admission (CRD schemas included) and is not stored.
        resource.create(body=doc, namespace=namespace, dry_run="All")
