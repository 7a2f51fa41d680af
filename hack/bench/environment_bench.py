#!/usr/bin/env python3
"""ShadowEnvironment create -> Ready on the kind cluster of `make e2e` (images present), phase by phase.

Each run makes a local git repository of about --size-mib MiB (a Python package, incompressible data files,
an uncommitted change), creates a ShadowEnvironment with that repository as an upload source, uploads it with
the SDK as soon as the workspace is ready, and follows the environment's status until it is Ready and
verified. Times are taken by the client (status polled every 50 ms), from just before the create request:

  workspace   WorkspaceReady=True (workspace Pod scheduled, volume provisioned, runtime Ready)
  gitea pod   the Gitea Pod Ready (its readiness probe: /api/healthz)
  bootstrap   GiteaReady=True (token, organizations, repositories) minus the Gitea Pod Ready
  upload      the client's upload call (waits for the workspace, then streams the archive)
  sources     SourcesReady=True (snapshot commit pushed to Gitea, baseline captured)
  ready       Ready=True: the figure of the issue's target (p50 <= 10 s for a 10 MiB source)
  verified    the verdict written (source checks, pip install from the rewritten URL)

    .venv/bin/python hack/bench/environment_bench.py --runs 5 --size-mib 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))
from shadow_operator.sdk import upload_source  # noqa: E402

GROUP, VERSION, PLURAL = "shadow.dev", "v1alpha1", "shadowenvironments"
PHASES = ("workspace", "gitea pod", "bootstrap", "upload", "sources", "ready", "verified")


def git(cwd: Path, *args: str) -> None:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd),
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@example.com",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@example.com",
    }
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def make_source(root: Path, size_mib: int) -> Path:
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "benchpkg"\nversion = "0.1.0"\n\n[tool.setuptools]\npackages = ["benchpkg"]\n'
    )
    (root / "benchpkg").mkdir()
    (root / "benchpkg" / "__init__.py").write_text('VERSION = "committed"\n')
    data = root / "data"
    data.mkdir()
    for i in range(size_mib):
        (data / f"blob-{i:03d}.bin").write_bytes(os.urandom(1 << 20))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "initial")
    (root / "benchpkg" / "__init__.py").write_text('VERSION = "uncommitted"\n')
    return root


def condition_true(env: dict[str, Any], type_: str) -> bool:
    return any(
        c["type"] == type_ and c["status"] == "True"
        for c in (env.get("status") or {}).get("conditions") or []
    )


def one_run(
    api: client.ApiClient, namespace: str, size_mib: int, work: Path, timeout: float
) -> dict[str, float]:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    name = f"bench-{uuid.uuid4().hex[:6]}"
    source = make_source(work / name, size_mib)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ShadowEnvironment",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"name": "pkg", "repo": "bench/benchpkg", "upload": {}}],
            "workspace": {"size": "1Gi"},
            "gitRewrites": [{"from": "https://github.com/bench/", "to": "bench"}],
        },
    }
    marks: dict[str, float] = {}
    errors: list[BaseException] = []
    t0 = time.monotonic()
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def upload() -> None:
        try:
            upload_source(name, "pkg", source, namespace=namespace, timeout=timeout)
            marks["upload"] = time.monotonic() - t0
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    uploader = threading.Thread(target=upload, daemon=True)
    uploader.start()
    try:
        while time.monotonic() - t0 < timeout:
            if errors:
                raise errors[0]
            env = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            now = time.monotonic() - t0
            for phase, cond in (
                ("workspace", "WorkspaceReady"),
                ("gitea", "GiteaReady"),
                ("sources", "SourcesReady"),
                ("ready", "Ready"),
            ):
                if phase not in marks and condition_true(env, cond):
                    marks[phase] = now
            if "gitea pod" not in marks:
                try:
                    pod = core.read_namespaced_pod(f"{name}-gitea-0", namespace)
                    if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []):
                        marks["gitea pod"] = now
                except ApiException:
                    pass
            failure = (env.get("status") or {}).get("failure")
            if failure:
                raise RuntimeError(f"{name}: {failure}")
            if (env.get("status") or {}).get("verdict"):
                marks["verified"] = now
                if env["status"]["verdict"]["result"] != "PASS":
                    raise RuntimeError(f"{name}: verdict {json.dumps(env['status']['verdict'])}")
                break
            time.sleep(0.05)
        else:
            raise TimeoutError(f"{name} not verified in {timeout}s: marks {marks}")
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    marks["bootstrap"] = marks["gitea"] - marks.get("gitea pod", marks["gitea"])
    return {phase: marks[phase] for phase in PHASES if phase in marks}


KIND_KUBECONFIG = os.environ.get("KUBECONFIG") or str(
    Path.home() / ".cache" / "shadow-operator" / "kind" / "kubeconfig"
)


def kind_api(kubeconfig: str) -> client.ApiClient:
    """A client of the cluster; the SDK calls of the benchmarks read KUBECONFIG too."""
    os.environ["KUBECONFIG"] = kubeconfig
    return config.new_client_from_config(config_file=kubeconfig)


def ensure_namespace(api: client.ApiClient, namespace: str) -> None:
    """The namespace, with a copy of the chart's default SandboxTemplate `workspace` (idempotent)."""
    core, ext = client.CoreV1Api(api), client.CustomObjectsApi(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except ApiException as exc:
        if exc.status != 409:
            raise
    template = ext.get_namespaced_custom_object(
        "extensions.agents.x-k8s.io", "v1beta1", "shadow-system", "sandboxtemplates", "workspace"
    )
    try:
        ext.create_namespaced_custom_object(
            "extensions.agents.x-k8s.io",
            "v1beta1",
            namespace,
            "sandboxtemplates",
            {
                "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                "kind": "SandboxTemplate",
                "metadata": {"name": "workspace"},
                "spec": template["spec"],
            },
        )
    except ApiException as exc:
        if exc.status != 409:
            raise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size-mib", type=int, default=10)
    parser.add_argument("--namespace", default="bench-env")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--kubeconfig", default=KIND_KUBECONFIG)
    args = parser.parse_args()
    api = kind_api(args.kubeconfig)
    ensure_namespace(api, args.namespace)
    results = []
    with tempfile.TemporaryDirectory() as work:
        for i in range(args.runs):
            marks = one_run(api, args.namespace, args.size_mib, Path(work), args.timeout)
            results.append(marks)
            print(f"run {i + 1}: " + ", ".join(f"{k} {v:.2f}s" for k, v in marks.items()), flush=True)
    print(f"\n{args.runs} runs, {args.size_mib} MiB source; seconds from the create request:\n")
    print("| phase | p50 | min | max |")
    print("|---|---:|---:|---:|")
    for phase in PHASES:
        values = [r[phase] for r in results if phase in r]
        if values:
            print(f"| {phase} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
