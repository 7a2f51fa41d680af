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

With --concurrent N --namespaces K (many tenants at once), N environments spread over K namespaces
(bench-env-0 ...) are created at once (Gitea on emptyDir, no pool, the e2e cluster's small requests), each
uploaded as soon as its workspace is ready (8 client threads), and watched until every one has a verdict.
Reported: the time from the first create until the last verdict; each environment's own create -> verdict
(P50/P90/max, and per namespace); the PASS count; the operator's CPU seconds over the run
(`process_cpu_seconds_total` of its /metrics, read through the API server's pod proxy before and after) and
its peak resident memory (the same /metrics, sampled every second).

    .venv/bin/python hack/bench/environment_bench.py --concurrent 40 --namespaces 4 --size-mib 1
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
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


# What one environment of --concurrent asks of the node. The e2e cluster's node (2 CPUs) has about 760m of CPU
# requests left beside the chart and kube-system: with the chart's Gitea at 10m (hack/kind/deploy.sh), 40
# workspaces fit at 5m, not at 10m.
SMALL = {"requests": {"cpu": "5m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}}


def environment_body(name: str, extra: dict[str, Any]) -> dict[str, Any]:
    """A ShadowEnvironment of the benchmark's package, uploaded, with SHAPE and `extra` in its spec."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ShadowEnvironment",
        "metadata": {"name": name},
        "spec": {"sources": [{"name": "pkg", "repo": "bench/benchpkg", "upload": {}}], **SHAPE, **extra},
    }


def one_run(
    api: client.ApiClient, namespace: str, size_mib: int, work: Path, timeout: float, pool: bool = False
) -> dict[str, float]:
    custom = client.CustomObjectsApi(api)
    name = f"bench-{uuid.uuid4().hex[:6]}"
    source = make_source(work / name, size_mib)
    body = environment_body(name, {"pool": POOL} if pool else {})
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


OPERATOR_METRICS_PORT = 9090


def operator_metrics(api: client.ApiClient) -> dict[str, float]:
    """The operator pods' process figures (CPU seconds summed, resident bytes summed) from their /metrics."""
    core = client.CoreV1Api(api)
    pods = core.list_namespaced_pod(
        RELEASE_NAMESPACE, label_selector="app.kubernetes.io/component=operator"
    ).items
    found = {"cpu": 0.0, "rss": 0.0}
    for pod in pods:
        text = core.connect_get_namespaced_pod_proxy_with_path(
            f"{pod.metadata.name}:{OPERATOR_METRICS_PORT}", RELEASE_NAMESPACE, "metrics"
        )
        for line in str(text).splitlines():
            if line.startswith("process_cpu_seconds_total "):
                found["cpu"] += float(line.split()[1])
            elif line.startswith("process_resident_memory_bytes "):
                found["rss"] += float(line.split()[1])
    return found


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def concurrent_run(
    api: client.ApiClient, count: int, namespaces: int, size_mib: int, work: Path, timeout: float
) -> int:
    """--concurrent: `count` environments over `namespaces` namespaces at once; prints the figures."""
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    # Namespaces still being deleted (an e2e run's) hold node room that the environments need.
    deadline = time.monotonic() + timeout
    while any(n.status.phase == "Terminating" for n in core.list_namespace().items):
        if time.monotonic() > deadline:
            raise TimeoutError("namespaces still Terminating: the node's room is not free")
        time.sleep(2)
    spaces = [f"bench-env-{i}" for i in range(namespaces)]
    for ns in spaces:
        ensure_namespace(api, ns)
    source = make_source(work / "src", size_mib)
    wanted = {(spaces[i % namespaces], f"many-{uuid.uuid4().hex[:6]}") for i in range(count)}
    created: dict[tuple[str, str], float] = {}
    verdicts: dict[tuple[str, str], tuple[float, str]] = {}
    errors: list[str] = []
    peak = [operator_metrics(api)["rss"]]
    cpu_before = operator_metrics(api)["cpu"]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(1.0):
            with contextlib.suppress(ApiException):
                peak.append(operator_metrics(api)["rss"])

    def upload(ns: str, name: str) -> None:
        try:
            upload_source(name, "pkg", source, namespace=ns, timeout=timeout)
        except Exception as exc:  # reported with the figures
            errors.append(f"{ns}/{name}: upload: {exc}")

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    for ns, name in sorted(wanted):
        body = environment_body(name, {"resources": SMALL})
        created[(ns, name)] = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as uploads:
        for ns, name in sorted(wanted):
            uploads.submit(upload, ns, name)
        deadline = started + timeout
        stream = watch.Watch()
        while len(verdicts) < len(wanted) and time.monotonic() < deadline:
            for event in stream.stream(
                custom.list_cluster_custom_object,
                GROUP,
                VERSION,
                PLURAL,
                timeout_seconds=max(1, int(deadline - time.monotonic())),
            ):
                env: dict[str, Any] = event["object"]
                key = (env["metadata"]["namespace"], env["metadata"]["name"])
                status = env.get("status") or {}
                if key not in wanted or key in verdicts:
                    continue
                if status.get("verdict"):
                    verdicts[key] = (time.monotonic() - created[key], status["verdict"]["result"])
                elif (status.get("failure") or {}).get("code") not in (None, "Timeout"):
                    errors.append(f"{key[0]}/{key[1]}: {status['failure']}")
                    verdicts[key] = (time.monotonic() - created[key], "FAILED")
                if len(verdicts) == len(wanted):
                    stream.stop()
                    break
    elapsed = time.monotonic() - started
    done.set()
    sampler.join()
    cpu = operator_metrics(api)["cpu"] - cpu_before
    for ns, name in wanted:
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    seconds = [v[0] for v in verdicts.values()]
    passed = sum(1 for v in verdicts.values() if v[1] == "PASS")
    print(f"\n{count} environments over {namespaces} namespaces, {size_mib} MiB source each:\n")
    print("| figure | value |\n|---|---:|")
    print(f"| verdicts / PASS | {len(verdicts)} / {passed} of {count} |")
    print(f"| first create -> last verdict | {elapsed:.1f} s |")
    if seconds:
        print(
            f"| create -> verdict P50 / P90 / max | {percentile(seconds, 0.5):.1f} / "
            f"{percentile(seconds, 0.9):.1f} / {max(seconds):.1f} s |"
        )
    for ns in spaces:
        mine = [v[0] for k, v in verdicts.items() if k[0] == ns]
        if mine:
            print(f"| {ns}: P50 / max | {percentile(mine, 0.5):.1f} / {max(mine):.1f} s |")
    print(f"| operator CPU over the run | {cpu:.1f} s ({cpu / count:.2f} s per environment) |")
    print(f"| operator peak RSS | {max(peak) / 2**20:.0f} MiB |")
    for error in errors:
        print(f"error: {error}")
    return 0 if passed == count else 1


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
    parser.add_argument("--concurrent", type=int, default=0, help="this many environments at once")
    parser.add_argument("--namespaces", type=int, default=4, help="spread over this many (--concurrent)")
    args = parser.parse_args()
    api = kind_api(args.kubeconfig)
    if args.concurrent:
        with tempfile.TemporaryDirectory() as work:
            return concurrent_run(
                api, args.concurrent, args.namespaces, args.size_mib, Path(work), args.timeout
            )
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
