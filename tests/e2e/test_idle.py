"""A real sandbox on kind goes to sleep when nobody uses it and wakes on the resume annotation (issue 30): its
Pod goes and its requests are freed, its spec is untouched, and the runtime answers again after the resume."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.e2e.cluster import DEFAULT_TEMPLATE, Cluster, condition, eventually, is_ready

pytestmark = pytest.mark.e2e

THRESHOLD = 15


def test_idle_sandbox_suspends_and_resumes_on_the_annotation(cluster: Cluster, e2e_namespace: str) -> None:
    ns, name = e2e_namespace, f"nap-{uuid.uuid4().hex[:6]}"
    spec = {
        "sandboxTemplateRef": {"name": DEFAULT_TEMPLATE},
        "autoSuspendPolicy": {"suspendThresholdSeconds": THRESHOLD},
    }
    sandbox = cluster.sandbox_of(
        cluster.wait_claim_ready(ns, cluster.claim(ns, name, spec)["metadata"]["name"])
    )
    first = cluster.core.read_namespaced_pod(sandbox, ns)
    with cluster.runtime(ns, sandbox) as http:  # a runtime call: the idle clock starts again after it
        assert http.post("/v1/exec", json={"argv": ["true"]}).json()["exit_code"] == 0

    def suspended() -> dict[str, Any] | None:
        box = cluster.get(ns, "sandboxes", sandbox)
        gone = not cluster.core.list_namespaced_pod(ns, field_selector=f"metadata.name={sandbox}").items
        cond = condition(box, "Suspended") or {}
        return box if gone and cond.get("status") == "True" and cond.get("reason") == "Idle" else None

    box = eventually(suspended, f"{sandbox} suspended after {THRESHOLD}s idle", THRESHOLD + 90)
    assert (condition(box, "Ready") or {}).get("reason") == "Suspended"
    assert box["spec"]["operatingMode"] == "Running" and box["status"]["idle"]["suspendedAt"]

    cluster.custom.patch_namespaced_custom_object(
        "agents.x-k8s.io",
        "v1beta1",
        ns,
        "sandboxes",
        sandbox,
        {"metadata": {"annotations": {"shadow.dev/resume-requested": uuid.uuid4().hex}}},
    )
    eventually(lambda: is_ready(cluster.get(ns, "sandboxes", sandbox)) or None, f"{sandbox} Ready again", 120)
    second = cluster.core.read_namespaced_pod(sandbox, ns)
    assert second.metadata.uid != first.metadata.uid
    with cluster.runtime(ns, sandbox) as http:
        assert http.post("/v1/exec", json={"argv": ["echo", "awake"]}).json()["stdout"] == "awake\n"
