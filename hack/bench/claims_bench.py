#!/usr/bin/env python3
"""SandboxClaim startup latency: warm-pool adoption vs cold start, measured side by side in one run.

Starts a local control plane (etcd, kube-apiserver, controller-manager, scheduler and kwok playing the
kubelets; tests/support/controlplane.py) in a temporary directory, installs the CRDs, runs the operator as
a subprocess, fills a SandboxWarmPool and then creates claims at a fixed rate:

  warm: v1beta1 claims with `warmPoolRef` to the ready pool (adoption of a warm sandbox)
  cold: v1alpha1 claims with `sandboxTemplateRef` (a Sandbox created from the template)

Latency of one claim = from just before its create request to the moment a watch on sandboxclaims delivers
the claim with condition Ready=True (the same span as upstream's `agent_sandbox_claim_startup_latency_ms`,
seen from the client). Upstream's kwok scale check (pool 1050, 75 claims/s for 10 s) passes with
P50 <= 300 ms, P90 <= 300 ms, P99 <= 500 ms.

Usage: .venv/bin/python hack/bench/claims_bench.py [--pool 60] [--claims 40] [--rate 10] [--nodes 3]
Prints the command line, the figures and a Markdown section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kubernetes import client, config, watch  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from tests.support.controlplane import ControlPlane  # noqa: E402
from tests.support.sandbox_operator import (  # noqa: E402
    CLAIM,
    POOL,
    TEMPLATE,
    Objects,
    OperatorProcess,
    install_crds,
    ready,
    template_body,
)

NAMESPACE = "default"
PHASE_LABEL = "bench.shadow.dev/phase"
UPSTREAM = {"P50": 300.0, "P90": 300.0, "P99": 500.0}


@dataclass
class Phase:
    name: str
    created: dict[str, float] = field(default_factory=dict)
    ready_at: dict[str, float] = field(default_factory=dict)
    sandbox: dict[str, str] = field(default_factory=dict)
    all_ready: threading.Event = field(default_factory=threading.Event)

    def latencies_ms(self) -> list[float]:
        return sorted((self.ready_at[n] - self.created[n]) * 1000 for n in self.created if n in self.ready_at)


class ClaimWatcher:
    """Records, in a thread, the first moment each claim is seen Ready=True on a watch (no polling)."""

    def __init__(self, api: client.ApiClient, phases: dict[str, Phase], expected: int) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.phases = phases
        self.expected = expected
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        group, plural = CLAIM
        listing = cast(
            dict[str, Any], self.custom.list_namespaced_custom_object(group, "v1beta1", NAMESPACE, plural)
        )
        self.resource_version: str = listing["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, name="claim-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        group, plural = CLAIM
        try:
            while not self.stopping.is_set():
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self.custom.list_namespaced_custom_object,
                    group,
                    "v1beta1",
                    NAMESPACE,
                    plural,
                    label_selector=PHASE_LABEL,
                    resource_version=self.resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=5,
                )
                for event in stream:
                    seen = time.monotonic()
                    obj: dict[str, Any] = event["object"]
                    self.resource_version = obj["metadata"]["resourceVersion"]
                    if event["type"] not in ("ADDED", "MODIFIED") or not ready(obj):
                        continue
                    phase = self.phases[obj["metadata"]["labels"][PHASE_LABEL]]
                    name = obj["metadata"]["name"]
                    if name not in phase.ready_at:
                        phase.ready_at[name] = seen
                        phase.sandbox[name] = ((obj.get("status") or {}).get("sandbox") or {}).get("name", "")
                        if len(phase.ready_at) == self.expected:
                            phase.all_ready.set()
                    if self.stopping.is_set():
                        break
        except BaseException as exc:  # surfaced by the main thread; a dead watcher must not hang the run
            self.error = exc
            for phase in self.phases.values():
                phase.all_ready.set()


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100), the convention of most load-test reports."""
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def create_at_rate(
    objs: Objects, phase: Phase, spec: dict[str, Any], version: str, n: int, rate: float
) -> float:
    """Create `n` claims, one every 1/rate s on a fixed schedule; return the achieved rate."""
    start = time.monotonic()
    for i in range(n):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        name = f"{phase.name}-{i:04d}"
        body = {"metadata": {"name": name, "labels": {PHASE_LABEL: phase.name}}, "spec": spec}
        phase.created[name] = time.monotonic()
        objs.create(CLAIM, body, version)
    elapsed = time.monotonic() - start
    return n / elapsed if elapsed > 0 and n > 1 else float(n)


