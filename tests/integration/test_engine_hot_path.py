"""The engine's promise, checked on a real API server: reconciles read from caches, a warm claim costs two
writes on its way to Ready (the conditional adoption patch and the claim's status), and nothing is read."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY
from shadow_operator import controllers
from shadow_operator.api import constants as c
from shadow_operator.api import naming

from tests.support.controlplane import wait_for
from tests.support.sandbox_operator import CLAIM, POOL, SANDBOX, TEMPLATE, Objects, ready, template_body

pytestmark = pytest.mark.integration


def writes(kind: str, verb: str) -> float:
    return REGISTRY.get_sample_value("shadow_operator_api_writes_total", {"kind": kind, "verb": verb}) or 0.0


def test_a_warm_claim_reads_nothing_and_writes_twice_before_ready(objs: Objects) -> None:
    objs.create(TEMPLATE, template_body("tpl"))
    objs.create(
        POOL, {"metadata": {"name": "pool"}, "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "tpl"}}}
    )
    objs.wait(POOL, "pool", lambda p: (p.get("status") or {}).get("readyReplicas") == 2, what="warm pool")
    running = controllers.manager.running
    assert running is not None
    reads_before = running.kube.requests["GET"]
    before = {
        (k, v): writes(k, v) for k in ("Sandbox", "SandboxClaim") for v in ("patch", "status", "create")
    }

    objs.create(CLAIM, {"metadata": {"name": "hot"}, "spec": {"warmPoolRef": {"name": "pool"}}})
    claim = objs.wait_condition(CLAIM, "hot", "True")
    assert claim["status"]["sandbox"]["name"].startswith("pool-"), "adopted from the pool"

    def delta(kind: str, verb: str) -> float:
        return writes(kind, verb) - before[kind, verb]

    assert delta("Sandbox", "patch") == 1, "one conditional adoption patch"
    assert delta("SandboxClaim", "status") == 1, "Ready written in the adopting pass"
    assert delta("SandboxClaim", "create") == 0
    # The pool refills (one create) and the annotation follows the status; neither reads.
    wait_for(
        lambda: len(objs.list(SANDBOX, f"{c.LABEL_WARM_POOL}={naming.name_hash('pool')}")) == 2,
        timeout=30,
        what="the pool refilled",
    )
    assert running.kube.requests["GET"] == reads_before, "reconciles read from the cache only"


def test_cache_sees_foreign_changes_and_deletions(objs: Objects) -> None:
    """A Sandbox deleted behind the operator's back leaves its claim (which then reports it) - via the watch."""
    objs.create(TEMPLATE, template_body("tpl"))
    objs.create(CLAIM, {"metadata": {"name": "cold"}, "spec": {"sandboxTemplateRef": {"name": "tpl"}}})
    objs.wait_condition(CLAIM, "cold", "True")
    running = controllers.manager.running
    assert running is not None
    store = running.client.cache.store(controllers.SandboxReconciler.kind)
    assert store.get(objs.namespace, "cold") is not None
    objs.patch(SANDBOX, "cold", {"metadata": {"labels": {"example.com/touched": "yes"}}})

    def labelled() -> bool:
        cached: dict[str, Any] | None = store.get(objs.namespace, "cold")
        return bool(cached and cached["metadata"].get("labels", {}).get("example.com/touched") == "yes")

    wait_for(labelled, timeout=10, what="the label change in the cache")
    assert ready(objs.get(SANDBOX, "cold") or {})
