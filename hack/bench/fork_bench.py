#!/usr/bin/env python3
"""Fork time on the kind cluster of `make e2e`: snapshot vs copy, 10 MiB vs 1 GiB workspaces, 1 vs 10 clones.

For each workspace size, one source environment is created on the StorageClass `shadow-snapshots` (our CSI
host-path driver; on reflink XFS its snapshots and restores are copy-on-write) and filled to the size inside
its workspace (1 MiB files of random data, plus the uploaded source). Then, side by side on that same source
and storage class, forks are made with spec.workspace.from.method Auto (a VolumeSnapshot: the class exists)
and Copy (a tar stream between the two runtimes), the way `shadowctl fork` makes them. Forks run no Gitea and
no verification, so what is timed is the clone: from the fork request (a shared snapshot's flush and creation
included) to the fork's Cloned condition turning True (its workspace Pod Ready on the restored volume, or the
copy streamed in), polled every 50 ms. "10 clones" is `shadowctl fork --count 10`: one flushed snapshot of the
source that all ten restore (Auto), or ten copies (Copy); timed until the last is cloned. Each round starts
once the previous round's forks and their Pods are gone: their teardown would share the node's two cores.

    .venv/bin/python hack/bench/fork_bench.py --sizes 10,1024 --runs 3 --clones 10
    .venv/bin/python hack/bench/fork_bench.py --sizes 10 --runs 5 --clones 10 --clone-runs 5 --methods Auto
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))
from shadow_operator.sdk import environment as envops  # noqa: E402
from shadow_operator.sdk import fork as forkops  # noqa: E402
from shadow_operator.sdk import kube, upload_source  # noqa: E402
from shadow_operator.sdk import runtime as rtops  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from environment_bench import KIND_KUBECONFIG, ensure_namespace, kind_api  # noqa: E402

GROUP, VERSION, PLURAL = "shadow.dev", "v1alpha1", "shadowenvironments"
STORAGE_CLASS = "shadow-snapshots"
REQUESTS = {"cpu": "10m", "memory": "64Mi"}


def condition_true(env: dict[str, Any], type_: str) -> bool:
    return any(
        c["type"] == type_ and c["status"] == "True"
        for c in (env.get("status") or {}).get("conditions") or []
    )


def wait_envs(custom: client.CustomObjectsApi, ns: str, names: list[str], cond: str, timeout: float) -> float:
    """Seconds (from now) until every environment has `cond` True; a failure code raises."""
    t0, left = time.monotonic(), set(names)
    while left:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{sorted(left)} not {cond} after {timeout}s")
        for name in list(left):
            env = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
            failure = (env.get("status") or {}).get("failure")
            if failure:
                raise RuntimeError(f"{name}: {failure}")
            if condition_true(env, cond):
                left.discard(name)
        time.sleep(0.05)
    return time.monotonic() - t0


def delete_envs(custom: client.CustomObjectsApi, ns: str, names: list[str]) -> None:
    """Delete the environments and wait until they and their workspace Pods are gone, so that the next
    round does not share the node's two cores with this one's teardown."""
    for name in names:
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
        pods = client.CoreV1Api(custom.api_client).list_namespaced_pod(ns).items
        if not {i["metadata"]["name"] for i in items} & set(names) and not {
            p.metadata.name for p in pods
        } & set(names):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{names} not deleted after 300s")


def make_source(api: client.ApiClient, ns: str, size_mib: int, work: Path) -> str:
    """A Ready environment on the snapshot class holding about `size_mib` MiB."""
    custom = client.CustomObjectsApi(api)
    name = f"src-{size_mib}m-{uuid.uuid4().hex[:4]}"
    repo = work / name
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text('VERSION = "uncommitted"\n')
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ShadowEnvironment",
        "metadata": {"name": name},
        "spec": {
            "sources": [{"name": "pkg", "repo": "bench/pkg", "upload": {}}],
            "workspace": {"storageClassName": STORAGE_CLASS},
            "gitea": {"enabled": False},
            "verify": {"enabled": False},
            "resources": {"requests": REQUESTS},
        },
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    upload_source(name, "pkg", repo, namespace=ns, timeout=300)
    wait_envs(custom, ns, [name], "Ready", 300)
    fill = (
        "mkdir -p data && i=0; while [ $i -lt $N ]; do head -c 1048576 /dev/urandom > data/blob-$i.bin; "
        "i=$((i+1)); done"
    )
    with kube.connect() as http:
        env = kube.run(http, envops.get(ns, name))
        ep = kube.run(http, envops.runtime_endpoint(env))
        result = kube.run(
            http, rtops.run_command(ep, ["sh", "-c", fill], env={"N": str(size_mib)}, timeout=900)
        )
        assert result.exit_code == 0, result.stderr
    return name


def fork_round(api: client.ApiClient, ns: str, source: str, method: str, clones: int) -> tuple[float, str]:
    """Fork `clones` times at once as `shadowctl fork` does (several: one shared snapshot); seconds until
    the last fork is cloned, and the method used."""
    custom = client.CustomObjectsApi(api)
    names = [f"{source}-{method.lower()}-{uuid.uuid4().hex[:4]}" for _ in range(clones)]
    t0 = time.monotonic()
    with kube.connect() as http:
        kube.run(http, forkops.fork(ns, source, names, method=method, timeout_seconds=1800, verify=False))
    try:
        wait_envs(custom, ns, names, "Cloned", 1800)
        elapsed = time.monotonic() - t0
        used = {
            (custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, n).get("status") or {}).get(
                "cloneMethod"
            )
            for n in names
        }
    finally:
        delete_envs(custom, ns, names)
    return elapsed, ",".join(sorted(str(u) for u in used))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,1024", help="workspace sizes in MiB, comma-separated")
    parser.add_argument("--runs", type=int, default=3, help="single forks per size and method")
    parser.add_argument(
        "--clones", type=int, default=10, help="forks made at once in the N-clone round (0: skip)"
    )
    parser.add_argument("--clone-runs", type=int, default=1, help="N-clone rounds per size and method")
    parser.add_argument(
        "--methods", default="Auto,Copy", help="spec.workspace.from.method values, comma-separated"
    )
    parser.add_argument("--namespace", default="bench-fork")
    parser.add_argument("--kubeconfig", default=KIND_KUBECONFIG)
    args = parser.parse_args()
    api = kind_api(args.kubeconfig)
    custom = client.CustomObjectsApi(api)
    ensure_namespace(api, args.namespace)
    rows: list[tuple[str, str, int, list[float], str]] = []
    with tempfile.TemporaryDirectory() as work:
        for size in (int(s) for s in args.sizes.split(",")):
            source = make_source(api, args.namespace, size, Path(work))
            try:
                for clones in sorted({1, args.clones} - {0}):
                    for method in args.methods.split(","):
                        times, used = [], ""
                        for _ in range(args.runs if clones == 1 else args.clone_runs):
                            elapsed, used = fork_round(api, args.namespace, source, method, clones)
                            times.append(elapsed)
                            print(
                                f"{size} MiB, {clones} clone(s), {method} ({used}): {elapsed:.2f}s",
                                flush=True,
                            )
                        rows.append((f"{size} MiB", used, clones, times, method))
            finally:
                delete_envs(custom, args.namespace, [source])
    print("\n| workspace | method | clones | p50 s | min s | max s | runs |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for size_label, used, clones, times, _ in rows:
        print(
            f"| {size_label} | {used} | {clones} | {statistics.median(times):.2f} | {min(times):.2f} | "
            f"{max(times):.2f} | {len(times)} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
