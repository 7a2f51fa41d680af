#!/usr/bin/env python3
"""runc and gVisor side by side, on the kind cluster of `make e2e` (RuntimeClass gvisor, images on the node).

One namespace, two copies of the chart's `workspace` template: `workspace-runc` (the node's default runtime)
and `workspace-gvisor` (runtimeClassName gvisor). Each run claims one sandbox of each, interleaved, and
measures through the SDK what a web app or an agent sees:

  cold start       claim created -> the watch delivers Ready (a new Pod: sandbox, container, runtime up)
  first command    Ready -> the output of `echo` (the runtime reached through the API server's pod proxy)
  exec             --execs calls of `true`, each a round trip through the pod proxy (p50 / p90)
  CPU-bound        Python summing squares (--loop iterations), timed inside the sandbox
  processes        a shell starting `/bin/true` --spawns times (fork + exec: system calls gVisor serves itself)

Percentiles are nearest-rank. The namespace is made and deleted.

    .venv/bin/python hack/bench/runtime_class_bench.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parent))
from first_command_bench import EXT, KIND_KUBECONFIG, RELEASE_NAMESPACE, percentile, scratch_namespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "operator"))
from shadow_operator.sdk import SandboxClient

RUNTIMES = {"runc": None, "gvisor": "gvisor"}


def timed(sandbox: Any, command: str) -> float:
    """Seconds the command took, measured inside the sandbox (its last line of output)."""
    script = f"import subprocess, time; t = time.perf_counter(); {command}; print(time.perf_counter() - t)"
    result = sandbox.commands.run(f"python3 -c '{script}'")
    if result.exit_code != 0:
        raise SystemExit(f"{command!r} failed: {result!r}")
    return float(result.stdout.strip().splitlines()[-1])


def one_run(sdk: SandboxClient, namespace: str, runtime: str, args: argparse.Namespace) -> dict[str, Any]:
    marker = uuid.uuid4().hex
    started = time.perf_counter()
    sandbox = sdk.create_sandbox(
        namespace=namespace, template=f"workspace-{runtime}", sandbox_ready_timeout=300
    )
    ready = time.perf_counter()
    first = sandbox.commands.run(f"echo {marker}")
    done = time.perf_counter()
    if marker not in first.stdout:
        raise SystemExit(f"the first command's output is not its marker: {first!r}")
    kernel = sandbox.commands.run("cat /proc/version").stdout
    if ("gvisor" in kernel) != (runtime == "gvisor"):
        raise SystemExit(f"{runtime} sandbox reports kernel {kernel!r}")
    execs = []
    for _ in range(args.execs):
        t0 = time.perf_counter()
        sandbox.commands.run("true")
        execs.append(time.perf_counter() - t0)
    cpu = timed(sandbox, f"sum(i * i for i in range({args.loop}))")
    spawn = timed(
        sandbox, f'subprocess.run(["sh", "-c", "for i in $(seq {args.spawns}); do /bin/true; done"])'
    )
    sandbox.terminate()
    return {"cold": ready - started, "first": done - ready, "execs": execs, "cpu": cpu, "spawn": spawn}


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    def stat(runtime: str, key: str) -> tuple[float, float]:
        values = [v for r in results[runtime] for v in (r[key] if key == "execs" else [r[key]])]
        return percentile(values, 0.5), percentile(values, 0.9)

    rows = [
        ("cold start: claim -> Ready", "cold", 1000, "ms"),
        ("first command: Ready -> output", "first", 1000, "ms"),
        (f"exec `true` through the pod proxy ({args.execs} per run)", "execs", 1000, "ms"),
        (f"CPU-bound: Python sum of {args.loop:,} squares", "cpu", 1, "s"),
        (f"processes: {args.spawns} x fork+exec of /bin/true", "spawn", 1, "s"),
    ]
    print(f"\n{args.runs} runs per runtime; p50 (p90)")
    print("| measure | runc | gVisor | gVisor / runc |\n|---|---:|---:|---:|")
    for label, key, scale, unit in rows:
        (r50, r90), (g50, g90) = stat("runc", key), stat("gvisor", key)
        fmt = "{:.0f}" if unit == "ms" else "{:.2f}"
        runc = f"{fmt.format(r50 * scale)} ({fmt.format(r90 * scale)}) {unit}"
        gvisor = f"{fmt.format(g50 * scale)} ({fmt.format(g90 * scale)}) {unit}"
        print(f"| {label} | {runc} | {gvisor} | {g50 / r50:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--execs", type=int, default=50)
    parser.add_argument("--loop", type=int, default=5_000_000)
    parser.add_argument("--spawns", type=int, default=200)
    args = parser.parse_args()

    os.environ["KUBECONFIG"] = KIND_KUBECONFIG
    api = config.new_client_from_config(config_file=KIND_KUBECONFIG)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    try:
        client.NodeV1Api(api).read_runtime_class("gvisor")
    except ApiException as exc:
        raise SystemExit(
            f"RuntimeClass gvisor: {exc.reason} (hack/kind/cluster.sh creates it where runsc runs)"
        ) from None
    with scratch_namespace(core, "bench-runtime") as namespace:
        template = custom.get_namespaced_custom_object(
            *EXT, RELEASE_NAMESPACE, "sandboxtemplates", "workspace"
        )
        for runtime, runtime_class in RUNTIMES.items():
            spec = template["spec"]
            spec["podTemplate"]["spec"].pop("runtimeClassName", None)
            if runtime_class:
                spec["podTemplate"]["spec"]["runtimeClassName"] = runtime_class
            custom.create_namespaced_custom_object(
                *EXT, namespace, "sandboxtemplates",
                {"apiVersion": "/".join(EXT), "kind": "SandboxTemplate",
                 "metadata": {"name": f"workspace-{runtime}"}, "spec": spec},
            )  # fmt: skip
        results: dict[str, list[dict[str, Any]]] = {runtime: [] for runtime in RUNTIMES}
        with SandboxClient(namespace=namespace) as sdk:
            for i in range(args.runs):
                for runtime in RUNTIMES:
                    r = one_run(sdk, namespace, runtime, args)
                    results[runtime].append(r)
                    print(
                        f"{runtime} {i + 1}: cold {r['cold'] * 1000:.0f} ms, first {r['first'] * 1000:.0f} ms, "
                        f"exec p50 {percentile(r['execs'], 0.5) * 1000:.0f} ms, cpu {r['cpu']:.2f} s, "
                        f"spawn {r['spawn']:.2f} s"
                    )
        report(results, args)


if __name__ == "__main__":
    main()
