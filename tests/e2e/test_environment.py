"""ShadowEnvironments on kind with a real Gitea Pod: a local repository with uncommitted work is uploaded,
mirrored into the environment's Gitea and installed inside the workspace from its public GitHub URL (which
git's rewrites send to that Gitea); a second environment of the same package reaches its own Gitea and not
the first one's; a broken source gets a FAIL verdict with evidence; deleting the environments leaves nothing
behind.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from shadow_operator.sdk import upload_source

from tests.e2e.cluster import (
    READY_TIMEOUT,
    Cluster,
    assert_runs_under_namespace_runtime,
    condition,
    eventually,
    is_ready,
    under_each_runtime,
)
from tests.support.hostile_repo import git

# Under runc and under gVisor (the namespace's template asks for the class; see tests/e2e/cluster.py).
pytestmark = [pytest.mark.e2e, under_each_runtime]

GROUP, VERSION, PLURAL = "shadow.dev", "v1alpha1", "shadowenvironments"
ORG = "shadowdemo"
REWRITES = [{"from": f"https://github.com/{ORG}/", "to": ORG}]
ENV_TIMEOUT = max(READY_TIMEOUT, 300.0)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def python_package(root: Path, *, broken: bool = False) -> Path:
    """A local repository of the package `shadowpkg`: VERSION committed as "committed", then changed in the
    working tree to "uncommitted" (never committed) plus an untracked module."""
    root.mkdir(parents=True)
    backend = "no_such_backend.build" if broken else "setuptools.build_meta"
    (root / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "{backend}"\n\n'
        '[project]\nname = "shadowpkg"\nversion = "0.1.0"\n\n'
        '[tool.setuptools]\npackages = ["shadowpkg"]\n'
    )
    (root / "shadowpkg").mkdir()
    (root / "shadowpkg" / "__init__.py").write_text('VERSION = "committed"\n')
    (root / ".gitignore").write_text("*.log\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "initial")
    (root / "shadowpkg" / "__init__.py").write_text('VERSION = "uncommitted"\n')
    (root / "shadowpkg" / "extra.py").write_text("EXTRA = True\n")
    (root / "debug.log").write_text("ignored\n")
    return root


def environment(
    name: str, source: dict[str, Any], commands: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "sources": [{"name": "pkg", "repo": f"{ORG}/shadowpkg", **source}],
        "workspace": {"size": "1Gi"},
        "gitea": {"persistence": {"size": "1Gi"}},
        "gitRewrites": REWRITES,
        # Small requests: the e2e cluster is one node of 2 CPUs shared with the other tests' sandboxes.
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}},
    }
    if commands:
        spec["verify"] = {"commands": commands}
    spec.update(extra)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ShadowEnvironment",
        "metadata": {"name": name},
        "spec": spec,
    }


def wait_verdict(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        env = cluster.get(namespace, PLURAL, name)
        status = (env or {}).get("status") or {}
        if status.get("failure") and status["failure"]["code"] != "Timeout":
            pytest.fail(f"environment {name} failed: {status['failure']}")
        return env if status.get("verdict") else None

    return eventually(probe, f"ShadowEnvironment {namespace}/{name} verdict", ENV_TIMEOUT)


def pod_exists(cluster: Cluster, namespace: str, name: str) -> bool:
    try:
        cluster.core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def sh(cluster: Cluster, namespace: str, sandbox: str, command: str) -> dict[str, Any]:
    with cluster.runtime(namespace, sandbox) as http:
        response = http.post("/v1/exec", json={"command": command, "timeout_seconds": 300}, timeout=330)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.fixture(scope="module")
def kubeconfig_env(cluster: Cluster) -> Iterator[None]:
    """The SDK reads the kubeconfig like kubectl does."""
    saved = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = cluster.kubeconfig
    yield
    if saved is None:
        os.environ.pop("KUBECONFIG", None)
    else:
        os.environ["KUBECONFIG"] = saved


def test_shadow_environments_end_to_end(
    cluster: Cluster, e2e_namespace: str, tmp_path: Path, timings: dict[str, float], kubeconfig_env: None
) -> None:
    ns = e2e_namespace
    good, cloned, broken = unique("env-up"), unique("env-git"), unique("env-broken")
    started = time.monotonic()
    check_import = [
        {
            "name": "import",
            "command": "cd pkg && python3 -c 'import shadowpkg, shadowpkg.extra; print(shadowpkg.VERSION)'",
        }
    ]
    for name in (good, broken):
        cluster.custom.create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, environment(name, {"upload": {}}, check_import)
        )
    result = upload_source(good, "pkg", python_package(tmp_path / "good"), namespace=ns, timeout=ENV_TIMEOUT)
    assert result["files"] >= 4
    upload_source(
        broken, "pkg", python_package(tmp_path / "broken", broken=True), namespace=ns, timeout=ENV_TIMEOUT
    )

    # The uploaded environment: Ready, the snapshot in Gitea, the verdict PASS.
    env = wait_verdict(cluster, ns, good)
    timings["environment_upload_ready_seconds"] = round(time.monotonic() - started, 2)
    status = env["status"]
    assert (condition(env, "Ready") or {}).get("status") == "True", status
    verdict = status["verdict"]
    assert verdict["result"] == "PASS", verdict
    assert verdict["evidence"]["installationHealth"]["checks"][0]["passed"], verdict
    assert "uncommitted" in verdict["evidence"]["codeExecution"]["checks"][0]["detail"]
    source = status["sources"][0]
    assert source["publicURL"] == f"https://github.com/{ORG}/shadowpkg"
    assert status["sourcesReady"] == "1/1"
    assert_runs_under_namespace_runtime(cluster, ns, good)

    # Inside the workspace, the public GitHub URL installs the uncommitted version from this Gitea.
    out = sh(
        cluster,
        ns,
        good,
        "set -e; python3 -m venv --system-site-packages /tmp/v && /tmp/v/bin/pip install -q --no-deps "
        f"--no-build-isolation git+https://github.com/{ORG}/shadowpkg && cd / && "
        "/tmp/v/bin/python -c 'import shadowpkg; print(shadowpkg.VERSION)'",
    )
    assert out["exit_code"] == 0, out
    assert out["stdout"].strip().endswith("uncommitted")
    # Only the named prefix is redirected.
    other = sh(cluster, ns, good, "git config --get-urlmatch url.insteadOf https://github.com/someone-else/x")
    assert other["exit_code"] == 1

    # A change in the workspace shows in the diff against the baseline taken after the copy-in.
    sh(cluster, ns, good, "echo 'VERSION = \"changed in shadow\"' > pkg/shadowpkg/__init__.py")
    with cluster.runtime(ns, good) as http:
        diff = http.get("/v1/diff").json()
    assert "pkg/shadowpkg/__init__.py" in str(diff)

    # A second environment of the same package: the same snapshot commit (deterministic), in its own Gitea.
    # Its workspace reaches that Gitea and never the first environment's (real git over HTTP, enforced
    # NetworkPolicy). Left alone, it is suspended when idle (its Pod goes, its volume stays) and resumes.
    url = f"http://{good}-gitea.{ns}.svc.cluster.local:3000/{ORG}/shadowpkg.git"
    cluster.custom.create_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, environment(cloned, {"upload": {}}, idleTimeoutSeconds=60)
    )
    upload_source(cloned, "pkg", tmp_path / "good", namespace=ns, timeout=ENV_TIMEOUT)
    env = wait_verdict(cluster, ns, cloned)
    assert env["status"]["verdict"]["result"] == "PASS", env["status"]["verdict"]
    assert env["status"]["sources"][0]["commit"] == source["commit"]
    own = env["status"]["sources"][0]["cloneURL"]
    out = sh(cluster, ns, cloned, f"git ls-remote {own} refs/heads/main")
    assert out["exit_code"] == 0 and source["commit"] in out["stdout"], out
    out = sh(cluster, ns, cloned, f"timeout 20 git ls-remote {url}")
    assert out["exit_code"] != 0, out  # another environment's Gitea: refused or dropped

    # The broken source: FAIL, with the failing install as evidence.
    env = wait_verdict(cluster, ns, broken)
    verdict = env["status"]["verdict"]
    assert verdict["result"] == "FAIL", verdict
    install = verdict["evidence"]["installationHealth"]["checks"][0]
    assert not install["passed"] and "exit code" in install["detail"]
    assert any("installationHealth" in issue for issue in verdict["issues"])
    assert (condition(env, "Verified") or {}).get("reason") == "VerificationFailed"

    # The idle environment: suspended without losing its workspace, then resumed.
    def suspended() -> dict[str, Any] | None:
        env = cluster.get(ns, PLURAL, cloned)
        ready = condition(env, "Ready") or {}
        return env if ready.get("reason") == "Suspended" and not pod_exists(cluster, ns, cloned) else None

    env = eventually(suspended, f"{cloned} suspended after 60 s idle", 240)
    assert env["status"]["idle"]["suspendedAt"]
    cluster.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        cloned,
        {"metadata": {"annotations": {"shadow.dev/resume-requested": "1"}}},
    )
    eventually(
        lambda: is_ready(cluster.get(ns, PLURAL, cloned)) or None,
        f"{cloned} Ready again after resume",
        ENV_TIMEOUT,
    )
    # The workspace survived: the copy's HEAD is the local repository's, its snapshot commit is there.
    out = sh(cluster, ns, cloned, f"git -C pkg rev-parse HEAD && git -C pkg cat-file -t {source['commit']}")
    assert out["stdout"].split() == [git(tmp_path / "good", "rev-parse", "HEAD"), "commit"], out

    # Deleting the environments removes everything they created.
    for name in (good, cloned, broken):
        cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    def leftovers() -> list[str]:
        names = (good, cloned, broken)
        found = [
            f"pod/{p.metadata.name}"
            for p in cluster.core.list_namespaced_pod(ns).items
            if p.metadata.name.startswith(names)
        ]
        found += [
            f"pvc/{p.metadata.name}"
            for p in cluster.core.list_namespaced_persistent_volume_claim(ns).items
            if any(n in p.metadata.name for n in names)
        ]
        found += [
            f"secret/{s.metadata.name}"
            for s in cluster.core.list_namespaced_secret(ns).items
            if s.metadata.name.startswith(names)
        ]
        found += [
            f"service/{s.metadata.name}"
            for s in cluster.core.list_namespaced_service(ns).items
            if s.metadata.name.startswith(names)
        ]
        found += [
            f"sandbox/{s['metadata']['name']}"
            for s in cluster.list(ns, "sandboxes")
            if s["metadata"]["name"].startswith(names)
        ]
        return found

    def nothing_left() -> bool | None:
        return True if not leftovers() else None

    eventually(nothing_left, "every child of the deleted environments to be gone", 180)
