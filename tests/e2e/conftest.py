"""Fixtures for end-to-end tests against the kind cluster `make e2e` sets up (see tests/e2e/cluster.py)."""

from __future__ import annotations

import fcntl
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import (
    DEFAULT_TEMPLATE,
    GVISOR_UNAVAILABLE,
    KUBECONFIG,
    OPERATOR_NAMESPACE,
    TIMINGS,
    Cluster,
    eventually,
    pod_ready,
)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if not Path(KUBECONFIG).exists():
        pytest.fail(f"no kind cluster kubeconfig at {KUBECONFIG}: run `make e2e` (it creates the cluster)")
    api = config.new_client_from_config(config_file=KUBECONFIG)
    cl = Cluster(api=api, kubeconfig=KUBECONFIG)
    eventually(lambda: [p for p in cl.operator_pods() if pod_ready(p)], "a Ready operator pod", 120)
    # The SDK, used in-process by some tests, reads the kubeconfig as kubectl does.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KUBECONFIG", KUBECONFIG)
        try:
            yield cl
        finally:
            api.close()


@pytest.fixture(scope="module")
def e2e_namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace enforcing Pod Security's restricted level, holding a copy of the chart's default
    SandboxTemplate; with a runtime class as the fixture's parameter (`under_each_runtime`), the copy's Pods
    ask for that class."""
    runtime_class = getattr(request, "param", None)
    if runtime_class and not _runtime_class_exists(cluster, runtime_class):
        why = GVISOR_UNAVAILABLE.read_text().strip() if GVISOR_UNAVAILABLE.exists() else "not created"
        pytest.skip(f"RuntimeClass {runtime_class} is not in the cluster (hack/kind/cluster.sh): {why}")
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    # As a tenant namespace the chart prepares: Pod Security's restricted level enforced (the operator labels
    # those; here the test does), so every Pod the product makes here must pass it, under each runtime.
    restricted = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}
    cluster.core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=restricted))
    )
    template = cluster.get(OPERATOR_NAMESPACE, "sandboxtemplates", DEFAULT_TEMPLATE)
    assert template is not None, (
        f"the chart's SandboxTemplate {OPERATOR_NAMESPACE}/{DEFAULT_TEMPLATE} is missing"
    )
    if runtime_class:
        template["spec"]["podTemplate"]["spec"]["runtimeClassName"] = runtime_class
    cluster.create(
        name,
        "sandboxtemplates",
        {"kind": "SandboxTemplate", "metadata": {"name": DEFAULT_TEMPLATE}, "spec": template["spec"]},
    )
    try:
        yield name
    finally:
        _cleanup(cluster, name)


def _runtime_class_exists(cluster: Cluster, name: str) -> bool:
    try:
        client.NodeV1Api(cluster.api).read_runtime_class(name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _cleanup(cluster: Cluster, namespace: str) -> None:
    # Claims first, while the operator can still run its finalizers; then the namespace.
    for claim in cluster.list(namespace, "sandboxclaims"):
        cluster.delete(namespace, "sandboxclaims", claim["metadata"]["name"])
    cluster.core.delete_namespace(namespace)


@pytest.fixture(scope="session")
def timings() -> Iterator[dict[str, float]]:
    """Durations measured by the tests, merged into ~/.cache/shadow-operator/e2e-timings.json (make e2e runs
    the tests in several processes: each merges its own under a lock)."""
    measured: dict[str, float] = {}
    yield measured
    if measured:
        TIMINGS.parent.mkdir(parents=True, exist_ok=True)
        with open(TIMINGS.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                merged = json.loads(TIMINGS.read_text())
            except (OSError, ValueError):
                merged = {}
            merged.update(measured)
            TIMINGS.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
