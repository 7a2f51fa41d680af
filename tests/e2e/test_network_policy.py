"""The isolation the operator manages, proven on real packets: the kind cluster enforces NetworkPolicy (our
kindnetd compiles policies into nftables), and every cell below is a real connection attempt with a timeout,
made from inside a sandbox. Denied means refused or timed out; allowed means connected.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from shadow_operator.sdk import Sandbox, SandboxClient

from tests.e2e.cluster import OPERATOR_NAMESPACE, Cluster, eventually

pytestmark = pytest.mark.e2e

# Prints "open", or the reason the connection failed; exits 0 either way (the verdict is in the output).
PROBE = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    socket.create_connection((host, port), timeout=4).close()
    print("open")
except OSError as exc:
    print(type(exc).__name__)
"""
RESOLVE = "import socket, sys; print(socket.gethostbyname(sys.argv[1]))"


def probe(sandbox: Sandbox, host: str, port: int) -> str:
    result = sandbox.commands.run(["python3", "-c", PROBE, host, str(port)], timeout=30)
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


@pytest.fixture(scope="module")
def peer(cluster: Cluster) -> Iterator[dict[str, str]]:
    """A plain HTTP server (not a sandbox, so no policy of ours selects it) in a namespace of its own."""
    ns = f"e2e-peer-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    template = cluster.get(OPERATOR_NAMESPACE, "sandboxtemplates", "workspace")
    assert template is not None
    image = template["spec"]["podTemplate"]["spec"]["containers"][0]["image"]
    labels = {"app": "peer"}
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="peer", labels=labels),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="http",
                    image=image,
                    command=["python3", "-m", "http.server", "8080", "--bind", "0.0.0.0"],
                    ports=[client.V1ContainerPort(container_port=8080)],
                    resources=client.V1ResourceRequirements(requests={"cpu": "10m", "memory": "32Mi"}),
                )
            ]
        ),
    )
    cluster.core.create_namespaced_pod(ns, pod)
    service = client.V1Service(
        metadata=client.V1ObjectMeta(name="peer"),
        spec=client.V1ServiceSpec(selector=labels, ports=[client.V1ServicePort(port=8080, target_port=8080)]),
    )
    cluster.core.create_namespaced_service(ns, service)

    def running() -> str | None:
        p = cluster.core.read_namespaced_pod("peer", ns)
        ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())
        return p.status.pod_ip if ready else None

    pod_ip = eventually(running, "the peer HTTP server", 180)
    try:
        yield {"namespace": ns, "service": f"peer.{ns}.svc.cluster.local", "ip": pod_ip}
    finally:
        cluster.core.delete_namespace(ns)


@pytest.fixture(scope="module")
def sandboxes(cluster: Cluster, e2e_namespace: str, peer: dict[str, str]) -> Iterator[dict[str, Sandbox]]:
    """Two sandboxes of the default template, and one of a template whose policy allows the peer."""
    base = cluster.get(e2e_namespace, "sandboxtemplates", "workspace")
    assert base is not None
    spec: dict[str, Any] = json.loads(json.dumps(base["spec"]))
    dns = {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }
        ],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }
    to_peer = {
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": peer["namespace"]}}}],
        "ports": [{"protocol": "TCP", "port": 8080}],
    }
    operator_in = {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": OPERATOR_NAMESPACE}}}]
    }
    spec["networkPolicy"] = {"ingress": [operator_in], "egress": [dns, to_peer]}
    cluster.create(
        e2e_namespace,
        "sandboxtemplates",
        {"kind": "SandboxTemplate", "metadata": {"name": "to-peer"}, "spec": spec},
    )
    with SandboxClient(namespace=e2e_namespace, client=None) as sdk:
        made = {
            "a": sdk.create_sandbox("workspace", sandbox_ready_timeout=300),
            "b": sdk.create_sandbox("workspace", sandbox_ready_timeout=300),
            "allowed": sdk.create_sandbox("to-peer", sandbox_ready_timeout=300),
        }
        yield made


@pytest.fixture(scope="module", autouse=True)
def kubeconfig_env(cluster: Cluster) -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    mp.setenv("KUBECONFIG", cluster.kubeconfig)
    yield
    mp.undo()


def pod_ip(cluster: Cluster, namespace: str, name: str) -> str:
    ip = cluster.core.read_namespaced_pod(name, namespace).status.pod_ip
    assert ip
    return str(ip)


def test_reachability_matrix(
    cluster: Cluster, e2e_namespace: str, sandboxes: dict[str, Sandbox], peer: dict[str, str]
) -> None:
    a, b, allowed = sandboxes["a"], sandboxes["b"], sandboxes["allowed"]
    b_ip = pod_ip(cluster, e2e_namespace, b.sandbox_name)
    cells = {
        "sandbox -> another sandbox": probe(a, b_ip, 8888),
        "sandbox -> Kubernetes API (Service)": probe(a, "kubernetes.default.svc.cluster.local", 443),
        "sandbox -> cloud metadata": probe(a, "169.254.169.254", 80),
        "sandbox -> Service in another namespace": probe(a, peer["service"], 8080),
        "sandbox -> pod in another namespace": probe(a, peer["ip"], 8080),
        "sandbox whose template allows it -> that Service": probe(allowed, peer["service"], 8080),
        "that sandbox -> the same peer, another port": probe(allowed, peer["ip"], 8081),
        "that sandbox -> another sandbox": probe(allowed, b_ip, 8888),
    }
    expected = {
        "sandbox whose template allows it -> that Service": "open",
    }
    for cell, outcome in cells.items():
        if cell in expected:
            assert outcome == "open", f"{cell}: expected a connection, got {outcome}"
        else:
            assert outcome != "open", f"{cell}: expected to be refused, but it connected"

    # DNS works for every sandbox (the default policy allows cluster DNS explicitly).
    resolved = a.commands.run(["python3", "-c", RESOLVE, "kubernetes.default.svc.cluster.local"], timeout=30)
    assert resolved.exit_code == 0 and resolved.stdout.strip().count(".") == 3, resolved.stderr


def test_the_operator_and_the_api_server_still_reach_sandboxes(sandboxes: dict[str, Sandbox]) -> None:
    # Every command above went through the API server's pod proxy to the runtime: that path stays open.
    assert sandboxes["b"].commands.run(["true"]).exit_code == 0


def test_enforcement_is_on(cluster: Cluster) -> None:
    """The policies are really compiled into the node's nftables (not decoration)."""

    def applied() -> bool | None:
        logs = cluster.core.read_namespaced_pod_log(_kindnet_pod(cluster), "kube-system", tail_lines=200)
        return ("netpol: applied table" in logs) or None

    eventually(applied, "kindnetd to apply the NetworkPolicy table", 60)


def _kindnet_pod(cluster: Cluster) -> str:
    pods = cluster.core.list_namespaced_pod("kube-system", label_selector="app=kindnet").items
    assert pods, "no kindnet pod"
    return str(pods[0].metadata.name)
