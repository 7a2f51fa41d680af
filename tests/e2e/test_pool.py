"""ShadowEnvironmentPool on kind, as a team uses it: `kubectl apply` a pool; `shadowctl create --pool` an
environment that takes a started workspace and Gitea (its verdict PASS: the copy-in pushed to the taken Gitea,
and the workspace installed from it through the rewrite and the NetworkPolicy); the pool refills and the SDK's
`ShadowGateway(..., pool=)` takes the next; `kubectl scale` empties it; deleting everything leaves nothing.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from shadow_operator.sdk import ShadowGateway

from tests.e2e.cluster import Cluster, eventually
from tests.e2e.test_cli_sdk import ORG, REQUESTS, TIMEOUT, assert_clean, ctl, ok, repositories

pytestmark = pytest.mark.e2e

POOLS = "shadowenvironmentpools"


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        ["kubectl", "--kubeconfig", cluster.kubeconfig, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def ready_instances(cluster: Cluster, namespace: str, pool: str, count: int) -> dict[str, object]:
    def probe() -> dict[str, object] | None:
        status = (cluster.get(namespace, POOLS, pool) or {}).get("status") or {}
        return status if status.get("readyReplicas") == count and status.get("replicas") == count else None

    return eventually(probe, f"pool {pool} with {count} Ready instances", 300)


def test_an_environment_from_a_pool(cluster: Cluster, e2e_namespace: str, tmp_path: Path) -> None:
    ns, name = e2e_namespace, f"pooled-{uuid.uuid4().hex[:6]}"
    pool = {
        "apiVersion": "shadow.dev/v1alpha1",
        "kind": "ShadowEnvironmentPool",
        "metadata": {"name": "warm", "namespace": ns},
        "spec": {
            "replicas": 1,
            "gitRewrites": [{"from": f"https://github.com/{ORG}/", "to": ORG}],
            "resources": {"requests": dict(REQUESTS)},
        },
    }
    kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(pool))
    ready_instances(cluster, ns, "warm", 1)
    [instance] = json.loads(
        kubectl(cluster, "get", "sandboxes", "-n", ns, "-l", "shadow.dev/pool=warm", "-o", "json")
    )["items"]
    started = time.monotonic()

    core, _ = repositories(tmp_path)
    status = json.loads(
        ok(ctl(cluster, "create", name, "-n", ns, "--pool", "warm", "--local", f"{core}:{ORG}/core", "--timeout", TIMEOUT, "-o", "json"))
    )["status"]  # fmt: skip
    took = time.monotonic() - started
    assert status["pool"]["adopted"] is True, status["pool"]
    assert status["sandbox"] == instance["metadata"]["name"]
    assert status["verdict"]["result"] == "PASS", status["verdict"]
    assert status["giteaURL"].startswith(f"http://{instance['metadata']['name']}-gitea.")
    print(f"created from the pool, uploaded and verified in {took:.1f}s")

    # It works like any environment: exec in the taken workspace.
    assert (
        ok(ctl(cluster, "exec", name, "-n", ns, "--", "cat", "core/core/__init__.py"))
        == 'VERSION = "uncommitted"\n'
    )

    # The pool started another, which an agent framework takes from Python (the SDK's twin of --pool).
    ready_instances(cluster, ns, "warm", 1)
    with ShadowGateway(f"{name}-sdk", core, namespace=ns, pool="warm") as shadow:
        env = shadow.start(timeout=float(TIMEOUT))
        assert env.status is not None and env.status.pool is not None and env.status.pool.adopted
        assert env.status.verdict is not None and env.status.verdict.result == "PASS"
        shadow.stop()

    # `kubectl scale` to 0 removes the spare one and leaves the environment alone.
    ready_instances(cluster, ns, "warm", 1)
    kubectl(cluster, "scale", "shadowenvironmentpool/warm", "-n", ns, "--replicas=0")
    ready_instances(cluster, ns, "warm", 0)
    assert kubectl(cluster, "get", "sandboxes", "-n", ns, "-l", "shadow.dev/pool=warm", "-o", "name") == ""
    assert ok(ctl(cluster, "exec", name, "-n", ns, "--", "true")) == ""

    ok(ctl(cluster, "destroy", name, "-n", ns))
    kubectl(cluster, "delete", "shadowenvironmentpool/warm", "-n", ns, "--wait")
    assert_clean(cluster, ns)
