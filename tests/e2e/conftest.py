"""Fixtures for end-to-end tests against the kind cluster `make e2e` sets up (see tests/e2e/cluster.py)."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import (
    GVISOR_UNAVAILABLE,
    KUBECONFIG,
    TIMINGS,
    Cluster,
    eventually,
    pod_ready,
    tenant_namespace,
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
    """A fresh tenant namespace (`tenant_namespace`); with a runtime class as the fixture's parameter
    (`under_each_runtime`), the copy of the default SandboxTemplate there asks for that class."""
    runtime_class = getattr(request, "param", None)
    if runtime_class and not _runtime_class_exists(cluster, runtime_class):
        why = GVISOR_UNAVAILABLE.read_text().strip() if GVISOR_UNAVAILABLE.exists() else "not created"
        pytest.skip(f"RuntimeClass {runtime_class} is not in the cluster (hack/kind/cluster.sh): {why}")
    with tenant_namespace(cluster, runtime_class=runtime_class) as name:
        yield name


def _runtime_class_exists(cluster: Cluster, name: str) -> bool:
    try:
        client.NodeV1Api(cluster.api).read_runtime_class(name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


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
