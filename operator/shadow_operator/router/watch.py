"""List + watch loops that keep the router's index current (one loop per kind and namespace)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp

from shadow_operator.api import constants as c
from shadow_operator.api.kinds import POD, SANDBOX, SANDBOX_TEMPLATE, ResourceKind
from shadow_operator.clients.kube import ApiError, Kube
from shadow_operator.router.index import Index

log = logging.getLogger(__name__)
WATCH_SECONDS = 300
RETRY_SECONDS = 2.0


@dataclass(frozen=True)
class Source:
    kind: ResourceKind
    labels: str | None = None


def sources() -> list[Source]:
    """What the router watches: Sandboxes and templates, and the Pods the operator labels. Never Secrets: the
    SDK path reads one sandbox's runtime token Secret by name when it needs it (router/secrets.py)."""
    return [
        Source(SANDBOX),
        Source(SANDBOX_TEMPLATE),
        Source(POD, c.LABEL_SANDBOX_NAME_HASH),
    ]


class Feeder:
    """Runs every (source, namespace) loop; `synced` is set once each has listed once."""

    def __init__(self, kube: Kube, index: Index, namespaces: list[str], feeds: list[Source]) -> None:
        self.kube = kube
        self.index = index
        self.loops = [(feed, ns) for feed in feeds for ns in namespaces]
        self._listed: set[tuple[str, str]] = set()
        self.synced = asyncio.Event()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for feed, namespace in self.loops:
                group.create_task(self._loop(feed, namespace))

    async def _loop(self, feed: Source, namespace: str) -> None:
        kind, path = feed.kind.kind, feed.kind.path(namespace)
        while True:
            try:
                items, version = await self.kube.list_with_version(path, labels=feed.labels)
                self.index.replace(kind, namespace, items)
                self._mark_listed(kind, namespace)
                while True:
                    async for event, obj in self.kube.watch(
                        path, resource_version=version, labels=feed.labels, timeout_seconds=WATCH_SECONDS
                    ):
                        if event == "ERROR":
                            raise ApiError(int(obj.get("code") or 500), str(obj.get("reason")), str(obj))
                        version = str(obj["metadata"].get("resourceVersion") or version)
                        if event in ("ADDED", "MODIFIED"):
                            self.index.put(kind, obj)
                        elif event == "DELETED":
                            self.index.remove(kind, namespace, obj["metadata"]["name"])
            except asyncio.CancelledError:
                raise
            except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                # 410 Gone (history compacted) and dropped connections alike: list again, a little later.
                log.warning("watch of %s in %s restarts: %s", kind, namespace, exc)
                await asyncio.sleep(RETRY_SECONDS)

    def _mark_listed(self, kind: str, namespace: str) -> None:
        self._listed.add((kind, namespace))
        if len(self._listed) == len(self.loops):
            self.synced.set()
