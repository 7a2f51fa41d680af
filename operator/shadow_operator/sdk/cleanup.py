"""Leftovers of deleted environments: PVCs, VolumeSnapshots and Secrets labelled with an environment that no
longer exists (a Gitea volume kept by `persistence.retain`, or objects whose owner references were lost).
"""

from __future__ import annotations

from dataclasses import dataclass

from shadow_operator.api import constants as c
from shadow_operator.api.kinds import PVC, SECRET, SHADOW_ENVIRONMENT, VOLUME_SNAPSHOT, ResourceKind
from shadow_operator.sdk import kube
from shadow_operator.sdk.errors import ApiNotInstalled, NotFound
from shadow_operator.sdk.kube import Call, Op

KINDS = (PVC, VOLUME_SNAPSHOT, SECRET)


@dataclass(frozen=True)
class Orphan:
    kind: str
    namespace: str
    name: str
    environment: str
    size: str = ""  # requested storage, for PVCs

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v in self.__dict__.items() if v}


def _items(kind: ResourceKind, namespace: str | None, selector: str) -> Op[list[kube.Body]]:
    try:
        body = yield from kube.get(kind.path(namespace) + f"?labelSelector={selector}", f"list {kind.kind}s")
    except (ApiNotInstalled, NotFound):
        return []  # no snapshot API in this cluster: nothing of that kind to leave behind
    return list(body["items"])


def find(namespace: str | None) -> Op[list[Orphan]]:
    """Every labelled object whose environment (same namespace) is gone. `namespace=None`: all namespaces."""
    envs = yield from kube.get(SHADOW_ENVIRONMENT.path(namespace), "list ShadowEnvironments")
    # An environment's objects are labelled with its instance: its own name, or the pool instance it took.
    alive = {(e["metadata"]["namespace"], e["metadata"]["name"]) for e in envs["items"]}
    alive |= {
        (e["metadata"]["namespace"], e["status"]["sandbox"])
        for e in envs["items"]
        if (e.get("status") or {}).get("sandbox")
    }
    orphans = []
    for kind in KINDS:
        for obj in (yield from _items(kind, namespace, c.LABEL_ENVIRONMENT)):
            meta = obj["metadata"]
            env = meta["labels"][c.LABEL_ENVIRONMENT]
            if (meta["namespace"], env) in alive or _controlled(meta):
                continue
            size = ((obj.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage", "")
            orphans.append(Orphan(kind.kind, meta["namespace"], meta["name"], env, str(size)))
    return orphans


def _controlled(meta: kube.Body) -> bool:
    """Whether something still controls the object (a Sandbox its volume, a pool its instance's): it goes
    with its owner by garbage collection, it is not left behind."""
    return any(ref.get("controller") for ref in meta.get("ownerReferences") or ())


def delete(orphan: Orphan) -> Op[None]:
    kind = next(k for k in KINDS if k.kind == orphan.kind)
    try:
        yield Call("DELETE", kind.path(orphan.namespace, orphan.name), f"delete {orphan.kind} {orphan.name}")
    except NotFound:
        return
