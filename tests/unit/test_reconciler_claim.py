"""The SandboxClaim reconciler over the engine's client and cache, the API server in memory: a cold start, a
warm adoption from a pool the warm-pool reconciler filled, the claim's status mirrored from its Sandbox and
written once, and the reasons a claim is blocked."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY
from shadow_operator.api import constants as c
from shadow_operator.api.kinds import SANDBOX, SANDBOX_CLAIM, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL
from shadow_operator.controllers.claim import ClaimReconciler
from shadow_operator.controllers.warmpool import WarmPoolReconciler

from tests.support.fakes import NAMESPACE, Harness, make_ready, template

pytestmark = pytest.mark.unit


def claim(name: str = "job", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}"},
        "spec": spec or {"sandboxTemplateRef": {"name": "workspace"}},
    }


def ready_of(harness: Harness, name: str = "job") -> dict[str, Any]:
    status = harness.get(SANDBOX_CLAIM, NAMESPACE, name)["status"]
    return next(x for x in status["conditions"] if x["type"] == c.COND_READY)


def startups(launch: str) -> float:
    labels = {"namespace": NAMESPACE, "launch_type": launch}
    return REGISTRY.get_sample_value("agent_sandbox_claim_startup_latency_ms_count", labels) or 0.0


async def test_a_cold_claim_mirrors_its_sandbox_and_writes_only_changes() -> None:
    harness = Harness(ClaimReconciler)
    harness.put(SANDBOX_TEMPLATE, template())
    harness.put(SANDBOX_CLAIM, claim())
    await harness.run(SANDBOX_CLAIM, NAMESPACE, "job")
    assert harness.get(SANDBOX, NAMESPACE, "job")["metadata"]["ownerReferences"][0]["uid"] == "uid-job"
    status = harness.get(SANDBOX_CLAIM, NAMESPACE, "job")["status"]
    assert status["sandbox"] == {"name": "job"} and "previewURL" not in status
    assert (ready_of(harness)["status"], ready_of(harness)["reason"]) == ("False", c.REASON_SANDBOX_NOT_READY)
    assert harness.recorder.reasons() == ["SandboxCreated"]

    before = startups(c.LAUNCH_COLD)
    make_ready(harness, SANDBOX, "job", podIPs=["10.0.0.9"], previewURL="https://job.preview.example/")
    harness.writes()
    await harness.run(SANDBOX_CLAIM, NAMESPACE, "job")
    assert [w.split()[0] for w in harness.writes()] == ["status"]
    status = harness.get(SANDBOX_CLAIM, NAMESPACE, "job")["status"]
    assert status["sandbox"] == {"name": "job", "podIPs": ["10.0.0.9"]}
    assert status["previewURL"] == "https://job.preview.example/"
    assert (ready_of(harness)["status"], ready_of(harness)["reason"]) == ("True", "DependenciesReady")
    assert startups(c.LAUNCH_COLD) == before + 1

    await harness.run(SANDBOX_CLAIM, NAMESPACE, "job")
    assert harness.writes() == [] and startups(c.LAUNCH_COLD) == before + 1

    # The Sandbox loses its Pod's IP: the claim's copy goes too (null in the merge patch).
    body = harness.get(SANDBOX, NAMESPACE, "job")
    del body["status"]["podIPs"]
    harness.api.put(SANDBOX, body)
    await harness.run(SANDBOX_CLAIM, NAMESPACE, "job")
    assert harness.get(SANDBOX_CLAIM, NAMESPACE, "job")["status"]["sandbox"] == {"name": "job"}


async def test_a_warm_claim_adopts_a_ready_member_of_its_pool() -> None:
    pools = Harness(WarmPoolReconciler)
    pools.put(SANDBOX_TEMPLATE, template())
    pools.put(
        SANDBOX_WARM_POOL,
        {
            "metadata": {"name": "warm", "namespace": NAMESPACE, "uid": "uid-warm"},
            "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "workspace"}},
        },
    )
    await pools.run(SANDBOX_WARM_POOL, NAMESPACE, "warm")
    (member,) = [b["metadata"]["name"] for p, b in pools.api.objects.items() if "/sandboxes/" in p]
    make_ready(pools, SANDBOX, member)

    harness = Harness(ClaimReconciler, api=pools.api)
    harness.put(SANDBOX_CLAIM, claim(warmPoolRef={"name": "warm"}))
    pools.writes()
    before = startups(c.LAUNCH_WARM)
    await harness.run(SANDBOX_CLAIM, NAMESPACE, "job")
    # The claim names its sandbox before its status says Ready (as upstream: a client that sees it Ready reads
    # the annotation at once); the first-observed stamp goes beside the adoption.
    claim_path = f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{NAMESPACE}/sandboxclaims/job"
    assert harness.writes() == [
        f"patch /apis/agents.x-k8s.io/v1beta1/namespaces/{NAMESPACE}/sandboxes/{member}",  # the adoption
        f"patch {claim_path}",  # the first-observed stamp
        f"patch {claim_path}",  # agents.x-k8s.io/sandbox-name
        f"status {claim_path}",
    ]
    adopted = harness.get(SANDBOX, NAMESPACE, member)
    assert adopted["metadata"]["ownerReferences"][0]["uid"] == "uid-job"
    assert adopted["metadata"]["labels"][c.LABEL_LAUNCH_TYPE] == c.LAUNCH_WARM
    assert ready_of(harness)["status"] == "True" and startups(c.LAUNCH_WARM) == before + 1
    annotations = harness.get(SANDBOX_CLAIM, NAMESPACE, "job")["metadata"]["annotations"]
    assert annotations[c.ANNOTATION_ASSIGNED_SANDBOX] == member
    assert harness.recorder.reasons() == ["SandboxAdopted"]


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"sandboxTemplateRef": {"name": "missing"}}, c.REASON_TEMPLATE_NOT_FOUND),
        ({"warmPoolRef": {"name": "missing"}}, c.REASON_WARM_POOL_NOT_FOUND),
        ({"sandboxTemplateRef": {"name": "workspace"}, "warmpool": "missing"}, c.REASON_WARM_POOL_NOT_FOUND),
    ],
)
async def test_a_blocked_claim_says_why_in_ready(spec: dict[str, Any], reason: str) -> None:
    harness = Harness(ClaimReconciler)
    harness.put(SANDBOX_TEMPLATE, template())
    harness.put(SANDBOX_CLAIM, claim(**spec))
    assert await harness.run(SANDBOX_CLAIM, NAMESPACE, "job") is None
    ready = ready_of(harness)
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("False", reason, 1)
    assert "sandbox" not in harness.get(SANDBOX_CLAIM, NAMESPACE, "job")["status"]
    # The first-observed stamp (a metadata patch), then the status.
    assert [w.split()[0] for w in harness.writes()] == ["patch", "status"]
    stamped = harness.get(SANDBOX_CLAIM, NAMESPACE, "job")["metadata"]["annotations"]
    assert stamped[c.ANNOTATION_CONTROLLER_FIRST_OBSERVED].endswith("Z")


async def test_an_expired_claim_deletes_its_sandbox_and_says_so_once() -> None:
    harness = Harness(ClaimReconciler)
    harness.put(SANDBOX_TEMPLATE, template())
    harness.put(SANDBOX_CLAIM, claim())
    await harness.run(SANDBOX_CLAIM, NAMESPACE, "job")
    body = harness.get(SANDBOX_CLAIM, NAMESPACE, "job")
    body["spec"]["lifecycle"] = {"shutdownTime": "2026-01-01T00:00:00Z", "shutdownPolicy": "Retain"}
    harness.api.put(SANDBOX_CLAIM, body)
    for _ in range(2):
        await harness.run(SANDBOX_CLAIM, NAMESPACE, "job")
    assert harness.api.body(SANDBOX, NAMESPACE, "job") is None
    assert ready_of(harness)["reason"] == c.REASON_CLAIM_EXPIRED
    assert harness.recorder.reasons().count(c.REASON_CLAIM_EXPIRED) == 1
