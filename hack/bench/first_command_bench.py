#!/usr/bin/env python3
"""Claim -> first command's output through the SDK, on the kind cluster of `make e2e` (images on the node).

What a web app or an agent framework sees: `SandboxClient.create_sandbox(...)` (a SandboxClaim, watched until
Ready) and then `sandbox.commands.run("echo ...")` returning its output (the runtime reached through the API
server's pod proxy). Two forms, each --runs times, one after the other:

  warm   the claim names a SandboxWarmPool of the default template that is Ready (--pool sandboxes): the
         operator adopts a running sandbox; the pool is let refill before the next run
  cold   the claim names the template: a new Pod starts (image already on the node)

With --burst N, a third form instead, as a web app meets a burst of new sessions: a SandboxWarmPool of N+1
(--pool, when larger), and once all of it is Ready, N claims one after another, each timed from before its create
to its first command's output, without waiting for the pool to refill in between (the refill's new Pods start
meanwhile); the sandboxes are kept until the burst ends, then deleted.

Per run: claim (create request until the watch delivers Ready), first command (run call until its output),
and their sum. Percentiles are nearest-rank. A namespace of its own with a copy of the chart's template is
made and deleted.

    .venv/bin/python hack/bench/first_command_bench.py --runs 10
    .venv/bin/python hack/bench/first_command_bench.py --burst 10      # pool of 11, 10 claims in a row
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))

from shadow_operator.sdk import SandboxClient  # noqa: E402

EXT = ("extensions.agents.x-k8s.io", "v1beta1")
RELEASE_NAMESPACE = os.environ.get("SHADOW_RELEASE_NAMESPACE", "sandbox-platform")
KIND_KUBECONFIG = os.environ.get("KUBECONFIG") or str(
    Path.home() / ".cache" / "shadow-operator" / "kind" / "kubeconfig"
)


@contextmanager
def scratch_namespace(core: client.CoreV1Api, prefix: str) -> Iterator[str]:
    """A namespace of the benchmark's own (PREFIX-<random>), deleted afterwards."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        yield namespace
    finally:
        try:
            core.delete_namespace(namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def pool_ready(custom: client.CustomObjectsApi, namespace: str, pool: str, replicas: int) -> bool:
    """The pool's own Sandboxes (owned by it), Ready: not its status, which may lag an adoption."""
    sandboxes = custom.list_namespaced_custom_object("agents.x-k8s.io", "v1beta1", namespace, "sandboxes")[
        "items"
    ]
    ready = [
        s
        for s in sandboxes
        if any(
            o.get("kind") == "SandboxWarmPool" and o.get("name") == pool
            for o in s["metadata"].get("ownerReferences") or ()
        )
        and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (s.get("status") or {}).get("conditions") or ()
        )
    ]
    return len(ready) >= replicas


def wait(predicate, what: str, timeout: float = 300.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def measure(sdk: SandboxClient, namespace: str, *, keep: bool = False, **claim: str) -> tuple[float, float]:
    marker = uuid.uuid4().hex
    started = time.perf_counter()
    sandbox = sdk.create_sandbox(namespace=namespace, sandbox_ready_timeout=300, **claim)
    ready = time.perf_counter()
    result = sandbox.commands.run(f"echo {marker}")
    done = time.perf_counter()
    if marker not in result.stdout:
        raise SystemExit(f"the first command's output is not its marker: {result!r}")
    if not keep:
        sandbox.terminate()
    return ready - started, done - ready


def table(name: str, rows: list[tuple[float, float]]) -> None:
    claims, commands = [r[0] for r in rows], [r[1] for r in rows]
    totals = [a + b for a, b in rows]
    print(f"\n{name}: {len(rows)} runs, milliseconds")
    print("| span | p50 | p90 | p99 | min | max |\n|---|---:|---:|---:|---:|---:|")
    for label, values in (("claim Ready", claims), ("first command", commands), ("total", totals)):
        ms = [percentile(values, q) * 1000 for q in (0.5, 0.9, 0.99)]
        print(
            f"| {label} | {ms[0]:.0f} | {ms[1]:.0f} | {ms[2]:.0f} | {min(values) * 1000:.0f} | {max(values) * 1000:.0f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--pool", type=int, default=2, help="warm pool size")
    parser.add_argument(
        "--burst", type=int, default=0, metavar="N", help="N claims in a row from a pool of N+1"
    )
    args = parser.parse_args()
    if args.burst:
        args.pool = max(args.pool, args.burst + 1)

    os.environ["KUBECONFIG"] = KIND_KUBECONFIG
    api = config.new_client_from_config(config_file=KIND_KUBECONFIG)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    pool = "warm"
    with scratch_namespace(core, "bench-first") as namespace:
        template = custom.get_namespaced_custom_object(
            *EXT, RELEASE_NAMESPACE, "sandboxtemplates", "workspace"
        )
        custom.create_namespaced_custom_object(
            *EXT, namespace, "sandboxtemplates",
            {"apiVersion": "/".join(EXT), "kind": "SandboxTemplate", "metadata": {"name": "workspace"}, "spec": template["spec"]},
        )  # fmt: skip
        custom.create_namespaced_custom_object(
            *EXT, namespace, "sandboxwarmpools",
            {"apiVersion": "/".join(EXT), "kind": "SandboxWarmPool", "metadata": {"name": pool},
             "spec": {"replicas": args.pool, "sandboxTemplateRef": {"name": "workspace"}}},
        )  # fmt: skip
        with SandboxClient(namespace=namespace) as sdk:
            if args.burst:
                wait(lambda: pool_ready(custom, namespace, pool, args.pool), f"warm pool {pool} Ready")
                burst: list[tuple[float, float]] = []
                for i in range(args.burst):
                    burst.append(measure(sdk, namespace, keep=True, warmpool=pool))
                    print(
                        f"burst {i + 1}: claim {burst[-1][0] * 1000:.0f} ms, command {burst[-1][1] * 1000:.0f} ms"
                    )
                sdk.delete_all()
                table(f"burst ({args.burst} claims in a row from a Ready pool of {args.pool})", burst)
                return
            warm: list[tuple[float, float]] = []
            for i in range(args.runs):
                wait(lambda: pool_ready(custom, namespace, pool, args.pool), f"warm pool {pool} Ready")
                warm.append(measure(sdk, namespace, warmpool=pool))
                print(f"warm {i + 1}: claim {warm[-1][0] * 1000:.0f} ms, command {warm[-1][1] * 1000:.0f} ms")
            cold: list[tuple[float, float]] = []
            for i in range(args.runs):
                cold.append(measure(sdk, namespace, template="workspace"))
                print(f"cold {i + 1}: claim {cold[-1][0] * 1000:.0f} ms, command {cold[-1][1] * 1000:.0f} ms")
        table("warm (claim from a Ready SandboxWarmPool)", warm)
        table("cold (claim from the template, image on the node)", cold)


if __name__ == "__main__":
    main()
