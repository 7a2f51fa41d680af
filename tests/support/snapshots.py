"""Snapshot-capable storage for tests: the VolumeSnapshot CRDs, the kind manifests and the CSI tools.

The CRDs and binaries come from `hack/build-tools.sh snapshots` (`csi-sanity` alone from
`hack/build-tools.sh csi-sanity`): ${SHADOW_CACHE}/share/snapshot-crds-<version>/ and
${SHADOW_CACHE}/bin/<tool>. The manifests are hack/kind/snapshots/*.yaml with `@NAME_IMAGE@` placeholders,
which hack/kind/snapshots.sh fills in from `hack/images.sh env`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.controlplane import DEFAULT_BIN_DIR, DEFAULT_CACHE, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFEST_DIR = REPO_ROOT / "hack" / "kind" / "snapshots"
DRIVER_DIR = REPO_ROOT / "images" / "csi-hostpath"
DRIVER_NAME = "hostpath.csi.shadow.dev"
PLACEHOLDER = re.compile(r"@([A-Z_]+)_IMAGE@")


def pinned(key: str) -> str:
    """A version pinned in hack/versions.env."""
    for line in (REPO_ROOT / "hack" / "versions.env").read_text().splitlines():
        name, _, value = line.partition("=")
        if name.strip() == key:
            return value.strip()
    raise KeyError(f"{key} is not pinned in hack/versions.env")


def crd_dir() -> Path:
    return DEFAULT_CACHE / "share" / f"snapshot-crds-{pinned('SNAPSHOTTER_CLIENT_VERSION')}"


def csi_sanity() -> Path:
    return DEFAULT_BIN_DIR / f"csi-sanity-{pinned('CSI_TEST_VERSION')}"


def snapshots_tool(name: str) -> Path:
    """snapshot-controller, csi-snapshotter or csi-provisioner at its pinned version."""
    key = "EXTERNAL_PROVISIONER_VERSION" if name == "csi-provisioner" else "EXTERNAL_SNAPSHOTTER_VERSION"
    return DEFAULT_BIN_DIR / f"{name}-{pinned(key)}"


def missing(*paths: Path) -> str | None:
    """Why a test cannot run here (the first missing path and how to build it), or None."""
    for path in paths:
        if not path.exists():
            return f"{path} is missing: build it with `hack/build-tools.sh snapshots`"
    return None


def require(reason: str | None) -> None:
    """Skip the test for `reason` (from `missing`), or fail it under SHADOW_REQUIRE_INTEGRATION=1."""
    if reason is None:
        return
    if os.environ.get("SHADOW_REQUIRE_INTEGRATION") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def manifest_placeholders() -> set[str]:
    """NAME for every @NAME_IMAGE@ in the kind manifests (CSI_HOSTPATH, CSI_PROVISIONER, ...)."""
    return {m for path in MANIFEST_DIR.glob("*.yaml") for m in PLACEHOLDER.findall(path.read_text())}


def render_kind_manifests(images: dict[str, str]) -> list[dict[str, Any]]:
    """The documents of hack/kind/snapshots/*.yaml with @NAME_IMAGE@ replaced by images[NAME]."""
    docs: list[dict[str, Any]] = []
    for path in sorted(MANIFEST_DIR.glob("*.yaml")):
        text = PLACEHOLDER.sub(lambda m: images[m.group(1)], path.read_text())
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def snapshot_crds() -> list[dict[str, Any]]:
    """The VolumeSnapshot, VolumeSnapshotContent and VolumeSnapshotClass CRDs (install with
    `tests.support.sandbox_operator.apply_crds`)."""
    return [yaml.safe_load(path.read_text()) for path in sorted(crd_dir().glob("*.yaml"))]


def build_driver(out: Path) -> None:
    """`go build` images/csi-hostpath into `out`."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("Go is not installed (it builds images/csi-hostpath)")
    result = subprocess.run(
        [go, "build", "-o", str(out), "."],
        cwd=DRIVER_DIR,
        env={**os.environ, "CGO_ENABLED": "0"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"go build images/csi-hostpath failed:\n{result.stderr}")


@contextlib.contextmanager
def running_driver(binary: Path, directory: Path, node_id: str = "test-node") -> Iterator[Path]:
    """The driver serving on directory/csi.sock with its state in directory/state; yields the socket.

    Its log is directory/driver.log."""
    socket = directory / "csi.sock"
    log_path = directory / "driver.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--endpoint=unix://{socket}",
                f"--state-dir={directory / 'state'}",
                f"--node-id={node_id}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(
                lambda: socket.exists() or proc.poll() is not None, timeout=30, what="the driver's socket"
            )
            if proc.poll() is not None:
                raise RuntimeError(f"csi-hostpath exited:\n{log_path.read_text()}")
            yield socket
        finally:
            proc.terminate()
            proc.wait(timeout=30)
