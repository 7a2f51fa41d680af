#!/usr/bin/env python3
"""Wake on the first request, on the kind cluster of `make e2e` (images on the node): how long a request for a
sandbox suspended for idleness waits.

One claim of a copy of the chart's template with a dev server beside the runtime (`python3 -m http.server
3000`, started with the Pod) and autoSuspendPolicy 10 s (the shortest the API allows), in the release
namespace (served by the router). Each run waits until the operator suspended it (Suspended=True reason Idle,
its Pod gone), then times one request:

  preview   a GET through the router (kubectl port-forward to its Service) to the first byte of the answer:
            held while the router asks for the resume and the Pod starts
  exec      `sandbox.commands.run("true")` through the SDK (pod proxy) until it returns: the SDK finds the
            sandbox asleep, asks for the resume, waits (watching) for Ready, runs

Percentiles are nearest-rank. The claim and the template are deleted at the end.

    .venv/bin/python hack/bench/wake_bench.py --runs 10
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))

from shadow_operator.sdk import SandboxClient  # noqa: E402

GROUP, EXT, VERSION = "agents.x-k8s.io", "extensions.agents.x-k8s.io", "v1beta1"
NAMESPACE = os.environ.get("SHADOW_RELEASE_NAMESPACE", "sandbox-platform")
ROUTER = os.environ.get("SHADOW_ROUTER_SERVICE", "sandboxes-shadow-operator-preview-router")
DOMAIN = os.environ.get("SHADOW_PREVIEW_DOMAIN", "preview.localhost")
KIND_KUBECONFIG = os.environ.get("KUBECONFIG") or str(
    Path.home() / ".cache" / "shadow-operator" / "kind" / "kubeconfig"
)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def wait(predicate: Callable[[], bool], what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def conditions(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (body.get("status") or {}).get("conditions") or ()}


@contextmanager
def port_forward(target: str, port: int) -> Iterator[str]:
    proc = subprocess.Popen(
        ["kubectl", "--kubeconfig", KIND_KUBECONFIG, "-n", NAMESPACE, "port-forward", target, f":{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        match = re.search(r"127\.0\.0\.1:(\d+)", proc.stdout.readline())
        if not match:
            raise SystemExit(f"kubectl port-forward {target} failed")
        yield f"http://127.0.0.1:{match.group(1)}"
    finally:
        proc.terminate()
        proc.wait(10)


def table(rows: dict[str, list[float]]) -> None:
    print("\n| request on a sleeping sandbox | runs | p50 | p90 | p99 | min | max |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, values in rows.items():
        if not values:
            continue
        ms = [percentile(values, q) * 1000 for q in (0.5, 0.9, 0.99)]
        print(
            f"| {label} | {len(values)} | {ms[0]:.0f} | {ms[1]:.0f} | {ms[2]:.0f} | "
            f"{min(values) * 1000:.0f} | {max(values) * 1000:.0f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10, help="runs of each kind")
    args = parser.parse_args()
    os.environ["KUBECONFIG"] = KIND_KUBECONFIG
    api = config.new_client_from_config(config_file=KIND_KUBECONFIG)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    name = f"wake-bench-{uuid.uuid4().hex[:6]}"
    template = custom.get_namespaced_custom_object(EXT, VERSION, NAMESPACE, "sandboxtemplates", "workspace")
    spec = copy.deepcopy(template["spec"])
    pod = spec["podTemplate"]["spec"]
    runtime = pod["containers"][0]
    pod["containers"].append(
        {
            "name": "dev",
            "image": runtime["image"],
            "imagePullPolicy": runtime.get("imagePullPolicy", "IfNotPresent"),
            "command": ["python3", "-m", "http.server", "3000", "--directory", "/tmp"],
            "ports": [{"name": "preview", "containerPort": 3000, "protocol": "TCP"}],
            **({"securityContext": runtime["securityContext"]} if runtime.get("securityContext") else {}),
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        }
    )
    body = {
        "apiVersion": f"{EXT}/{VERSION}",
        "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": spec,
    }
    custom.create_namespaced_custom_object(EXT, VERSION, NAMESPACE, "sandboxtemplates", body)
    claim = {
        "apiVersion": f"{EXT}/{VERSION}",
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"sandboxTemplateRef": {"name": name}, "autoSuspendPolicy": {"suspendThresholdSeconds": 10}},
    }
    custom.create_namespaced_custom_object(EXT, VERSION, NAMESPACE, "sandboxclaims", claim)
    rows: dict[str, list[float]] = {"preview, to the first byte": [], "exec through the SDK": []}
    try:

        def claim_ready() -> bool:
            got = custom.get_namespaced_custom_object(EXT, VERSION, NAMESPACE, "sandboxclaims", name)
            return conditions(got).get("Ready", {}).get("status") == "True"

        wait(claim_ready, "the claim to be Ready")
        got = custom.get_namespaced_custom_object(EXT, VERSION, NAMESPACE, "sandboxclaims", name)
        sandbox = (got["status"].get("sandbox") or {}).get("name") or name

        def asleep() -> bool:
            body = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "sandboxes", sandbox)
            suspended = conditions(body).get("Suspended", {})
            if suspended.get("status") != "True" or suspended.get("reason") != "Idle":
                return False
            return not core.list_namespaced_pod(NAMESPACE, field_selector=f"metadata.name={sandbox}").items

        with port_forward(f"svc/{ROUTER}", 80) as router, SandboxClient(namespace=NAMESPACE) as sdk:
            host = {"Host": f"{sandbox}.{DOMAIN}"}
            for run in range(args.runs):
                wait(asleep, "the sandbox to be suspended")
                started = time.perf_counter()
                with httpx.stream("GET", f"{router}/", headers=host, timeout=60) as response:
                    first = next(response.iter_raw(), b"")
                    took = time.perf_counter() - started
                if response.status_code != 200 or not first:
                    raise SystemExit(f"preview run {run}: {response.status_code}")
                rows["preview, to the first byte"].append(took)
                print(f"preview {run}: {took * 1000:.0f} ms", flush=True)
            for run in range(args.runs):
                wait(asleep, "the sandbox to be suspended")
                started = time.perf_counter()
                result = sdk.get_sandbox(name).commands.run("true")
                took = time.perf_counter() - started
                if result.exit_code != 0:
                    raise SystemExit(f"exec run {run}: {result}")
                rows["exec through the SDK"].append(took)
                print(f"exec {run}: {took * 1000:.0f} ms", flush=True)
    finally:
        table(rows)
        custom.delete_namespaced_custom_object(EXT, VERSION, NAMESPACE, "sandboxclaims", name)
        custom.delete_namespaced_custom_object(EXT, VERSION, NAMESPACE, "sandboxtemplates", name)


if __name__ == "__main__":
    main()
