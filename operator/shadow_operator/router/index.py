"""What the router may reach: an in-memory index of managed sandboxes and their pods.

Fed by list + watch (`watch.py`); every lookup is a dict access. Only a few fields of each object are kept.
A sandbox is routable when it is Ready and exactly one Pod is controlled by it (owner reference with its
uid) and that Pod is Ready with an IP: the upstream is that IP and a port of the sandbox's own pod template,
never a name someone else could have created.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.resources import metadata
from shadow_operator.resources import sandbox as res
from shadow_operator.resources.indexes import is_ready
from shadow_operator.router.options import ACCESS_VALUES

Body = Mapping[str, Any]
Key = tuple[str, str]

REASON_IDLE = c.REASON_IDLE
# `public` or `private`, on a Sandbox (wins) or on its SandboxTemplate; else the router's default.
ANNOTATION_PREVIEW_ACCESS = c.ANNOTATION_PREVIEW_ACCESS


@dataclass(frozen=True)
class SandboxEntry:
    uid: str
    ready: bool
    preview_port: int | None
    runtime_port: int
    ports: frozenset[int]
    access: str | None
    template: str | None
    idle_suspended: bool = False
    spec_suspended: bool = False  # its spec says Suspended (a user's choice): no request wakes it


@dataclass(frozen=True)
class PodEntry:
    controller_uid: str | None
    ips: tuple[str, ...]
    ready: bool
    deleting: bool = False


@dataclass(frozen=True)
class Route:
    """Where a managed sandbox can be reached, as far as the index knows."""

    namespace: str
    name: str
    uid: str
    ready: bool
    ips: tuple[str, ...]
    preview_port: int | None
    runtime_port: int
    ports: frozenset[int]  # the TCP ports its pod template declares: all the SDK path may reach
    access: str | None
    asleep: bool = False  # idle-suspended, or its Pod going down: a request wakes it (and waits)


def _access(annotations: Mapping[str, str] | None) -> str | None:
    value = (annotations or {}).get(ANNOTATION_PREVIEW_ACCESS)
    return value if value in ACCESS_VALUES else None


def idle_suspended(body: Body) -> bool:
    """Suspended by the operator for idleness (not by its spec: a user's Suspended stays suspended)."""
    return any(
        cond.get("type") == c.COND_SUSPENDED
        and cond.get("status") == "True"
        and cond.get("reason") == REASON_IDLE
        for cond in (body.get("status") or {}).get("conditions") or ()
    )


def sandbox_entry(body: Body, default_preview_port: int | None) -> SandboxEntry:
    meta = body["metadata"]
    pod_spec = ((body.get("spec") or {}).get("podTemplate") or {}).get("spec") or {}
    return SandboxEntry(
        uid=str(meta.get("uid") or ""),
        ready=is_ready(body),
        preview_port=res.named_port(pod_spec, c.PREVIEW_PORT_NAME) or default_preview_port,
        runtime_port=res.named_port(pod_spec, c.RUNTIME_PORT_NAME) or c.RUNTIME_DEFAULT_PORT,
        ports=frozenset(p["port"] for p in res.service_ports(pod_spec) if p["protocol"] == "TCP"),
        access=_access(meta.get("annotations")),
        template=(meta.get("annotations") or {}).get(c.ANNOTATION_TEMPLATE_REF),
        idle_suspended=idle_suspended(body),
        spec_suspended=res.is_suspended(body.get("spec") or {}),
    )


def pod_entry(body: Body) -> PodEntry:
    status = body.get("status") or {}
    ready = status.get("phase") == "Running" and any(
        cond.get("type") == "Ready" and cond.get("status") == "True"
        for cond in status.get("conditions") or ()
    )
    deleting = bool(body["metadata"].get("deletionTimestamp"))
    return PodEntry(
        controller_uid=metadata.controller_uid(body),
        ips=tuple(res.pod_ips(body)),
        ready=ready and not deleting,
        deleting=deleting,
    )


@dataclass
class Index:
    """The router's view of the cluster. Used from one event loop; not thread-safe."""

    default_preview_port: int | None = None
    sandboxes: dict[Key, SandboxEntry] = field(default_factory=dict)
    pods: dict[Key, PodEntry] = field(default_factory=dict)
    pods_by_owner: dict[str, set[Key]] = field(default_factory=dict)
    template_access: dict[Key, str] = field(default_factory=dict)
    on_change: Callable[[str], None] | None = None

    # ------------------------------------------------------------------------------------------ writes
    def put(self, kind: str, body: Body) -> None:
        meta = body["metadata"]
        key = (meta.get("namespace") or "", meta["name"])
        if kind == "Sandbox":
            entry = sandbox_entry(body, self.default_preview_port)
            self.sandboxes[key] = entry
            self._changed(entry.uid)
        elif kind == "Pod":
            self._drop_pod(key)
            pod = pod_entry(body)
            self.pods[key] = pod
            if pod.controller_uid:
                self.pods_by_owner.setdefault(pod.controller_uid, set()).add(key)
            self._changed(pod.controller_uid)
        elif kind == "SandboxTemplate":
            access = _access(meta.get("annotations"))
            if access is None:
                self.template_access.pop(key, None)
            else:
                self.template_access[key] = access

    def remove(self, kind: str, namespace: str, name: str) -> None:
        key = (namespace, name)
        if kind == "Sandbox":
            gone = self.sandboxes.pop(key, None)
            if gone is not None:
                self._changed(gone.uid)
        elif kind == "Pod":
            self._drop_pod(key)
        elif kind == "SandboxTemplate":
            self.template_access.pop(key, None)

    def replace(self, kind: str, namespace: str, bodies: Iterable[Body]) -> None:
        """A fresh listing of one kind in one namespace: what it does not hold is gone."""
        listed = list(bodies)
        names = {b["metadata"]["name"] for b in listed}
        for ns, name in list(self._keys(kind)):
            if ns == namespace and name not in names:
                self.remove(kind, ns, name)
        for body in listed:
            self.put(kind, body)

    def _keys(self, kind: str) -> Iterable[Key]:
        tables: dict[str, Mapping[Key, object]] = {
            "Sandbox": self.sandboxes,
            "Pod": self.pods,
            "SandboxTemplate": self.template_access,
        }
        return tables[kind].keys()

    def _changed(self, uid: str | None) -> None:
        if uid and self.on_change is not None:
            self.on_change(uid)

    def _drop_pod(self, key: Key) -> None:
        old = self.pods.pop(key, None)
        if old is not None:
            self._changed(old.controller_uid)
        if old is not None and old.controller_uid:
            owned = self.pods_by_owner.get(old.controller_uid)
            if owned is not None:
                owned.discard(key)
                if not owned:
                    del self.pods_by_owner[old.controller_uid]

    # ------------------------------------------------------------------------------------------- reads
    def route(self, namespace: str, name: str) -> Route | None:
        """The route of a managed sandbox; None when the index holds no Sandbox of that name."""
        entry = self.sandboxes.get((namespace, name))
        if entry is None:
            return None
        owned = [self.pods[key] for key in self.pods_by_owner.get(entry.uid, ()) if key in self.pods]
        pod = owned[0] if len(owned) == 1 else None
        ready = entry.ready and pod is not None and pod.ready and bool(pod.ips)
        going_down = any(p.deleting for p in owned)
        access = entry.access
        if access is None and entry.template:
            access = self.template_access.get((namespace, entry.template))
        return Route(
            namespace=namespace,
            name=name,
            uid=entry.uid,
            ready=ready,
            ips=pod.ips if pod is not None else (),
            preview_port=entry.preview_port,
            runtime_port=entry.runtime_port,
            ports=entry.ports,
            access=access,
            asleep=not ready and not entry.spec_suspended and (entry.idle_suspended or going_down),
        )


def runtime_token(body: Body) -> str | None:
    """The token of a runtime token Secret the operator made (by name suffix and label), else None."""
    meta = body["metadata"]
    if not meta["name"].endswith(c.RUNTIME_TOKEN_SECRET_SUFFIX):
        return None
    if (meta.get("labels") or {}).get(c.LABEL_MANAGED_BY) != c.MANAGED_BY_VALUE:
        return None
    encoded = (body.get("data") or {}).get(c.RUNTIME_TOKEN_KEY)
    if not encoded:
        return None
    try:
        return base64.b64decode(encoded).decode().strip() or None
    except (binascii.Error, UnicodeDecodeError):
        return None
