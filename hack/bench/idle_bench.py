#!/usr/bin/env python3
"""Idle sandboxes free their Pods and requests (issue 30), on the kind cluster of `make e2e`: the node's
allocated requests, as `kubectl describe node` shows them, before, with every sandbox Ready, and after the
operator suspended them all for idleness; and how long that took.

`--count` Sandboxes (100) in a namespace of their own, with the chart's default template's Pod and small
requests (`--cpu`, `--memory`; shrunk to what the node has free, so none waits for room). They are created
with autoSuspendPolicy 600 s, so that none goes to sleep before the last one is Ready; then every policy is
lowered to 10 s (the shortest the API allows) at once: each sandbox has been idle since it became Ready, so
the operator suspends all of them at its next look. Timed from that patch: every Sandbox Suspended=True reason
Idle, and every Pod gone (deleted with operator.idleSuspend.gracePeriodSeconds). The namespace is deleted at
the end.

    .venv/bin/python hack/bench/idle_bench.py --count 100
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.utils import parse_quantity

GROUP, EXT, VERSION = "agents.x-k8s.io", "extensions.agents.x-k8s.io", "v1beta1"
NAMESPACE = os.environ.get("SHADOW_RELEASE_NAMESPACE", "sandbox-platform")
KIND_KUBECONFIG = os.environ.get("KUBECONFIG") or str(
    Path.home() / ".cache" / "shadow-operator" / "kind" / "kubeconfig"
)
SLEEPY = 10  # the shortest threshold the API allows
AWAKE = 600  # long enough for the last sandbox to start before the first would sleep


def wait(predicate: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def condition(body: dict[str, Any], kind: str) -> dict[str, Any]:
    found = (x for x in (body.get("status") or {}).get("conditions") or () if x.get("type") == kind)
    return next(found, {})


def describe(node: str) -> str:
    """The node's `Allocatable`, `Non-terminated Pods` and `Allocated resources` lines of kubectl describe."""
    out = subprocess.run(
        ["kubectl", "--kubeconfig", KIND_KUBECONFIG, "describe", "node", node],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    allocatable = re.search(r"^Allocatable:\n((?:  .*\n)+)", out, re.M)
    pods = re.search(r"^Non-terminated Pods:\s+\((\d+) in total\)", out, re.M)
    allocated = re.search(r"^Allocated resources:\n(?:.*\n){3}((?:  \S.*\n)+)", out, re.M)
    keep = [f"non-terminated pods: {pods.group(1) if pods else '?'}"]
    for block in (allocatable, allocated):
        if block:
            keep += [" ".join(line.split()) for line in block.group(1).splitlines() if line.strip()]
    return "\n".join(keep)


def requested(core: client.CoreV1Api, node: str) -> tuple[float, float, int]:
    """CPU cores, memory bytes and Pods requested on the node by its non-terminated Pods."""
    cpu = memory = 0.0
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    live = [p for p in pods if p.status.phase not in ("Succeeded", "Failed")]
    for pod in live:
        for container in pod.spec.containers:
            wanted = (container.resources and container.resources.requests) or {}
            cpu += float(parse_quantity(wanted.get("cpu", "0")))
            memory += float(parse_quantity(wanted.get("memory", "0")))
    return cpu, memory, len(live)


def sandbox_body(name: str, pod: dict[str, Any], threshold: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": pod, "autoSuspendPolicy": {"suspendThresholdSeconds": threshold}},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=100, help="sandboxes")
    parser.add_argument("--cpu", default="10m", help="CPU request of each sandbox (at most)")
    parser.add_argument("--memory", default="32Mi", help="memory request of each sandbox (at most)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for each phase")
    args = parser.parse_args()
    api = config.new_client_from_config(config_file=KIND_KUBECONFIG)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    nodes = core.list_node().items
    if len(nodes) != 1:
        raise SystemExit(f"expected the one-node kind cluster of make e2e, found {len(nodes)} nodes")
    node = nodes[0].metadata.name
    allocatable = nodes[0].status.allocatable
    used_cpu, used_memory, used_pods = requested(core, node)
    free_pods = int(allocatable["pods"]) - used_pods
    if free_pods < args.count:
        print(
            f"the node has room for {free_pods} more Pods (max-pods): {free_pods} sandboxes, not {args.count}"
        )
        args.count = free_pods
    # Small requests that fit: never more than a tenth of what is free shared out, so none waits for room.
    cpu = min(
        float(parse_quantity(args.cpu)),
        (float(parse_quantity(allocatable["cpu"])) - used_cpu) * 0.9 / args.count,
    )
    memory = min(
        float(parse_quantity(args.memory)),
        (float(parse_quantity(allocatable["memory"])) - used_memory) * 0.9 / args.count,
    )
    cpu_request, memory_request = f"{max(1, int(cpu * 1000))}m", f"{max(16, int(memory / 2**20))}Mi"

    template = custom.get_namespaced_custom_object(EXT, VERSION, NAMESPACE, "sandboxtemplates", "workspace")
    pod = copy.deepcopy(template["spec"]["podTemplate"])
    pod["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": cpu_request, "memory": memory_request},
        "limits": {"memory": "256Mi"},
    }
    namespace = f"idle-bench-{uuid.uuid4().hex[:6]}"
    restricted = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace, labels=restricted)))
    names = [f"idle-{n:03d}" for n in range(args.count)]
    figures: list[tuple[str, str]] = [("before", describe(node))]
    print(
        f"{args.count} sandboxes in {namespace} on {node}, each requesting cpu {cpu_request}, memory "
        f"{memory_request}\n\nbefore:\n{figures[0][1]}\n",
        flush=True,
    )

    def sandboxes() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes"
        )["items"]
        return items

    def count(check: Callable[[dict[str, Any]], bool]) -> int:
        return sum(1 for box in sandboxes() if check(box))

    def ready(box: dict[str, Any]) -> bool:
        return condition(box, "Ready").get("status") == "True"

    def asleep(box: dict[str, Any]) -> bool:
        found = condition(box, "Suspended")
        return found.get("status") == "True" and found.get("reason") == "Idle"

    try:
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda name: custom.create_namespaced_custom_object(
                        GROUP, VERSION, namespace, "sandboxes", sandbox_body(name, pod, AWAKE)
                    ),
                    names,
                )
            )
        wait(lambda: count(ready) == args.count, f"{args.count} sandboxes Ready", args.timeout)
        all_ready = time.monotonic() - started
        figures.append(("all Ready", describe(node)))
        print(f"all {args.count} Ready after {all_ready:.1f} s:\n{figures[-1][1]}\n", flush=True)

        lowered = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda name: custom.patch_namespaced_custom_object(
                        GROUP,
                        VERSION,
                        namespace,
                        "sandboxes",
                        name,
                        {"spec": {"autoSuspendPolicy": {"suspendThresholdSeconds": SLEEPY}}},
                    ),
                    names,
                )
            )
        wait(lambda: count(asleep) == args.count, "every sandbox Suspended (Idle)", args.timeout)
        all_suspended = time.monotonic() - lowered
        wait(lambda: not core.list_namespaced_pod(namespace).items, "every Pod gone", args.timeout)
        all_gone = time.monotonic() - lowered
        figures.append(("all suspended", describe(node)))
        print(
            f"all {args.count} Suspended (Idle) {all_suspended:.1f} s after the threshold was lowered to "
            f"{SLEEPY} s, every Pod gone after {all_gone:.1f} s:\n{figures[-1][1]}\n",
            flush=True,
        )
        pvc = core.list_namespaced_persistent_volume_claim(namespace).items
        secrets = core.list_namespaced_secret(namespace).items
        print(f"kept: {len(pvc)} PVCs, {len(secrets)} Secrets; Sandboxes {len(sandboxes())}")
    finally:
        core.delete_namespace(namespace)
        wait(
            lambda: namespace not in {n.metadata.name for n in core.list_namespace().items},
            f"namespace {namespace} to be deleted",
            300,
        )
        print(f"namespace {namespace} deleted")


if __name__ == "__main__":
    main()
