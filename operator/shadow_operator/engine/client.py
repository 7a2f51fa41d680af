"""The reconcilers' API client: reads from the cache, writes through to it, children through `apply()`."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from shadow_operator.api.kinds import ResourceKind
from shadow_operator.clients.kube import ApiError, Kube
from shadow_operator.engine import metrics
from shadow_operator.engine.cache import Body, Cache
from shadow_operator.engine.errors import NotOwned
from shadow_operator.resources.metadata import controller_uid, owner_reference

FIELD_MANAGER = "shadow-operator"


def is_subset(desired: Any, current: Any) -> bool:
    """Whether every field of `desired` has the same value in `current` (lists element by element).

    Fields the API server defaulted (present only in `current`) do not count as differences, so applying
    what is already there is recognised as a no-op and skipped. An empty list or map matches an absent field:
    the API server stores neither (a NetworkPolicy applied with `egress: []` reads back without it, and
    applying it again bumps its generation), so calling it a difference would write on every pass.
    """
    if isinstance(desired, Mapping):
        if not isinstance(current, Mapping):
            return False
        return all(
            is_subset(v, current[k]) if k in current else (isinstance(v, (list, Mapping)) and not v)
            for k, v in desired.items()
        )
    if isinstance(desired, list):
        if not isinstance(current, list) or len(desired) != len(current):
            return False
        return all(is_subset(d, c) for d, c in zip(desired, current, strict=True))
    return bool(desired == current)


class Client:
    """Writes go to the API server and their answers into the cache; reads of cached kinds never leave
    the process. Non-cached kinds are read from the API server."""

    def __init__(self, kube: Kube, cache: Cache) -> None:
        self.kube = kube
        self.cache = cache

    # ------------------------------------------------------------------------------------------ reads
    async def get(self, kind: ResourceKind, namespace: str, name: str) -> Body | None:
        if self.cache.has(kind):
            return self.cache.store(kind).get(namespace, name)
        return await self.kube.get(kind.path(namespace, name))

    async def get_live(self, kind: ResourceKind, namespace: str, name: str) -> Body | None:
        """Read from the API server (for the rare case where the cache cannot know, e.g. unwatched objects)."""
        return await self.kube.get(kind.path(namespace, name))

    async def list_live(self, kind: ResourceKind, namespace: str | None = None) -> list[Body]:
        """List from the API server (kinds that are not cached, e.g. cluster-scoped classes)."""
        return await self.kube.list(kind.path(namespace))

    # ----------------------------------------------------------------------------------------- writes
    def _remember(self, kind: ResourceKind, body: Body) -> Body:
        if self.cache.has(kind) and body.get("metadata", {}).get("name"):
            self.cache.store(kind).upsert(body)
        return body

    async def create(self, kind: ResourceKind, body: Mapping[str, Any]) -> Body:
        namespace = body["metadata"].get("namespace")
        metrics.API_WRITES.labels(kind.kind, "create").inc()
        return self._remember(kind, await self.kube.create(kind.path(namespace), body))

    async def patch(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> Body:
        """JSON merge patch. Put metadata.resourceVersion in the patch to make it conditional (409 on a race)."""
        metrics.API_WRITES.labels(kind.kind, "patch").inc()
        return self._remember(
            kind, await self.kube.merge_patch(kind.path(namespace, name, subresource), patch)
        )

    async def json_patch(
        self, kind: ResourceKind, namespace: str, name: str, ops: Sequence[Mapping[str, Any]]
    ) -> Body:
        metrics.API_WRITES.labels(kind.kind, "patch").inc()
        return self._remember(kind, await self.kube.json_patch(kind.path(namespace, name), ops))

    async def patch_status(
        self, kind: ResourceKind, obj: Mapping[str, Any], status: Mapping[str, Any]
    ) -> Body | None:
        """Merge `status` into the object's status subresource; None when the object is gone."""
        meta = obj["metadata"]
        metrics.API_WRITES.labels(kind.kind, "status").inc()
        path = kind.path(meta["namespace"], meta["name"], "status")
        try:
            return self._remember(kind, await self.kube.merge_patch(path, {"status": status}))
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def delete(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation: str | None = None,
        grace_seconds: int | None = None,
    ) -> bool:
        metrics.API_WRITES.labels(kind.kind, "delete").inc()
        return await self.kube.delete(
            kind.path(namespace, name),
            uid=uid,
            resource_version=resource_version,
            propagation=propagation,
            grace_seconds=grace_seconds,
        )

    async def delete_as_seen(self, kind: ResourceKind, obj: Mapping[str, Any]) -> bool:
        """Delete the object only as it was seen (its uid and resourceVersion preconditions). True when it is
        gone (deleted now or before); False when it changed since (409: e.g. a claim or an environment took a
        pool's member), and then it is left alone."""
        meta = obj["metadata"]
        try:
            await self.delete(
                kind,
                meta["namespace"],
                meta["name"],
                uid=meta["uid"],
                resource_version=meta["resourceVersion"],
            )
        except ApiError as exc:
            if exc.conflict:
                return False
            raise
        return True

    async def apply_fields(self, kind: ResourceKind, fields: Mapping[str, Any]) -> Body:
        """Server-side apply of `fields` to an object we do not own (e.g. labels on a namespace), without
        force: a field another manager set to another value is a conflict (ApiError 409), not taken over."""
        meta = fields["metadata"]
        metrics.API_WRITES.labels(kind.kind, "apply").inc()
        path = kind.path(meta.get("namespace"), meta["name"])
        return self._remember(
            kind, await self.kube.apply(path, fields, field_manager=FIELD_MANAGER, force=False)
        )

    async def apply(
        self, kind: ResourceKind, desired: Mapping[str, Any], *, owner: Mapping[str, Any]
    ) -> Body:
        """Make a child of `owner` look like `desired`: the one way children are written.

        - The controller owner reference is set here, never by the builders' callers.
        - Missing: created (POST, so an object of the same name that we do not see is never taken over).
        - Present but controlled by someone else: `NotOwned` (the caller decides about adoption).
        - Present and already as desired (every desired field equal): nothing is sent.
        - Otherwise: server-side apply with our field manager, forcing our fields.
        """
        body = copy.deepcopy(dict(desired))
        meta = body.setdefault("metadata", {})
        meta["ownerReferences"] = [owner_reference(owner)]
        namespace, name = meta["namespace"], meta["name"]
        current = await self.get(kind, namespace, name)
        if current is None:
            try:
                return await self.create(kind, body)
            except ApiError as exc:
                if not exc.already_exists:
                    raise
            current = await self.get_live(kind, namespace, name)
            if current is None:
                raise ApiError(409, "Conflict", f"{kind} {namespace}/{name} exists and vanished again")
            # Not cached: an object outside our watch's label selector would never be updated or dropped.
        if controller_uid(current) != owner["metadata"]["uid"]:
            raise NotOwned(
                current,
                f"{kind} {name!r} exists and is not owned by {owner['kind']} {owner['metadata']['name']}",
            )
        if is_subset(body, current):
            metrics.API_WRITES_SKIPPED.labels(kind.kind).inc()
            return current
        body.setdefault("apiVersion", kind.api_version)
        body.setdefault("kind", kind.kind)
        metrics.API_WRITES.labels(kind.kind, "apply").inc()
        return self._remember(
            kind, await self.kube.apply(kind.path(namespace, name), body, field_manager=FIELD_MANAGER)
        )
