"""Volumes on the local control plane, which has no provisioner: static PersistentVolumes on hostPath, made
for the claims a test expects (pre-bound through `claimRef`) or for a StorageClass nobody provisions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.controlplane import volume_report, wait_for
from tests.support.sandbox_operator import Objects


def persistent_volume(
    name: str,
    path: Path | str,
    *,
    claim: tuple[str, str] | None = None,
    storage_class: str = "",
    capacity: str = "10Gi",
) -> dict[str, Any]:
    """A hostPath PersistentVolume; with `claim` (namespace, name) pre-bound to that claim and deleted with it."""
    spec: dict[str, Any] = {
        "capacity": {"storage": capacity},
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": storage_class,
        "hostPath": {"path": str(path)},
    }
    if claim is not None:
        namespace, claim_name = claim
        spec["claimRef"] = {"namespace": namespace, "name": claim_name}
        spec["persistentVolumeReclaimPolicy"] = "Delete"
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec}


def bind_volumes(
    objs: Objects, claims: Sequence[str], root: Path, *, storage_class: str = "", prefix: str = ""
) -> list[str]:
    """Create a volume pre-bound to each of `claims` in the test's namespace (under `root`), so that the
    scheduler places the Pods that mount them; return the volumes' names (`<prefix or namespace>-<claim>`)."""
    names = []
    for claim in claims:
        name = f"{prefix or objs.namespace}-{claim}"[:63]
        objs.core.create_persistent_volume(
            persistent_volume(name, root / claim, claim=(objs.namespace, claim), storage_class=storage_class)
        )
        names.append(name)
    return names


def wait_bound(objs: Objects, claims: Sequence[str], timeout: float) -> None:
    """Wait until the claims are Bound to the volumes made for them; else fail with the PV controller's view
    (claims, volumes, events, its log), which is what a Pod that is never scheduled comes down to here."""

    def bound() -> bool:
        phases = {
            pvc.metadata.name: pvc.status.phase
            for pvc in objs.core.list_namespaced_persistent_volume_claim(objs.namespace).items
        }
        return all(phases.get(claim) == "Bound" for claim in claims)

    try:
        wait_for(bound, timeout=timeout, what=f"claims {', '.join(claims)} to be Bound", interval=0.25)
    except TimeoutError as exc:
        pytest.fail(f"{exc}\n{volume_report(objs.core, objs.namespace)}", pytrace=False)
