#!/usr/bin/env python3
"""Added latency of the preview router, side by side in one run: the same upstream reached directly and through
the router (public preview, and private preview with a cookie, whose auth answer nginx caches).

Built from the integration harness: the real nginx with the config the chart renders and router-auth as a real
process (`tests.support.router`), against a real local API server (`tests.support.controlplane`) holding a
public and a private Sandbox written as the operator would; the upstream is an aiohttp server on loopback in a
process of its own (the one the router tests use), so the client's process measures only the client.

Each round sends one GET on each of three keep-alive connections, in an order that rotates per round; the
percentiles are over all rounds after the warm-up, and "added" is the router's percentile minus the direct one.

Usage: .venv/bin/python hack/bench/router_bench.py [--rounds 3000] [--warmup 300]
Prints a Markdown section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from aiohttp import web  # noqa: E402
from kubernetes import client, config  # noqa: E402
from shadow_operator.common.tokens import KeyRing  # noqa: E402

from tests.support.controlplane import ControlPlane, free_port  # noqa: E402
from tests.support.router import Box, managed_sandbox, running_router, upstream_app  # noqa: E402
from tests.support.sandbox_operator import install_crds  # noqa: E402

DOMAIN = "preview.bench"
KEY = b"b" * 32
PUBLIC_IP, PRIVATE_IP = "127.0.0.2", "127.0.0.3"


def serve_upstream(port: int) -> None:
    web.run_app(
        upstream_app("upstream"), host=[PUBLIC_IP, PRIVATE_IP], port=port, access_log=None, print=None
    )


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Target:
    def __init__(self, label: str, address: str, port: int, host: str, headers: dict[str, str]) -> None:
        self.label, self.host, self.headers = label, host, headers
        self.connection = http.client.HTTPConnection(address, port, timeout=10)
        self.samples: list[float] = []

    def get(self, record: bool) -> None:
        started = time.perf_counter()
        self.connection.request("GET", "/page", headers={"Host": self.host, **self.headers})
        response = self.connection.getresponse()
        response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"{self.label}: {response.status}")
        if record:
            self.samples.append(elapsed * 1000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=300)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="router-bench-"))
    plane = ControlPlane(directory=work / "controlplane", die_with_parent=True)
    print("starting the local control plane...", file=sys.stderr)
    plane.start()
    upstream_port = free_port()
    upstream = multiprocessing.get_context("fork").Process(target=serve_upstream, args=(upstream_port,))
    upstream.start()
    try:
        api = config.new_client_from_config(config_file=str(plane.kubeconfig))
        install_crds(api)
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": namespace}})
        public = Box("public", PUBLIC_IP, upstream_port, free_port(), "t-public")
        private = Box("private", PRIVATE_IP, upstream_port, free_port(), "t-private")
        managed_sandbox((custom, core), namespace, public)
        private_uid = managed_sandbox((custom, core), namespace, private, private=True)["metadata"]["uid"]
        values = [
            "--set=previewRouter.enabled=true",
            f"--set=previewRouter.domain={DOMAIN}",
            "--set=previewRouter.scheme=http",
            f"--set=previewRouter.sandboxNamespaces={{{namespace}}}",
        ]
        (work / "router").mkdir()
        with running_router(work / "router", str(plane.kubeconfig), values) as router:
            (router.keys_dir / "k1").write_bytes(KEY)
            cookie = "shadow_preview=" + KeyRing({"k1": KEY}).for_namespace(namespace).sign(
                namespace, "private", private_uid, 3600
            )
            direct = Target("direct", PUBLIC_IP, upstream_port, PUBLIC_IP, {})
            targets = [
                direct,
                Target("router, public", "127.0.0.1", router.preview_port, f"public.{DOMAIN}", {}),
                Target(
                    "router, private (cookie)",
                    "127.0.0.1",
                    router.preview_port,
                    f"private.{DOMAIN}",
                    {"Cookie": cookie},
                ),
            ]
            deadline = time.monotonic() + 30  # the keys file is read again every few seconds
            while True:
                try:
                    for target in targets:
                        target.get(record=False)
                    break
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            for number in range(args.warmup + args.rounds):
                shift = number % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    target.get(record=number >= args.warmup)
    finally:
        upstream.terminate()
        upstream.join(10)
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)

    load = os.getloadavg()[0]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    python = platform.python_version()
    print("## Preview router: added latency\n")
    print(
        f"Command: `.venv/bin/python hack/bench/router_bench.py --rounds {args.rounds} --warmup {args.warmup}` "
        f"({os.cpu_count()} cores, {when}, Python {python}, load average {load:.1f})\n"
    )
    print("| Path | p50 | p99 | added p50 | added p99 | Target |")
    print("|---|---|---|---|---|---|")
    base50, base99 = percentile(direct.samples, 0.5), percentile(direct.samples, 0.99)
    for target in targets:
        p50, p99 = percentile(target.samples, 0.5), percentile(target.samples, 0.99)
        if target is direct:
            print(f"| {target.label} (reference) | {p50:.3f} ms | {p99:.3f} ms |  |  |  |")
        else:
            print(
                f"| {target.label} | {p50:.3f} ms | {p99:.3f} ms | {p50 - base50:+.3f} ms "
                f"| {p99 - base99:+.3f} ms | <= 1 ms p50 added |"
            )
    spread = statistics.pstdev(direct.samples)
    print(
        f"\n{args.rounds} interleaved rounds after {args.warmup} warm-up; client: http.client, one keep-alive "
        f"connection per path; direct standard deviation {spread:.3f} ms."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
