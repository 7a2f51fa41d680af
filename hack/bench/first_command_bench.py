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

Per run: claim (create request until the watch delivers Ready), first command (run call until its output:
the SDK's two reads, the Sandbox and its runtime's token Secret, then the exec through the pod proxy, of which
the runtime's own count of the command's time), and their sum. Percentiles are nearest-rank. A namespace of
its own with a copy of the chart's template is made and deleted, once an earlier run's has gone.

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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Run:
    """One claim, in seconds: to Ready; the first command's reads, its exec, and the command's own time as
    the runtime measured it."""

    claim: float
    reads: float
    exec: float
    inside: float

    @property
    def command(self) -> float:
        return self.reads + self.exec

    @property
    def total(self) -> float:
        return self.claim + self.command


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


def measure(sdk: SandboxClient, namespace: str, *, keep: bool = False, **claim: str) -> Run:
    marker = uuid.uuid4().hex
    started = time.perf_counter()
    sandbox = sdk.create_sandbox(namespace=namespace, sandbox_ready_timeout=300, **claim)
    ready = time.perf_counter()
    sandbox.endpoint()  # what the first command reads first: the Sandbox and its runtime's token Secret
    found = time.perf_counter()
    result = sandbox.commands.run(f"echo {marker}")
    done = time.perf_counter()
    if marker not in result.stdout:
        raise SystemExit(f"the first command's output is not its marker: {result!r}")
    if not keep:
        sandbox.terminate()
    return Run(ready - started, found - ready, done - found, result.duration_seconds)


def table(name: str, rows: list[Run]) -> None:
    print(f"\n{name}: {len(rows)} runs, milliseconds")
    print("| span | p50 | p90 | p99 | min | max |\n|---|---:|---:|---:|---:|---:|")
    spans = (
        ("claim Ready", [r.claim for r in rows]),
        ("first command", [r.command for r in rows]),
        ("&nbsp;&nbsp;reads (Sandbox, token)", [r.reads for r in rows]),
        ("&nbsp;&nbsp;exec through the pod proxy", [r.exec for r in rows]),
        ("&nbsp;&nbsp;&nbsp;&nbsp;of which the command, in the runtime", [r.inside for r in rows]),
        ("total", [r.total for r in rows]),
    )
    for label, values in spans:
        ms = [percentile(values, q) * 1000 for q in (0.5, 0.9, 0.99)]
        print(
            f"| {label} | {ms[0]:.0f} | {ms[1]:.0f} | {ms[2]:.0f} | {min(values) * 1000:.0f} | {max(values) * 1000:.0f} |"
        )


def line(form: str, i: int, run: Run) -> str:
    return (
        f"{form} {i}: claim {run.claim * 1000:.0f} ms, command {run.command * 1000:.0f} ms (reads "
        f"{run.reads * 1000:.0f}, exec {run.exec * 1000:.0f}, in the runtime {run.inside * 1000:.0f})"
    )


def quiet(core: client.CoreV1Api, prefix: str) -> bool:
    """No namespace of an earlier run is still going away (its Pods stopping would weigh on this one)."""
    return not [n for n in core.list_namespace().items if n.metadata.name.startswith(f"{prefix}-")]


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
    wait(lambda: quiet(core, "bench-first"), "an earlier run's namespace to go")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
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
                burst: list[Run] = []
                for i in range(args.burst):
                    burst.append(measure(sdk, namespace, keep=True, warmpool=pool))
                    print(line("burst", i + 1, burst[-1]))
                sdk.delete_all()
                table(f"burst ({args.burst} claims in a row from a Ready pool of {args.pool})", burst)
                return
            warm: list[Run] = []
            for i in range(args.runs):
                wait(lambda: pool_ready(custom, namespace, pool, args.pool), f"warm pool {pool} Ready")
                warm.append(measure(sdk, namespace, warmpool=pool))
                print(line("warm", i + 1, warm[-1]))
            cold: list[Run] = []
            for i in range(args.runs):
                cold.append(measure(sdk, namespace, template="workspace"))
                print(line("cold", i + 1, cold[-1]))
        table("warm (claim from a Ready SandboxWarmPool)", warm)
        table("cold (claim from the template, image on the node)", cold)


if __name__ == "__main__":
    main()