def wait_pool(objs: Objects, size: int, timeout: float) -> float:
    started = time.monotonic()
    objs.wait(
        POOL,
        "bench",
        lambda p: (p.get("status") or {}).get("readyReplicas") == size,
        what=f"warm pool of {size} Ready",
        timeout=timeout,
    )
    return time.monotonic() - started


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="claims-bench-") as tmp:
        work = Path(tmp)
        cp = ControlPlane(directory=work / "controlplane", nodes=args.nodes, die_with_parent=True)
        operator: OperatorProcess | None = None
        watcher: ClaimWatcher | None = None
        try:
            say("starting the control plane")
            cp.start()
            api = config.new_client_from_config(config_file=str(cp.kubeconfig))  # type: ignore[no-untyped-call]
            install_crds(api)
            operator = OperatorProcess(str(cp.kubeconfig), work / "operator.log")
            say("starting the operator")
            operator.start()
            objs = Objects(api, NAMESPACE)
            objs.create(TEMPLATE, template_body("bench"))
            objs.create(
                POOL,
                {
                    "metadata": {"name": "bench"},
                    "spec": {"replicas": args.pool, "sandboxTemplateRef": {"name": "bench"}},
                },
            )
            result["pool_fill_s"] = wait_pool(objs, args.pool, args.timeout)
            say(f"warm pool of {args.pool} Ready after {result['pool_fill_s']:.1f} s")

            phases = {"warm": Phase("warm"), "cold": Phase("cold")}
            watcher = ClaimWatcher(api, phases, args.claims)
            watcher.start()
            plan = [
                ("warm", {"warmPoolRef": {"name": "bench"}}, "v1beta1"),
                ("cold", {"sandboxTemplateRef": {"name": "bench"}}, "v1alpha1"),
            ]
            for name, spec, version in plan:
                phase = phases[name]
                say(f"{name}: {args.claims} claims at {args.rate}/s")
                result[f"{name}_rate"] = create_at_rate(objs, phase, spec, version, args.claims, args.rate)
                if not phase.all_ready.wait(args.timeout):
                    raise TimeoutError(
                        f"{name}: only {len(phase.ready_at)}/{args.claims} claims Ready after {args.timeout:.0f} s"
                    )
                if watcher.error is not None:
                    raise RuntimeError("the claim watch failed") from watcher.error
                # Let the pool refill before the next phase so phases do not share a background load.
                result[f"{name}_refill_s"] = wait_pool(objs, args.pool, args.timeout)
            result["phases"] = phases
        finally:
            if watcher is not None:
                watcher.stop()
            if operator is not None:
                operator.stop()
            cp.stop()
    result["load_after"] = os.getloadavg()
    return result


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ratio_cell(value: float, limit: float) -> str:
    return f"{value / limit:.2f}x ({'meets' if value <= limit else 'misses'})"


def report(args: argparse.Namespace, command: str, started: str, result: dict[str, Any]) -> str:
    phases: dict[str, Phase] = result["phases"]
    stats: dict[str, dict[str, float]] = {}
    for name, phase in phases.items():
        lat = phase.latencies_ms()
        stats[name] = {
            "P50": percentile(lat, 50),
            "P90": percentile(lat, 90),
            "P99": percentile(lat, 99),
            "mean": statistics.fmean(lat),
            "max": lat[-1],
        }
    adopted = sum(1 for s in phases["warm"].sandbox.values() if s.startswith("bench-"))
    cold_named = sum(1 for n, s in phases["cold"].sandbox.items() if s == n)
    la_before = " / ".join(f"{x:.2f}" for x in result["load_before"])
    la_after = " / ".join(f"{x:.2f}" for x in result["load_after"])
    rows = [
        "| Claims | P50 | P90 | P99 | Mean | Max | Achieved rate |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("warm", "cold"):
        s = stats[name]
        label = (
            f"warm (`warmPoolRef`, {adopted}/{args.claims} adopted)"
            if name == "warm"
            else f"cold (v1alpha1 `sandboxTemplateRef`, {cold_named}/{args.claims} created)"
        )
        rows.append(
            f"| {label} | {s['P50']:.0f} ms | {s['P90']:.0f} ms | {s['P99']:.0f} ms | {s['mean']:.0f} ms "
            f"| {s['max']:.0f} ms | {result[name + '_rate']:.1f}/s |"
        )
    ratios = " | ".join(f"{stats['warm'][q] / stats['cold'][q]:.2f}" for q in ("P50", "P90", "P99"))
    rows.append(f"| warm / cold | {ratios} | | | |")
    for name in ("warm", "cold"):
        cells = " | ".join(ratio_cell(stats[name][q], UPSTREAM[q]) for q in ("P50", "P90", "P99"))
        rows.append(f"| {name} / upstream threshold (300 / 300 / 500 ms) | {cells} | | | |")
    return "\n".join(
        [
            f"Command: `{command}` ({started}; load average 1/5/15 min {la_before} before, {la_after} after;"
            f" {os.cpu_count()} cores shared with other sessions).",
            f"Warm pool of {args.pool} filled in {result['pool_fill_s']:.1f} s; {args.claims} claims per phase at"
            f" {args.rate:g}/s, warm phase first, the pool refilled ({result['warm_refill_s']:.1f} s) before the"
            f" cold phase; {args.nodes} kwok nodes.",
            "",
            *rows,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pool", type=int, default=60, help="warm pool replicas (default 60)")
    parser.add_argument("--claims", type=int, default=40, help="claims per phase, warm and cold (default 40)")
    parser.add_argument("--rate", type=float, default=10.0, help="claims created per second (default 10)")
    parser.add_argument("--nodes", type=int, default=3, help="kwok fake nodes (110 pods each; default 3)")
    parser.add_argument("--timeout", type=float, default=180.0, help="per-wait timeout in seconds")
    args = parser.parse_args(argv)
    if args.claims < 1 or args.rate <= 0 or args.pool < args.claims:
        parser.error("need --claims >= 1, --rate > 0 and --pool >= --claims (every warm claim adopts)")
    # Pool, its refill after the warm phase and the cold claims all hold pods; kwok nodes take 110 each.
    if args.pool + 2 * args.claims > 110 * args.nodes:
        parser.error(
            f"--pool + 2 x --claims pods do not fit on {args.nodes} nodes of 110 pods: raise --nodes"
        )

    # SIGTERM/SIGHUP unwind through the finally blocks that stop the operator and the control plane.
    def interrupted(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)

    command = shlex.join([".venv/bin/python", "hack/bench/claims_bench.py", *(argv or sys.argv[1:])])
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"$ {command}", flush=True)
    try:
        result = run(args)
    except (TimeoutError, RuntimeError, ApiException, AssertionError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    print(report(args, command, started, result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
