"""Additional cache feeds: objects of a kind that kopf already watches under one label selector, cached
under a second one too (`Cached(kind, selector, additional=True)`).

kopf watches each kind once, with one label selector, and a Kubernetes selector cannot say "this label or
that one". So a reconciler that needs other objects of such a kind (an environment's Gitea Pods, which carry
no Sandbox label, beside the Sandbox Pods) declares them as an additional feed: the engine lists them before
any reconcile runs (the caches stay complete at start) and then watches them, into the same store.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from shadow_operator.api.kinds import ResourceKind
from shadow_operator.clients.kube import ApiError, Kube
from shadow_operator.engine.cache import Cache, Key, key_of

_log = logging.getLogger("shadow_operator.engine")
WATCH_SECONDS = 300
RETRY_SECONDS = 2.0  # before listing again after a failed watch


class Feed:
    """One list + watch loop of `kind` objects matching `labels` in `namespace` (None: all) into `cache`."""

    def __init__(
        self, kube: Kube, cache: Cache, kind: ResourceKind, labels: str, namespace: str | None = None
    ) -> None:
        self.kube, self.cache, self.kind, self.labels = kube, cache, kind, labels
        self.path = kind.path(namespace)
        self._keys: set[Key] = set()  # what this feed put in the store (a relist drops the vanished)
        self._version = ""

    async def list(self) -> None:
        items, self._version = await self.kube.list_with_version(self.path, labels=self.labels)
        store = self.cache.store(self.kind)
        seen = set()
        for item in items:
            item.setdefault("apiVersion", self.kind.api_version)
            item.setdefault("kind", self.kind.kind)
            store.upsert(item)
            seen.add(key_of(item))
        for namespace, name in self._keys - seen:
            store.remove(namespace, name)
        self._keys = seen

    async def run(self) -> None:
        """Watch from the last listing; list again after an error (410 Gone included)."""
        store = self.cache.store(self.kind)
        while True:
            try:
                if not self._version:
                    await self.list()
                async for event, obj in self.kube.watch(
                    self.path,
                    resource_version=self._version,
                    labels=self.labels,
                    timeout_seconds=WATCH_SECONDS,
                ):
                    if event == "ERROR":
                        raise ApiError(int(obj.get("code") or 500), str(obj.get("reason")), str(obj))
                    self._version = str(obj["metadata"].get("resourceVersion") or self._version)
                    if event in ("ADDED", "MODIFIED"):
                        store.upsert(obj)
                        self._keys.add(key_of(obj))
                    elif event == "DELETED":
                        key = key_of(obj)
                        store.remove(*key)
                        self._keys.discard(key)
            except asyncio.CancelledError:
                raise
            except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                _log.warning("watch of %s (%s) restarts: %s", self.kind, self.labels, exc)
                self._version = ""
                await asyncio.sleep(RETRY_SECONDS)
