"""Real pods on a kind cluster: claims become running workspaces whose runtime executes commands and keeps
files; warm pools hand out pre-started sandboxes; deleting a claim removes everything it created; an
operator restart changes nothing that already exists.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import DEFAULT_TEMPLATE, FULLNAME, OPERATOR_NAMESPACE, Cluster, eventually, is_ready

pytestmark = pytest.mark.e2e

# hack/kind/deploy.sh installs the chart (release SHADOW_RELEASE) with this preview domain.
PREVIEW_DOMAIN = "preview.localhost"
ROUTER_SERVICE = f"{FULLNAME}-preview-router"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def exec_in(cluster: Cluster, namespace: str, sandbox: str, *argv: str) -> dict[str, Any]:
    with cluster.runtime(namespace, sandbox) as http:
        response = http.post("/v1/exec", json={"argv": list(argv)})
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.fixture(scope="module")
def cold_sandbox(cluster: Cluster, e2e_namespace: str, timings: dict[str, float]) -> str:
    name = unique("cold")
    started = time.monotonic()
    cluster.claim(e2e_namespace, name, {"sandboxTemplateRef": {"name": DEFAULT_TEMPLATE}})
    claim = cluster.wait_claim_ready(e2e_namespace, name)
    timings["cold_claim_ready_seconds"] = round(time.monotonic() - started, 2)
    return cluster.sandbox_of(claim)


def test_cold_claim_runs_a_command(cluster: Cluster, e2e_namespace: str, cold_sandbox: str) -> None:
    sandbox = cluster.get(e2e_namespace, "sandboxes", cold_sandbox)
    assert is_ready(sandbox), sandbox
    pod = cluster.core.read_namespaced_pod(cold_sandbox, e2e_namespace)
    assert pod.status.phase == "Running"

    result = exec_in(cluster, e2e_namespace, cold_sandbox, "sh", "-c", "echo hello from $(hostname); id -u")
    assert result["exit_code"] == 0, result
    assert result["stdout"] == f"hello from {cold_sandbox}\n1000\n"


def test_file_written_and_read_back(cluster: Cluster, e2e_namespace: str, cold_sandbox: str) -> None:
    content = f"written by the e2e test {uuid.uuid4()}\n".encode()
    with cluster.runtime(e2e_namespace, cold_sandbox) as http:
        put = http.put("/v1/files/notes/hello.txt", content=content)
        assert put.status_code == 204, put.text
        got = http.get("/v1/files/notes/hello.txt")
        assert got.status_code == 200, got.text
        assert got.content == content
        # The file is on the pod's filesystem, not only in the runtime's view of it.
        shown = http.post("/v1/exec", json={"argv": ["cat", "/workspace/notes/hello.txt"]}).json()
    assert shown["stdout"].encode() == content


def test_warm_pool_claim_adopts_a_ready_sandbox(
    cluster: Cluster, e2e_namespace: str, timings: dict[str, float]
) -> None:
    pool = unique("pool")
    cluster.create(
        e2e_namespace,
        "sandboxwarmpools",
        {
            "kind": "SandboxWarmPool",
            "metadata": {"name": pool},
            "spec": {"replicas": 1, "sandboxTemplateRef": {"name": DEFAULT_TEMPLATE}},
        },
    )

    def warm_ready() -> list[str]:
        warm = [
            s["metadata"]["name"]
            for s in cluster.list(e2e_namespace, "sandboxes")
            if is_ready(s)
            and any(
                o.get("kind") == "SandboxWarmPool" and o.get("name") == pool
                for o in s["metadata"].get("ownerReferences", [])
            )
        ]
        return warm

    warm = eventually(warm_ready, f"a Ready sandbox in warm pool {pool}")

    name = unique("warm")
    started = time.monotonic()
    cluster.claim(e2e_namespace, name, {"warmPoolRef": {"name": pool}})
    claim = cluster.wait_claim_ready(e2e_namespace, name)
    timings["warm_claim_ready_seconds"] = round(time.monotonic() - started, 2)

    adopted = cluster.sandbox_of(claim)
    assert adopted in warm, f"claim got {adopted}, not one of the warm sandboxes {warm}"
    sandbox = cluster.get(e2e_namespace, "sandboxes", adopted)
    assert sandbox is not None
    controllers = [o for o in sandbox["metadata"]["ownerReferences"] if o.get("controller")]
    assert [(o["kind"], o["name"]) for o in controllers] == [("SandboxClaim", name)]

    result = exec_in(cluster, e2e_namespace, adopted, "echo", "warm")
    assert result["stdout"] == "warm\n"
    # The pool refills to its size with a new sandbox.
    eventually(lambda: [s for s in warm_ready() if s != adopted], f"warm pool {pool} replenished")


def children(cluster: Cluster, namespace: str, sandbox: str) -> dict[str, list[str]]:
    """Every object the operator created for a sandbox, found by owner reference."""

    def owned_by(obj: Any, kind: str, name: str) -> bool:
        return any(o.kind == kind and o.name == name for o in obj.metadata.owner_references or [])

    found: dict[str, list[str]] = {"sandboxes": [], "pods": [], "services": [], "secrets": [], "pvcs": []}
    if cluster.get(namespace, "sandboxes", sandbox) is not None:
        found["sandboxes"].append(sandbox)
    for kind, items in (
        ("pods", cluster.core.list_namespaced_pod(namespace).items),
        ("services", cluster.core.list_namespaced_service(namespace).items),
        ("secrets", cluster.core.list_namespaced_secret(namespace).items),
        ("pvcs", cluster.core.list_namespaced_persistent_volume_claim(namespace).items),
    ):
        found[kind] = [o.metadata.name for o in items if owned_by(o, "Sandbox", sandbox)]
    return found


def test_deleting_the_claim_removes_every_child(cluster: Cluster, e2e_namespace: str) -> None:
    name = unique("gone")
    cluster.claim(e2e_namespace, name, {"sandboxTemplateRef": {"name": DEFAULT_TEMPLATE}})
    sandbox = cluster.sandbox_of(cluster.wait_claim_ready(e2e_namespace, name))
    before = children(cluster, e2e_namespace, sandbox)
    assert before["sandboxes"] == [sandbox]
    assert before["pods"] == [sandbox]
    assert before["services"] == [sandbox]

    cluster.delete(e2e_namespace, "sandboxclaims", name)

    def all_gone() -> bool:
        left = children(cluster, e2e_namespace, sandbox)
        return cluster.get(e2e_namespace, "sandboxclaims", name) is None and not any(left.values())

    eventually(all_gone, f"claim {name} and its children deleted ({before})")
    for secret in before["secrets"]:
        with pytest.raises(ApiException) as exc:
            cluster.core.read_namespaced_secret(secret, e2e_namespace)
        assert exc.value.status == 404


def snapshot(cluster: Cluster, namespace: str, sandbox: str) -> dict[str, Any]:
    obj = cluster.get(namespace, "sandboxes", sandbox)
    assert obj is not None
    pod = cluster.core.read_namespaced_pod(sandbox, namespace)
    service = cluster.core.read_namespaced_service(sandbox, namespace)
    return {
        "sandbox_uid": obj["metadata"]["uid"],
        "sandbox_spec": obj["spec"],
        "pod_uid": pod.metadata.uid,
        "pod_restarts": [c.restart_count for c in pod.status.container_statuses or []],
        "service_uid": service.metadata.uid,
        "ready": is_ready(obj),
    }


@pytest.mark.e2e_alone  # it kills the operator's leader: every other test would wait out the Lease
def test_operator_restart_changes_nothing(cluster: Cluster, e2e_namespace: str) -> None:
    steady = unique("steady")
    cluster.claim(e2e_namespace, steady, {"sandboxTemplateRef": {"name": DEFAULT_TEMPLATE}})
    steady_sandbox = cluster.sandbox_of(cluster.wait_claim_ready(e2e_namespace, steady))
    before = snapshot(cluster, e2e_namespace, steady_sandbox)

    # The chart runs two replicas; the leader (the Lease holder) is the one that acts. Kill it without a
    # grace period: it cannot release the Lease, so the standby takes over once the Lease expires.
    leader = eventually(cluster.operator_leader, "an operator pod holding the Lease")
    assert len(cluster.operator_pods()) == 2, "the chart runs a leader and a standby"
    # A claim created just before the leader goes away is finished by its successor.
    midway = unique("midway")
    cluster.claim(e2e_namespace, midway, {"sandboxTemplateRef": {"name": DEFAULT_TEMPLATE}})
    cluster.core.delete_namespaced_pod(leader, OPERATOR_NAMESPACE, grace_period_seconds=0)

    def new_leader() -> str | None:
        holder = cluster.operator_leader()
        return holder if holder not in (None, leader) else None

    eventually(new_leader, "the standby to take the Lease over")
    midway_sandbox = cluster.sandbox_of(cluster.wait_claim_ready(e2e_namespace, midway))

    # The claim made mid-way got exactly one sandbox and one pod.
    owned = [
        s["metadata"]["name"]
        for s in cluster.list(e2e_namespace, "sandboxes")
        if any(
            o.get("kind") == "SandboxClaim" and o.get("name") == midway
            for o in s["metadata"]["ownerReferences"]
        )
    ]
    assert owned == [midway_sandbox]
    assert children(cluster, e2e_namespace, midway_sandbox)["pods"] == [midway_sandbox]

    # The sandbox that existed before the restart was left exactly as it was.
    assert snapshot(cluster, e2e_namespace, steady_sandbox) == before
    assert is_ready(cluster.get(e2e_namespace, "sandboxclaims", steady))


def test_preview_router_serves_the_sandbox_dev_server(cluster: Cluster) -> None:
    # The chart's router maps <sandbox>.<domain> to sandboxes of the default template's namespace.
    namespace, name = OPERATOR_NAMESPACE, unique("preview")
    cluster.claim(namespace, name, {"sandboxTemplateRef": {"name": DEFAULT_TEMPLATE}})
    try:
        sandbox = cluster.sandbox_of(cluster.wait_claim_ready(namespace, name))
        marker = f"preview of {sandbox} {uuid.uuid4().hex}"
        with cluster.runtime(namespace, sandbox) as http:
            put = http.put("/v1/files/site/index.html", content=marker.encode())
            assert put.status_code == 204, put.text
            started = http.post(
                "/v1/processes", json={"argv": ["python3", "-m", "http.server", "3000"], "cwd": "site"}
            )
            assert started.status_code == 201, started.text
        status = cluster.get(namespace, "sandboxes", sandbox) or {}
        preview_url = (status.get("status") or {}).get("previewURL")
        assert preview_url == f"http://{sandbox}.{PREVIEW_DOMAIN}/"

        with (
            cluster.port_forward(namespace, f"svc/{ROUTER_SERVICE}", 80) as router,
            httpx.Client(base_url=router, timeout=10) as http,
        ):

            def routed() -> str | None:
                try:
                    response = http.get("/", headers={"Host": f"{sandbox}.{PREVIEW_DOMAIN}"})
                except httpx.HTTPError:
                    return None
                return response.text if response.status_code == 200 else None

            assert eventually(routed, f"the router serving {sandbox}.{PREVIEW_DOMAIN}", 60) == marker
            unknown = http.get("/", headers={"Host": "not-a-route.example"})
            assert unknown.status_code == 404
    finally:
        cluster.delete(namespace, "sandboxclaims", name)


def test_a_finished_workload_ends_its_claim_by_ttl_and_shutdown_policy(
    cluster: Cluster, e2e_namespace: str
) -> None:
    """A container that really exits (the kubelet reports Succeeded): the Sandbox's Finished=True PodSucceeded is
    mirrored onto the claim, and ttlSecondsAfterFinished ends the claim as its shutdownPolicy says. Retain deletes
    the Sandbox, Pod and Service and keeps the claim, Ready=False ClaimExpired, Finished kept (as upstream's
    TestSandboxClaimTTLZeroRetainPreservesFinishedConditionDuringCleanup); Delete removes the claim too."""
    default = cluster.get(e2e_namespace, "sandboxtemplates", DEFAULT_TEMPLATE)
    assert default is not None
    spec = default["spec"]
    pod_spec = spec["podTemplate"]["spec"]
    pod_spec["restartPolicy"] = "Never"
    runtime = pod_spec["containers"][0]
    runtime["command"] = ["sh", "-c", "exit 0"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        runtime.pop(probe, None)
    template = unique("oneshot")
    cluster.create(
        e2e_namespace,
        "sandboxtemplates",
        {"kind": "SandboxTemplate", "metadata": {"name": template}, "spec": spec},
    )

    def finished(obj: dict[str, Any] | None) -> bool:
        found = (obj or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "Finished" and c["reason"] == "PodSucceeded" for c in found)

    retained, deleted = unique("retain"), unique("delete")
    for name, policy in ((retained, "Retain"), (deleted, "Delete")):
        lifecycle = {"ttlSecondsAfterFinished": 2, "shutdownPolicy": policy}
        cluster.claim(e2e_namespace, name, {"sandboxTemplateRef": {"name": template}, "lifecycle": lifecycle})

    def expired_with_finished() -> dict[str, Any] | None:
        claim = cluster.get(e2e_namespace, "sandboxclaims", retained)
        ready = next(
            (c for c in (claim or {}).get("status", {}).get("conditions") or [] if c["type"] == "Ready"), {}
        )
        return claim if ready.get("reason") == "ClaimExpired" and finished(claim) else None

    claim = eventually(expired_with_finished, f"claim {retained} expired with Finished=PodSucceeded")
    assert claim["metadata"].get("deletionTimestamp") is None
    eventually(
        lambda: cluster.get(e2e_namespace, "sandboxes", retained) is None or None, f"sandbox {retained} gone"
    )
    for name in (retained, deleted):
        eventually(lambda n=name: not children(cluster, e2e_namespace, n)["pods"] or None, f"pod {name} gone")
    eventually(
        lambda: cluster.get(e2e_namespace, "sandboxclaims", deleted) is None or None, f"claim {deleted} gone"
    )
    eventually(
        lambda: cluster.get(e2e_namespace, "sandboxes", deleted) is None or None, f"sandbox {deleted} gone"
    )
    assert expired_with_finished() is not None
