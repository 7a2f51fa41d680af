"""The engine's additional cache feeds: objects of a kind kopf watches under another selector, listed before
any reconcile and then watched into the same store; a relist drops what vanished meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from shadow_operator.api.kinds import POD
from shadow_operator.clients.kube import Kube
from shadow_operator.controllers import RECONCILERS
from shadow_operator.controllers.environment.reconciler import GITEA_PODS
from shadow_operator.engine import Cache, Manager
from shadow_operator.engine.feeds import Feed

pytestmark = pytest.mark.unit


def pod(name: str, version: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team", "resourceVersion": str(version)}}


class FakeKube:
    """Answers lists from `listings` (one per call) and watches from `streams` (one per call)."""

    def __init__(self, listings: list[list[dict[str, Any]]], streams: list[list[tuple[str, dict[str, Any]]]]):
        self.listings, self.streams = listings, streams
        self.calls: list[tuple[str, str | None, str | None]] = []
        self.done = asyncio.Event()

    async def list_with_version(self, path: str, *, labels: str | None = None) -> tuple[list[dict], str]:
        self.calls.append(("list", path, labels))
        return self.listings.pop(0), "10"

    async def watch(
        self, path: str, *, resource_version: str, labels: str | None = None, timeout_seconds: int = 300
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.calls.append(("watch", resource_version, labels))
        if not self.streams:
            self.done.set()
            await asyncio.Event().wait()
        for event in self.streams.pop(0):
            yield event


async def test_listed_then_watched_and_relisted_after_an_expired_watch() -> None:
    cache = Cache()
    kube = FakeKube(
        listings=[[pod("a-gitea-0", 1), pod("b-gitea-0", 1)], [pod("a-gitea-0", 5)]],
        streams=[
            [
                ("MODIFIED", pod("a-gitea-0", 3)),
                ("DELETED", pod("b-gitea-0", 4)),
                ("ADDED", pod("c-gitea-0", 4)),
            ],
            [("ERROR", {"code": 410, "reason": "Expired"})],
        ],
    )
    feed = Feed(cast(Kube, kube), cache, POD, GITEA_PODS)
    await feed.list()
    assert sorted(p["metadata"]["name"] for p in cache.store(POD).list()) == ["a-gitea-0", "b-gitea-0"]
    task = asyncio.create_task(feed.run())
    await asyncio.wait_for(kube.done.wait(), timeout=10)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    store = cache.store(POD)
    # c-gitea-0 was added by the watch, then vanished from the relist that followed the 410: dropped.
    assert [p["metadata"]["name"] for p in store.list()] == ["a-gitea-0"]
    assert store.get("team", "a-gitea-0")["metadata"]["resourceVersion"] == "5"  # type: ignore[index]
    assert [c[0] for c in kube.calls] == ["list", "watch", "watch", "list", "watch"]
    assert all(labels == GITEA_PODS for _, _, labels in kube.calls)


def test_an_additional_feed_neither_conflicts_with_nor_replaces_the_kinds_selector() -> None:
    manager = Manager(RECONCILERS, load_config=dict)
    assert manager.cached[POD] == "agents.x-k8s.io/sandbox-name-hash"  # kopf's watch: Sandbox Pods
    assert list(manager.additional) == [(POD, GITEA_PODS)]


async def test_a_namespaced_operator_lists_only_its_namespaces() -> None:
    """With operator.watchNamespaces the permissions are Roles: no list across the cluster."""
    kube = FakeKube(listings=[[pod("a-gitea-0", 1)]], streams=[])
    await Feed(cast(Kube, kube), Cache(), POD, GITEA_PODS, "team").list()
    assert kube.calls == [("list", "/api/v1/namespaces/team/pods", GITEA_PODS)]
