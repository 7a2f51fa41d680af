#!/usr/bin/env python3
"""ShadowEnvironment create -> Ready on the kind cluster of `make e2e` (images present), phase by phase.

Each run makes a local git repository of about --size-mib MiB (a Python package, incompressible data files,
an uncommitted change), creates a ShadowEnvironment with that repository as an upload source, uploads it with
the SDK as soon as the workspace is ready, and watches the environment until it is verified (no polling).
The phases are the operator's own records (status.timings, written as each phase finishes), in seconds from
just before the create request (the client's clock; kind runs on the same host):

  scheduled       the workspace Pod bound to a node
  workspaceReady  WorkspaceReady=True (volume provisioned, runtime Ready)
  giteaReady      GiteaReady=True (Gitea's Pod Ready, token, organizations, repositories)
  upload          the client's upload call returned (measured by the client: it waits for the workspace)
  uploaded        the operator saw the upload
  copiedIn        SourcesReady=True (snapshot commit pushed to Gitea, baseline captured)
  ready           Ready=True: the figure of the issue's target
  verified        the verdict written (source checks, pip install from the rewritten URL)

    .venv/bin/python hack/bench/environment_bench.py --runs 5 --size-mib 10

With --pool N, each run is made twice, side by side: cold (as above) and from a ShadowEnvironmentPool of N
instances (spec.pool; the run waits until the pool has N Ready instances again, so each is a warm start).
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))
from shadow_operator.sdk import upload_source  # noqa: E402

GROUP, VERSION, PLURAL = "shadow.dev", "v1alpha1", "shadowenvironments"
PHASES = (
    "scheduled",
    "workspaceReady",
    "giteaReady",
    "upload",
    "uploaded",
    "copiedIn",
    "ready",
    "verified",
)


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


# What the environments and the pool share (the fields an environment must match to take an instance).
SHAPE = {
    "workspace": {"size": "1Gi"},
    "gitRewrites": [{"from": "https://github.com/bench/", "to": "bench"}],
}
POOL = "bench-pool"


def ensure_pool(api: client.ApiClient, namespace: str, replicas: int, timeout: float) -> None:
    """The pool, with `replicas` Ready instances (created or scaled; waits for them)."""
    custom = client.CustomObjectsApi(api)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ShadowEnvironmentPool",
        "metadata": {"name": POOL},
        "spec": {"replicas": replicas, **SHAPE},
    }
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "shadowenvironmentpools", body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "shadowenvironmentpools", POOL, {"spec": body["spec"]}
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pool = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "shadowenvironmentpools", POOL)
        status = pool.get("status") or {}
        if status.get("readyReplicas") == replicas and status.get("replicas") == replicas:
            return
        time.sleep(0.2)
    raise TimeoutError(f"pool {POOL} not refilled to {replicas} Ready instances in {timeout}s")


def one_run(
    api: client.ApiClient, namespace: str, size_mib: int, work: Path, timeout: float, pool: bool = False
) -> dict[str, float]:
    custom = client.CustomObjectsApi(api)
    name = f"bench-{uuid.uuid4().hex[:6]}"
    source = make_source(work / name, size_mib)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ShadowEnvironment",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"name": "pkg", "repo": "bench/benchpkg", "upload": {}}],
            **SHAPE,
            **({"pool": POOL} if pool else {}),
        },
    }
    marks: dict[str, float] = {}
    errors: list[BaseException] = []
    started = datetime.now(UTC)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def upload() -> None:
        try:
            upload_source(name, "pkg", source, namespace=namespace, timeout=timeout)
            marks["upload"] = (datetime.now(UTC) - started).total_seconds()
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)

    uploader = threading.Thread(target=upload, daemon=True)
    uploader.start()
    try:
        env = wait_verified(custom, namespace, name, timeout, errors)
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    if pool and not (env["status"].get("pool") or {}).get("adopted"):
        raise RuntimeError(f"{name} did not take a pool instance: {env['status'].get('pool')}")
    for phase, at in (env["status"].get("timings") or {}).items():
        marks[phase] = (datetime.fromisoformat(at.replace("Z", "+00:00")) - started).total_seconds()
    return {phase: marks[phase] for phase in PHASES if phase in marks}


def wait_verified(
    custom: client.CustomObjectsApi, namespace: str, name: str, timeout: float, errors: list[BaseException]
) -> dict[str, Any]:
    """Watch the environment until it has a verdict (PASS, else an error); its last body."""
    deadline = time.monotonic() + timeout
    stream = watch.Watch()
    while time.monotonic() < deadline:
        for event in stream.stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            field_selector=f"metadata.name={name}",
            timeout_seconds=max(1, int(deadline - time.monotonic())),
        ):
            if errors:
                raise errors[0]
            env: dict[str, Any] = event["object"]
            status = env.get("status") or {}
            if status.get("failure"):
                raise RuntimeError(f"{name}: {status['failure']}")
            verdict = status.get("verdict")
            if verdict:
                if verdict["result"] != "PASS":
                    raise RuntimeError(f"{name}: verdict {json.dumps(verdict)}")
                stream.stop()
                return env
    raise TimeoutError(f"{name} not verified in {timeout}s")


# The chart's release namespace on the kind cluster (hack/lib.sh), holding the default SandboxTemplate.
RELEASE_NAMESPACE = os.environ.get("SHADOW_RELEASE_NAMESPACE", "sandbox-platform")
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
        "extensions.agents.x-k8s.io", "v1beta1", RELEASE_NAMESPACE, "sandboxtemplates", "workspace"
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


def table(results: list[dict[str, float]]) -> list[str]:
    lines = ["| phase | p50 | min | max |", "|---|---:|---:|---:|"]
    for phase in PHASES:
        values = [r[phase] for r in results if phase in r]
        if values:
            lines.append(
                f"| {phase} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size-mib", type=int, default=10)
    parser.add_argument("--namespace", default="bench-env")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--kubeconfig", default=KIND_KUBECONFIG)
    parser.add_argument(
        "--pool", type=int, default=0, help="also run each from a pool of this many instances, side by side"
    )
    args = parser.parse_args()
    api = kind_api(args.kubeconfig)
    ensure_namespace(api, args.namespace)
    forms = ["cold", "pool"] if args.pool else ["cold"]
    results: dict[str, list[dict[str, float]]] = {form: [] for form in forms}
    with tempfile.TemporaryDirectory() as work:
        for i in range(args.runs):
            for form in forms:
                if form == "pool":
                    ensure_pool(api, args.namespace, args.pool, args.timeout)
                marks = one_run(api, args.namespace, args.size_mib, Path(work), args.timeout, form == "pool")
                results[form].append(marks)
                print(
                    f"run {i + 1} {form}: " + ", ".join(f"{k} {v:.2f}s" for k, v in marks.items()), flush=True
                )
    if args.pool:
        ensure_pool(api, args.namespace, 0, args.timeout)
    for form in forms:
        print(f"\n{form}: {args.runs} runs, {args.size_mib} MiB source; seconds from the create request:\n")
        print("\n".join(table(results[form])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
