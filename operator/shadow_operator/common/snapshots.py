"""VolumeSnapshots of workspaces: which snapshot class serves a volume, the snapshot manifest, its state, and
how one is cut.

Shared by the environment reconciler (forks) and the SDK (`shadowctl snapshot`, shared fork snapshots). Cutting
one is written once here, without I/O (`choose`, `cut`): a generator that yields the reads and writes it needs
(`ReadStorageClass`, `ListSnapshotClasses`, `Flush`, `Create`) and is sent their results; each side drives it with its own client
(the operator: controllers/environment/clone/snapshot.py; the SDK: sdk/fork.py).
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from shadow_operator.api import constants as c

Body = Mapping[str, Any]
Manifest = dict[str, Any]

DEFAULT_CLASS_ANNOTATION = "snapshot.storage.kubernetes.io/is-default-class"
SNAPSHOT_API_VERSION = f"{c.SNAPSHOT_GROUP}/v1"


@dataclass(frozen=True)
class ClassChoice:
    """The VolumeSnapshotClass to use for a volume (None: the volume cannot be snapshotted) and why."""

    name: str | None
    reason: str


def volume_driver(storage_class: Body | None) -> str | None:
    """The CSI driver behind a claim of this StorageClass: its provisioner (CSI drivers provision under their
    name)."""
    if storage_class is None:
        return None
    provisioner = storage_class.get("provisioner")
    return str(provisioner) if provisioner else None


def choose_class(driver: str | None, classes: Iterable[Body], *, api_installed: bool = True) -> ClassChoice:
    """The snapshot class for `driver`: the one annotated as default for it, else the first by name."""
    if not api_installed:
        return ClassChoice(None, "the cluster has no VolumeSnapshot API (snapshot CRDs not installed)")
    if not driver:
        return ClassChoice(None, "the source volume has no known provisioner (its StorageClass is missing)")
    matching = sorted(
        (k for k in classes if k.get("driver") == driver), key=lambda k: str(k["metadata"]["name"])
    )
    if not matching:
        return ClassChoice(None, f"no VolumeSnapshotClass serves the volume's driver {driver}")
    defaults = [
        k
        for k in matching
        if (k["metadata"].get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true"
    ]
    name = str((defaults or matching)[0]["metadata"]["name"])
    return ClassChoice(name, f"VolumeSnapshotClass {name} serves the volume's driver {driver}")


def sources_annotation(sources: Sequence[Mapping[str, Any]]) -> str:
    """The sources a workspace holds, as the JSON an environment restored from its snapshot inherits."""
    return json.dumps(
        [{"name": s["name"], "repo": s["repo"], "path": s["path"]} for s in sources], separators=(",", ":")
    )


def parse_sources_annotation(value: str | None) -> list[dict[str, str]] | None:
    """The inherited sources, or None when the annotation is missing or not what we write."""
    if not value:
        return None
    try:
        raw = json.loads(value)
    except ValueError:
        return None
    if not isinstance(raw, list):
        return None
    out = []
    for item in raw:
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) for k in ("name", "repo", "path")
        ):
            return None
        out.append({k: item[k] for k in ("name", "repo", "path")})
    return out


def build_volume_snapshot(
    *,
    name: str,
    namespace: str,
    pvc: str,
    class_name: str,
    environment: str | None,
    snapshot_of: str,
    sources: Sequence[Mapping[str, Any]] = (),
) -> Manifest:
    """A VolumeSnapshot of the claim `pvc`, labelled with the environment it belongs to (what `shadowctl
    cleanup` looks for once that environment is gone) and the environment (or Sandbox) it was taken of."""
    annotations = {c.ANNOTATION_SNAPSHOT_SOURCES: sources_annotation(sources)} if sources else {}
    labels = {
        c.LABEL_MANAGED_BY: c.MANAGED_BY_VALUE,
        c.LABEL_COMPONENT: c.COMPONENT_SNAPSHOT,
        c.LABEL_SNAPSHOT_OF: snapshot_of,
    }
    if environment:
        labels[c.LABEL_ENVIRONMENT] = environment
    return {
        "apiVersion": SNAPSHOT_API_VERSION,
        "kind": "VolumeSnapshot",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"volumeSnapshotClassName": class_name, "source": {"persistentVolumeClaimName": pvc}},
    }


SnapshotPhase = Literal["Ready", "Pending", "Failed"]


def snapshot_state(snapshot: Body) -> tuple[SnapshotPhase, str]:
    """Ready when readyToUse; Failed when the snapshot controller reports an error and nothing was cut."""
    status = snapshot.get("status") or {}
    if status.get("readyToUse") is True:
        return "Ready", f"ready ({status.get('restoreSize') or 'size unknown'})"
    error = (status.get("error") or {}).get("message")
    if error:
        return ("Pending" if status.get("boundVolumeSnapshotContentName") else "Failed"), str(error)
    if status.get("boundVolumeSnapshotContentName"):
        return "Pending", "cut, waiting for the driver to report it ready to use"
    return "Pending", "waiting for the snapshot controller"


def data_source(snapshot: str) -> dict[str, str]:
    """The dataSource of a claim restored from the VolumeSnapshot `snapshot`."""
    return {"apiGroup": c.SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": snapshot}


# --------------------------------------------------------------------------------------- cutting one
@dataclass(frozen=True)
class ReadStorageClass:
    """Read the StorageClass `name`; the driver sends it back, or None when it does not exist."""

    name: str


@dataclass(frozen=True)
class ListSnapshotClasses:
    """List the VolumeSnapshotClasses; the driver sends them back, or None when their API is not installed."""


@dataclass(frozen=True)
class Flush:
    """Write the workspace's dirty pages to its volume (`sync` through its runtime), so the snapshot holds them."""


@dataclass(frozen=True)
class Create:
    """Create the VolumeSnapshot; the driver sends the object back (owned as it decides)."""

    manifest: Manifest


Step = ReadStorageClass | ListSnapshotClasses | Flush | Create
T = TypeVar("T")
Plan = Generator[Step, Any, T]


def choose(source_class: str | None, target_class: str | None = None) -> Plan[ClassChoice]:
    """The VolumeSnapshotClass for a volume of StorageClass `source_class`, restored into `target_class`
    (default: the same): none when the target's driver is another one, which could not restore it."""
    storage_class = (yield ReadStorageClass(source_class)) if source_class else None
    driver = volume_driver(storage_class)
    target_class = target_class or source_class
    if target_class != source_class:
        target = (yield ReadStorageClass(target_class)) if target_class else None
        if volume_driver(target) != driver:
            return ClassChoice(
                None, f"StorageClass {target_class} is served by another driver than the source volume"
            )
    classes = yield ListSnapshotClasses()
    if classes is None:
        return choose_class(driver, (), api_installed=False)
    return choose_class(driver, classes)


def cut(*, flush: bool, **manifest: Any) -> Plan[Manifest]:
    """Flush the workspace (when it runs), then create its VolumeSnapshot (`build_volume_snapshot`'s
    arguments); no wait."""
    if flush:
        yield Flush()
    created: Manifest = yield Create(build_volume_snapshot(**manifest))
    return created
