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

Each exec run also prints when, after the call started, watches saw the new Pod created, its address, the Pod
Ready (kubelet's readiness probe) and the Sandbox Ready (the operator's status), to show where the time goes.
`--sdk DIR` takes the SDK from another checkout's operator/ directory (the same runs with an older SDK).
Percentiles are nearest-rank. The claim and the template are deleted at the end.

    .venv/bin/python hack/bench/wake_bench.py --runs 10
    .venv/bin/python hack/bench/wake_bench.py --runs 10 --only exec --sdk /tmp/before/operator
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client, config, watch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))

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


class Timeline:
    """When watches saw the sandbox's Pod created, with an address, Ready, and the Sandbox Ready (monotonic
    seconds, in the order seen)."""

    def __init__(self, core: client.CoreV1Api, custom: client.CustomObjectsApi, sandbox: str) -> None:
        self.seen: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        selector = f"metadata.name={sandbox}"
        pods = (core.list_namespaced_pod, self._pod)
        boxes = (
            lambda ns, **kw: custom.list_namespaced_custom_object(GROUP, VERSION, ns, "sandboxes", **kw),
            self._sandbox,
        )
        for lister, note in (pods, boxes):
            threading.Thread(target=self._follow, args=(lister, note, selector), daemon=True).start()

    def _follow(self, lister: Callable[..., Any], note: Callable[[Any], list[str]], selector: str) -> None:
        while True:
            try:
                for event in watch.Watch().stream(
                    lister, NAMESPACE, field_selector=selector, timeout_seconds=300
                ):
                    now = time.monotonic()
                    if event["type"] in ("ADDED", "MODIFIED"):
                        with self.lock:
                            self.seen += [(now, what) for what in note(event["object"])]
            except client.ApiException:
                continue  # a watch too old (410): list and watch again

    def _pod(self, pod: Any) -> list[str]:
        found = ["pod created"] + (["pod address"] if pod.status.pod_ip else [])
        if any(x.type == "Ready" and x.status == "True" for x in pod.status.conditions or ()):
            found.append("pod ready")
        return found

    def _sandbox(self, body: dict[str, Any]) -> list[str]:
        return ["sandbox ready"] if conditions(body).get("Ready", {}).get("status") == "True" else []

    def phases(self, since: float) -> dict[str, float]:
        """Seconds after `since` (the old Pod gone by then) until each phase was first seen."""
        found: dict[str, float] = {}
        with self.lock:
            for at, phase in self.seen:
                if at >= since and phase not in found:
                    found[phase] = at - since
        return found


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
    parser.add_argument("--only", choices=("preview", "exec"), help="one kind of request only")
    parser.add_argument("--sdk", help="the operator/ directory whose SDK runs the exec requests")
    args = parser.parse_args()
    if args.sdk:
        sys.path.insert(0, args.sdk)
    from shadow_operator.sdk import SandboxClient

    print(f"SDK: {sys.modules['shadow_operator'].__file__}", flush=True)
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

        timeline = Timeline(core, custom, sandbox)
        phases: dict[str, list[float]] = {}
        with port_forward(f"svc/{ROUTER}", 80) as router, SandboxClient(namespace=NAMESPACE) as sdk:
            host = {"Host": f"{sandbox}.{DOMAIN}"}
            for run in range(args.runs if args.only != "exec" else 0):
                wait(asleep, "the sandbox to be suspended")
                started = time.perf_counter()
                with httpx.stream("GET", f"{router}/", headers=host, timeout=60) as response:
                    first = next(response.iter_raw(), b"")
                    took = time.perf_counter() - started
                if response.status_code != 200 or not first:
                    raise SystemExit(f"preview run {run}: {response.status_code}")
                rows["preview, to the first byte"].append(took)
                print(f"preview {run}: {took * 1000:.0f} ms", flush=True)
            for run in range(args.runs if args.only != "preview" else 0):
                wait(asleep, "the sandbox to be suspended")
                started = time.monotonic()
                result = sdk.get_sandbox(name).commands.run("true")
                took = time.monotonic() - started
                if result.exit_code != 0:
                    raise SystemExit(f"exec run {run}: {result}")
                rows["exec through the SDK"].append(took)
                seen = timeline.phases(started)
                for phase, at in seen.items():
                    phases.setdefault(phase, []).append(at)
                steps = ", ".join(
                    f"{phase} {at * 1000:.0f}" for phase, at in sorted(seen.items(), key=lambda x: x[1])
                )
                print(f"exec {run}: {took * 1000:.0f} ms ({steps})", flush=True)
    finally:
        table(rows)
        if phases:
            print(
                "\nexec runs, medians after the call started: "
                + ", ".join(f"{phase} {percentile(at, 0.5) * 1000:.0f} ms" for phase, at in phases.items())
            )
        custom.delete_namespaced_custom_object(EXT, VERSION, NAMESPACE, "sandboxclaims", name)
        custom.delete_namespaced_custom_object(EXT, VERSION, NAMESPACE, "sandboxtemplates", name)


if __name__ == "__main__":
    main()
