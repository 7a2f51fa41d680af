#!/usr/bin/env python3
"""SandboxClaim startup latency, controller CPU, memory and API traffic, one controller or several side by side.

Each run starts its own local control plane (etcd, kube-apiserver, controller-manager, scheduler and kwok
playing the kubelets; tests/support/controlplane.py) in a temporary directory, installs the CRDs, starts one
controller as a subprocess and drives one scenario against it:

  default      fill a SandboxWarmPool of --pool (template --template: `runtime`, Amicable-like with ports,
               a readiness probe and a Service; or `load-test`, upstream's ClusterLoader2 template: one
               sleeping container, no Service), then two phases of --claims claims at --rate per second:
               warm: v1beta1 claims with `warmPoolRef` to the Ready pool (adoption of a warm sandbox);
               the pool is refilled to Ready; then
               cold: v1beta1 claims with `warmPoolRef` to a second pool `cold` with 0 replicas and the same
               template, so every claim needs a new Sandbox from the template. This is how the yardstick in
               REFERENCE.md measured cold starts for both controllers, and it is the only cold form
               upstream's controller can serve here (its CRDs convert v1alpha1 through a webhook that a
               local control plane cannot reach). `--cold-form v1alpha1` measures the older form instead:
               v1alpha1 claims with `sandboxTemplateRef` (what this script measured before).
               `--cold-only` / `--warm-only` run one phase; `--duration S` makes claims = rate x S.
  --burst N    fill the pool, then create N warm claims as fast as --clients threads can; latency and the
               time from the first create until all N are Ready.
  --idle N     create N Sandboxes directly, wait until all are Ready, then measure the controller over a
               quiet window (--idle-window, 60 s): CPU seconds, RSS, API requests.
               `--suspend-after T` gives them `autoSuspendPolicy: {suspendThresholdSeconds: T}` and a real
               runtime on loopback (SHADOW_RUNTIME_API_URL, nobody calls it: idle from the start); a window
               measures the controller from all Ready until all are suspended for idleness (Pods gone), and
               the runtime's count of `/v1/health` requests says how often the controller asked it.

Latency of one claim = from just before its create request to the moment a watch on sandboxclaims delivers
the claim with its own condition Ready=True (the span of upstream's `agent_sandbox_claim_startup_latency_ms`,
seen from the client). Percentiles are nearest-rank. A pool counts as filled when --pool of its Sandboxes
carry Ready=True themselves (the pool's status.readyReplicas is not read). After the claims, the
controller's own latency histograms are read from its /metrics and printed beside them.

Upstream's kwok scale check (dev/ci/presubmits/test-e2e-scalability-kwok: ClusterLoader2's continuous-burst
scenario with its load-test template, 100 kwok nodes, a pool of 1050 Ready sandboxes, then 750 claims at
75/s from 20 clients) is `--nodes 100 --pool 1050 --rate 75 --duration 10 --warm-only --template load-test`
(give it --timeout 1200). It passes when the Go controller's `agent_sandbox_claim_controller_startup_latency_ms`
(from the controller's first sight of a claim to Ready; buckets 100, 250, 500 ms ..., quantiles interpolated)
has P50 <= 300 ms, P90 <= 300 ms, P99 <= 500 ms. The client-side span here contains that one (plus the
create request and both watch deliveries), so it is the stricter of the two. Both controllers stamp a
time on the claim (annotation agents.x-k8s.io/controller-first-observed-at), and the client also times each
claim from that stamp to seeing it Ready. The stamps differ: upstream's controller takes the time when its
informer first delivers the claim, before its work queue (so from its stamp is the span it gates on, per
claim); the operator takes it when its first reconcile of the claim starts, after its work queue, so from
its stamp leaves out the wait for a worker. Compare controllers on the client-side figure.

Besides latency, every run reports, for the controller's process tree (read from /proc): CPU seconds
(utime + stime, whole run and per phase) and peak RSS (VmHWM); and the API requests the controller sent,
by verb. The controller authenticates with a client certificate of its own (user `bench-controller`, group
system:masters) and the API server writes an audit log of that user's requests only (Metadata level, one
event per request; watches counted once), so the count excludes the benchmark client, kwok and the
kube-* components. The API server's `apiserver_request_total` cannot tell clients apart (no user label);
its total over all clients is printed for context. The control plane gets the settings of upstream's kwok
cluster: in-flight requests 2000 / 1000 mutating on the API server, and no client QPS limit worth the name
for kube-scheduler and kube-controller-manager (5000 QPS; as `kwokctl --disable-qps-limits`).

Controllers (`--controller`, repeatable; `--repeat K` alternates them K times, each run on a fresh control
plane; a side-by-side table with ratios against the first one ends the output):

  shadow              this checkout (`python -m shadow_operator run --standalone`)
  NAME=/path/checkout another checkout of this project: the same command with PYTHONPATH=<checkout>/operator,
                      against the CRDs of THIS checkout (e.g. `before=/work/before`, a `git worktree`)
  NAME=/path/binary   the Go controller of kubernetes-sigs/agent-sandbox, with its own CRDs from
                      --upstream-crds, started with the flags of upstream's kwok scalability presubmit
                      (dev/ci/presubmits/test-e2e-scalability-kwok): extensions on, leader election in
                      agent-sandbox-system, client QPS 1000 / burst 2000, 50 sandbox and 50 claim workers,
                      1 warm-pool and 1 template worker, refill batch 300 (webhook left on, as there).
                      `--upstream-flag=--x=y` appends a flag (`--operator-flag` does the same for
                      the Python controllers, which run --standalone: no leader election unless
                      `--operator-flag=--leader-elect --operator-flag=--leader-election-namespace=default`;
                      upstream's holds a Lease as in its presubmit, about one Lease update per 2 s);
                      `--operator-env=KEY=VALUE` sets their environment, e.g. SHADOW_WORKERS to give
                      them upstream's presubmit worker counts (their defaults: 16 claim, 8 sandbox).

Building upstream's controller by hand (outside this repository; nothing of it is committed here): take a
checkout of github.com/kubernetes-sigs/agent-sandbox (main of August 2026 like the yardstick; the copy used
here is commit 2fd412d of 2026-08-22), e.g. in ~/.cache/shadow-operator/upstream/agent-sandbox; from its root
`GOFLAGS=-mod=mod go build -o ~/.cache/shadow-operator/upstream/bin/agent-sandbox-controller
./cmd/agent-sandbox-controller`. Its CRDs are the YAML files in its k8s/crds/ (the default of
--upstream-crds when that checkout exists).

Pods must fit on the kwok nodes (110 each; the script refuses otherwise). Every wait has --timeout (180 s):
give large runs more (a pool of 1050 takes minutes to fill on 2 cores).

Usage: .venv/bin/python hack/bench/claims_bench.py [--pool 60] [--claims 40] [--rate 10] [--nodes 3]
       [--controller shadow --controller before=/work/before --controller upstream=/path/bin --repeat 3]
Prints the command line, each run's figures (Markdown) and, for several runs, the side-by-side table.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import datetime as dt
import json
import math
import os
import re
import shlex
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402
from kubernetes import client, config, watch  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from tests.runtime.conftest import start_server  # noqa: E402
from tests.support.controlplane import ControlPlane, free_port, wait_for  # noqa: E402
from tests.support.sandbox_operator import (  # noqa: E402
    CLAIM,
    CRD_DIR,
    OPERATOR_ENV,
    POOL,
    SANDBOX,
    TEMPLATE,
    Objects,
    condition,
    ready,
    sandbox_body,
    template_body,
)

NAMESPACE = "default"
PHASE_LABEL = "bench.shadow.dev/phase"
UPSTREAM = {"P50": 300.0, "P90": 300.0, "P99": 500.0}
PODS_PER_NODE = 110
BENCH_USER = "bench-controller"
UPSTREAM_CHECKOUT = Path.home() / ".cache/shadow-operator/upstream/agent-sandbox"
UPSTREAM_NAMESPACE = "agent-sandbox-system"
WARM_POOL_LABEL = "agents.x-k8s.io/warm-pool-sandbox"
FIRST_OBSERVED = "agents.x-k8s.io/controller-first-observed-at"  # stamped on a claim by both controllers  # on a pool's sandboxes until a claim adopts them
# The controllers' own claim latency histograms (ms), read from their metrics endpoint after the claims:
# upstream's presubmit gates on the first (from the controller's first sight of the claim to Ready); the
# second runs from the claim's creation (or its client-first-requested-at annotation) to Ready.
CONTROLLER_HISTOGRAMS = (
    "agent_sandbox_claim_controller_startup_latency_ms",
    "agent_sandbox_claim_startup_latency_ms",
)
# The flags upstream's kwok scalability presubmit starts its controller with (ports are added per run).
UPSTREAM_FLAGS = [
    "--extensions=true",
    f"--leader-election-namespace={UPSTREAM_NAMESPACE}",
    "--kube-api-qps=1000",
    "--kube-api-burst=2000",
    "--sandbox-concurrent-workers=50",
    "--sandbox-claim-concurrent-workers=50",
    "--sandbox-warm-pool-concurrent-workers=1",
    "--sandbox-template-concurrent-workers=1",
    "--sandbox-warm-pool-max-batch-size=300",
]
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["{BENCH_USER}"]
- level: None
"""
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- controllers ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Controller:
    label: str
    kind: str  # "python": a checkout of this project; "go": upstream's controller binary
    path: Path


def parse_controller(spec: str) -> Controller:
    label, sep, raw = spec.partition("=")
    if not sep:
        if spec != "shadow":
            raise ValueError(f"--controller {spec!r}: use `shadow`, NAME=/checkout or NAME=/binary")
        return Controller("shadow", "python", ROOT)
    path = Path(raw).expanduser().resolve()
    if path.is_dir():
        if not (path / "operator" / "shadow_operator").is_dir():
            raise ValueError(f"--controller {spec!r}: {path} has no operator/shadow_operator")
        return Controller(label, "python", path)
    if path.is_file() and os.access(path, os.X_OK):
        return Controller(label, "go", path)
    raise ValueError(f"--controller {spec!r}: {path} is neither a checkout nor an executable")


@dataclass
class Usage:
    cpu_s: float
    hwm_kib: int
    rss_kib: int


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            tree[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry))
    return tree


def tree_usage(root: int) -> Usage:
    """CPU seconds and memory of `root` and its descendants. CPU of reaped children is counted through the
    root's cutime/cstime; peak RSS is the sum of each live process's VmHWM (exact for one process)."""
    tree = _children()
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(tree.get(pid, []))
    cpu, hwm, rss = 0.0, 0, 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        # After the command: state ppid ... utime(14) stime(15) cutime(16) cstime(17), 1-based in stat(5).
        ticks = int(fields[11]) + int(fields[12])
        if pid == root:
            ticks += int(fields[13]) + int(fields[14])
        cpu += ticks / CLK_TCK
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                hwm += int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss += int(line.split()[1])
    return Usage(cpu, hwm, rss)


def _die_with_parent() -> None:
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


@dataclass(frozen=True)
class Quantiles:
    p50: float
    p90: float
    p99: float
    count: int


def histogram_quantiles(text: str, name: str) -> dict[str, Quantiles]:
    """P50/P90/P99 of a Prometheus histogram in exposition text, by its launch_type label (other labels
    summed), each interpolated linearly inside its bucket: what upstream's presubmit computes from the
    controller's /metrics. A quantile beyond the last finite bucket is given as that bucket's bound."""
    prefix = f"{name}_bucket{{"
    buckets: dict[str, dict[float, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        raw_labels, value = line[len(prefix) :].rsplit("}", 1)
        labels = dict(re.findall(r'(\w+)="([^"]*)"', raw_labels))
        buckets[labels.get("launch_type", "")][float(labels["le"])] += float(value.split()[0])
    out = {}
    for launch, counts in buckets.items():
        bounds = sorted(counts.items())
        total = bounds[-1][1]
        if total > 0:
            p50, p90, p99 = (_bucket_quantile(bounds, q * total) for q in (0.5, 0.9, 0.99))
            out[launch] = Quantiles(p50, p90, p99, int(total))
    return out


def _bucket_quantile(bounds: list[tuple[float, float]], rank: float) -> float:
    lower, below = 0.0, 0.0
    for upper, cumulative in bounds:
        if cumulative >= rank:
            if math.isinf(upper) or cumulative == below:
                return lower if math.isinf(upper) else upper
            return lower + (upper - lower) * (rank - below) / (cumulative - below)
        lower, below = upper, cumulative
    return lower


class ControllerProcess:
    """One controller as a subprocess, with a health URL to wait on."""

    def __init__(
        self,
        controller: Controller,
        kubeconfig: Path,
        work: Path,
        extra_flags: list[str],
        env: dict[str, str] | None = None,
    ) -> None:
        self.env = env or {}
        self.controller = controller
        self.kubeconfig = kubeconfig
        self.log = work / f"controller-{controller.label}.log"
        self.work = work
        self.extra_flags = extra_flags
        self.proc: subprocess.Popen[bytes] | None = None
        self.health_url = ""
        self.metrics_url = ""

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}
        metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        if self.controller.kind == "python":
            self.health_url = f"http://127.0.0.1:{free_port()}/healthz"
            operator_dir = str(self.controller.path / "operator")
            env.update({k: v for k, v in OPERATOR_ENV.items() if k not in self.env})  # a caller's own wins
            env["SHADOW_METRICS_PORT"] = self.env.get("SHADOW_METRICS_PORT", str(metrics_port))
            self.metrics_url = f"http://127.0.0.1:{env['SHADOW_METRICS_PORT']}/metrics"
            env["PYTHONPATH"] = os.pathsep.join(p for p in (operator_dir, env.get("PYTHONPATH")) if p)
            argv = [
                sys.executable,
                "-m",
                "shadow_operator",
                "run",
                "--standalone",
                f"--liveness={self.health_url}",
                *self.extra_flags,
            ]
            cwd = self.controller.path
        else:
            probe = free_port()
            self.health_url = f"http://127.0.0.1:{probe}/readyz"
            argv = [
                str(self.controller.path),
                *UPSTREAM_FLAGS,
                f"--metrics-bind-address=127.0.0.1:{metrics_port}",
                f"--health-probe-bind-address=127.0.0.1:{probe}",
                f"--webhook-port={free_port()}",
                f"--webhook-cert-dir={self.work / 'webhook-certs'}",
                *self.extra_flags,
            ]
            cwd = self.work
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def wait_healthy(self, timeout: float) -> None:
        def healthy() -> bool:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"the controller exited during start-up; log tail:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.health_url, timeout=1) as r:
                    return bool(r.status == 200)
            except (OSError, urllib.error.URLError):
                return False

        wait_for(healthy, timeout=timeout, what=f"{self.controller.label} at {self.health_url}", interval=0.1)

    def usage(self) -> Usage:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"the controller is not running; log tail:\n{self.log_tail()}")
        return tree_usage(self.proc.pid)

    def histograms(self) -> dict[tuple[str, str], Quantiles]:
        """The controller's own claim latency histograms (CONTROLLER_HISTOGRAMS), by launch type."""
        with urllib.request.urlopen(self.metrics_url, timeout=30) as answer:
            text = answer.read().decode()
        found = {}
        for name in CONTROLLER_HISTOGRAMS:
            for launch, q in histogram_quantiles(text, name).items():
                found[(name, launch)] = q
        return found

    def log_tail(self, lines: int = 25) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# ---- control plane with a per-user audit log -----------------------------------------------------------
class BenchControlPlane(ControlPlane):
    """The test control plane, plus an audit log of the controller's requests and upstream's in-flight limits."""

    @property
    def audit_log(self) -> Path:
        return self.directory / "audit.log"

    @property
    def controller_kubeconfig(self) -> Path:
        return self.pki / "bench-controller.kubeconfig"

    def _spawn(self, name: str, args: list[str]) -> None:
        if name == "kube-apiserver":
            policy = self.directory / "audit-policy.yaml"
            policy.write_text(AUDIT_POLICY)
            args = [
                *args,
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-maxsize=100000",
                "--max-requests-inflight=2000",
                "--max-mutating-requests-inflight=1000",
            ]
        elif name in ("kube-scheduler", "kube-controller-manager"):
            # Their default client limits (scheduler 50 QPS, controller-manager 20) would cap pod binding and
            # endpoint work below upstream's 75 claims/s; kwokctl --disable-qps-limits lifts them the same way.
            args = [*args, "--kube-api-qps=5000", "--kube-api-burst=10000"]
        super()._spawn(name, args)

    def issue_controller_kubeconfig(self) -> Path:
        """A client certificate for the controller (its own user name, so the audit policy can pick it)."""
        ca_key = serialization.load_pem_private_key((self.pki / "ca.key").read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate((self.pki / "ca.crt").read_bytes())
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                x509.NameAttribute(NameOID.COMMON_NAME, BENCH_USER),
            ]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        base = self.pki / "bench-controller"
        base.with_suffix(".key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        base.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._write_kubeconfig(self.controller_kubeconfig, base.with_suffix(".crt"), base.with_suffix(".key"))
        return self.controller_kubeconfig

    def request_totals(self) -> collections.Counter[str]:
        """apiserver_request_total summed by verb (all clients)."""
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        totals: collections.Counter[str] = collections.Counter()
        with urllib.request.urlopen(self.server + "/metrics", context=ctx, timeout=30) as r:
            for raw in r:
                line = raw.decode()
                if not line.startswith("apiserver_request_total{"):
                    continue
                labels, value = line.rsplit(" ", 1)
                verb = labels.split('verb="', 1)[1].split('"', 1)[0] if 'verb="' in labels else "?"
                totals[verb] += int(float(value))
        return totals


def audit_requests(path: Path, start: int, end: int) -> collections.Counter[str]:
    """Requests in the audit log between two byte offsets, counted by verb and by "verb resource"
    (keys with a space); a watch counts once (ResponseStarted)."""
    counts: collections.Counter[str] = collections.Counter()
    with path.open("rb") as f:
        f.seek(start)
        data = f.read(max(0, end - start))
    for line in data.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        stage, verb = event.get("stage"), event.get("verb", "?")
        if stage == "ResponseStarted" or (stage == "ResponseComplete" and verb != "watch"):
            ref = event.get("objectRef") or {}
            if "resource" in ref:
                resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            else:  # discovery and other non-resource paths
                resource = str(event.get("requestURI", "?")).split("?", 1)[0]
            counts[verb] += 1
            counts[f"{verb} {resource}"] += 1
    return counts


def by_verb(counts: collections.Counter[str]) -> collections.Counter[str]:
    return collections.Counter({k: n for k, n in counts.items() if " " not in k})


def by_resource(counts: collections.Counter[str]) -> collections.Counter[str]:
    return collections.Counter({k: n for k, n in counts.items() if " " in k})


@dataclass
class Mark:
    """The controller's CPU time and the audit log's length at one moment."""

    at: float
    cpu_s: float
    audit: int


@dataclass
class Window:
    name: str
    start: Mark
    end: Mark

    @property
    def cpu_s(self) -> float:
        return self.end.cpu_s - self.start.cpu_s

    @property
    def seconds(self) -> float:
        return self.end.at - self.start.at


# ---- load --------------------------------------------------------------------------------------------
@dataclass
class Phase:
    name: str
    created: dict[str, float] = field(default_factory=dict)
    ready_at: dict[str, float] = field(default_factory=dict)
    # From the claim's controller-first-observed-at stamp to this client seeing the claim Ready (both clocks
    # are this machine's). Upstream's controller stamps its informer's first event (its gated span, per claim);
    # the operator stamps the start of its first reconcile, after the claim waited for a worker.
    first_seen_ms: dict[str, float] = field(default_factory=dict)
    sandbox: dict[str, str] = field(default_factory=dict)
    expected: int = 0
    achieved_rate: float = 0.0
    all_ready: threading.Event = field(default_factory=threading.Event)

    def latencies_ms(self) -> list[float]:
        return sorted((self.ready_at[n] - self.created[n]) * 1000 for n in self.created if n in self.ready_at)

    def all_ready_s(self) -> float:
        """From the first create request until the last object was seen Ready."""
        return max(self.ready_at.values()) - min(self.created.values())


class ReadyWatcher:
    """Records, in a thread, the first moment each labelled object is seen Ready=True on a watch (no polling)."""

    def __init__(self, api: client.ApiClient, kind: tuple[str, str], phases: dict[str, Phase]) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.kind = kind
        self.phases = phases
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        group, plural = kind
        listing = cast(
            dict[str, Any], self.custom.list_namespaced_custom_object(group, "v1beta1", NAMESPACE, plural)
        )
        self.resource_version: str = listing["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, name="ready-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        group, plural = self.kind
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
                    seen, wall = time.monotonic(), time.time()
                    obj: dict[str, Any] = event["object"]
                    self.resource_version = obj["metadata"]["resourceVersion"]
                    if event["type"] not in ("ADDED", "MODIFIED") or not ready(obj):
                        continue
                    phase = self.phases[obj["metadata"]["labels"][PHASE_LABEL]]
                    name = obj["metadata"]["name"]
                    if name not in phase.ready_at:
                        phase.ready_at[name] = seen
                        observed = (obj["metadata"].get("annotations") or {}).get(FIRST_OBSERVED)
                        if observed:
                            first = dt.datetime.fromisoformat(observed.replace("Z", "+00:00")).timestamp()
                            phase.first_seen_ms[name] = (wall - first) * 1000
                        phase.sandbox[name] = ((obj.get("status") or {}).get("sandbox") or {}).get("name", "")
                        if len(phase.ready_at) == phase.expected:
                            phase.all_ready.set()
                    if self.stopping.is_set():
                        break
        except BaseException as exc:  # surfaced by the main thread; a dead watcher must not hang the run
            self.error = exc
            for phase in self.phases.values():
                phase.all_ready.set()

    def wait(self, phase: Phase, timeout: float) -> None:
        if not phase.all_ready.wait(timeout):
            raise TimeoutError(
                f"{phase.name}: only {len(phase.ready_at)}/{phase.expected} Ready after {timeout:.0f} s"
            )
        if self.error is not None:
            raise RuntimeError("the Ready watch failed") from self.error


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100), the convention of most load-test reports."""
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def create_all(
    kubeconfig: Path,
    kind: tuple[str, str],
    version: str,
    phase: Phase,
    n: int,
    spec: dict[str, Any],
    rate: float | None,
    clients: int,
) -> None:
    """Create `n` objects named <phase>-NNNNN, the i-th due at start + i/rate (all at once without a rate),
    from `clients` threads with a connection each, so a slow create does not delay the schedule."""
    phase.expected = n
    counter = iter(range(n))
    lock = threading.Lock()
    errors: list[BaseException] = []
    workers = max(1, min(clients, n))
    start = [0.0]
    # Every thread connects (TLS handshake) before the clock starts, so no claim's latency includes it.
    barrier = threading.Barrier(workers, action=lambda: start.__setitem__(0, time.monotonic()))
    group, plural = kind

    def worker() -> None:
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        objs = Objects(api, NAMESPACE)
        try:
            objs.custom.list_namespaced_custom_object(group, version, NAMESPACE, plural, limit=1)
            barrier.wait()
            while not errors:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                if rate is not None:
                    delay = start[0] + i / rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                name = f"{phase.name}-{i:05d}"
                body = {"metadata": {"name": name, "labels": {PHASE_LABEL: phase.name}}, "spec": spec}
                phase.created[name] = time.monotonic()
                objs.create(kind, body, version)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            api.close()

    threads = [threading.Thread(target=worker, name=f"create-{k}") for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{phase.name}: creating objects failed: {errors[0]}") from errors[0]
    elapsed = max(phase.created.values()) - min(phase.created.values())
    phase.achieved_rate = (n - 1) / elapsed if n > 1 and elapsed > 0 else float(n)


def wait_pool(objs: Objects, name: str, size: int, timeout: float) -> float:
    """Seconds until `size` Sandboxes of pool `name` have their own condition Ready=True, counted on the
    Sandboxes as upstream's scenario waits for them, not read from the pool's status.readyReplicas (which
    upstream found can lag under load). One list, then a watch: a poll that lists a pool of 1050 every
    half second would itself load the API server and this script while the controllers fill the pool."""
    started = time.monotonic()
    deadline = started + timeout
    group, plural = SANDBOX

    def member(sandbox: dict[str, Any]) -> bool:
        meta = sandbox["metadata"]
        return not meta.get("deletionTimestamp") and any(
            ref.get("controller") and ref.get("kind") == "SandboxWarmPool" and ref.get("name") == name
            for ref in meta.get("ownerReferences") or ()
        )

    def note(sandbox: dict[str, Any], gone: bool = False) -> None:
        key = sandbox["metadata"]["name"]
        if not gone and member(sandbox) and ready(sandbox):
            ready_members.add(key)
        else:
            ready_members.discard(key)

    ready_members: set[str] = set()
    resource_version = ""
    while len(ready_members) < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(
                f"warm pool {name}: {len(ready_members)}/{size} sandboxes Ready after {timeout:.0f} s"
            )
        if not resource_version:  # first pass, or the watch's history expired (410): start from a list
            listing = objs.custom.list_namespaced_custom_object(
                group, "v1beta1", NAMESPACE, plural, label_selector=WARM_POOL_LABEL
            )
            ready_members.clear()
            for sandbox in listing["items"]:
                note(sandbox)
            resource_version = listing["metadata"]["resourceVersion"]
            continue
        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
            objs.custom.list_namespaced_custom_object,
            group,
            "v1beta1",
            NAMESPACE,
            plural,
            label_selector=WARM_POOL_LABEL,
            resource_version=resource_version,
            timeout_seconds=max(1, min(30, int(remaining))),
        )
        try:
            for event in stream:
                sandbox = event["object"]
                resource_version = sandbox["metadata"]["resourceVersion"]
                note(sandbox, gone=event["type"] == "DELETED")
                if len(ready_members) >= size:
                    break
        except ApiException as exc:
            if exc.status != 410:
                raise
            resource_version = ""
    return time.monotonic() - started


def load_test_template(name: str) -> dict[str, Any]:
    """The SandboxTemplate of upstream's ClusterLoader2 scenarios (test/benchmarks/config in agent-sandbox):
    one container that sleeps, labelled app=agent-sandbox-load-test; no ports, no probe, no Service."""
    container = {"name": "sandbox", "image": "alpine", "command": ["/bin/sh", "-c", "sleep 28800"]}
    return {
        "metadata": {"name": name},
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {"app": "agent-sandbox-load-test"}},
                "spec": {"containers": [container]},
            }
        },
    }


TEMPLATES: dict[str, Callable[[str], dict[str, Any]]] = {
    "runtime": template_body,
    "load-test": load_test_template,
}


def install_crds(api: client.ApiClient, directory: Path) -> None:
    """Create every CRD in `directory` and wait until the API server serves them."""
    ext = client.ApiextensionsV1Api(api)
    names = []
    for path in sorted(directory.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            names.append(crd["metadata"]["name"])
            ext.create_custom_resource_definition(crd)
    if not names:
        raise RuntimeError(f"no CustomResourceDefinition in {directory}")

    def established() -> bool:
        for name in names:
            status = ext.read_custom_resource_definition(name).status
            conditions = (status.conditions if status else None) or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    wait_for(established, timeout=60, what="CRDs to be established")


# ---- one run -----------------------------------------------------------------------------------------
@dataclass
class RunResult:
    controller: Controller
    scenario: str
    phases: dict[str, Phase] = field(default_factory=dict)
    windows: list[Window] = field(default_factory=list)
    info: dict[str, float] = field(default_factory=dict)
    usage: Usage | None = None
    audit_log: Path | None = None
    apiserver_total: collections.Counter[str] = field(default_factory=collections.Counter)
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    error: str = ""
    by_verb: dict[str, collections.Counter[str]] = field(default_factory=dict)
    cp_hwm_mib: float = 0.0
    histograms: dict[tuple[str, str], Quantiles] = field(default_factory=dict)


def scenario_name(args: argparse.Namespace) -> str:
    if args.idle:
        return "idle"
    if args.burst:
        return "burst"
    return "claims"


def run_once(args: argparse.Namespace, controller: Controller, workdir: Path) -> RunResult:
    result = RunResult(controller, scenario_name(args), load_before=os.getloadavg())
    own = os.times()
    cp = BenchControlPlane(directory=workdir / "controlplane", nodes=args.nodes, die_with_parent=True)
    proc: ControllerProcess | None = None
    stack = contextlib.ExitStack()
    try:
        say(f"[{controller.label}] starting the control plane ({args.nodes} kwok nodes)")
        cp.start()
        api = config.new_client_from_config(config_file=str(cp.kubeconfig))  # type: ignore[no-untyped-call]
        crds = args.upstream_crds if controller.kind == "go" else CRD_DIR
        install_crds(api, crds)
        if controller.kind == "go":
            client.CoreV1Api(api).create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=UPSTREAM_NAMESPACE))
            )
        metrics_before = cp.request_totals()
        kubeconfig = cp.issue_controller_kubeconfig()
        extra = args.upstream_flag if controller.kind == "go" else args.operator_flag
        runtime = None
        if args.suspend_after:
            runtime = start_server(workdir / "runtime-root", log=workdir / "runtime.log")
            stack.callback(runtime.stop)
        env = {"SHADOW_RUNTIME_API_URL": runtime.url} if runtime else {}
        if controller.kind == "python":
            env.update(item.split("=", 1) for item in args.operator_env)
        proc = ControllerProcess(controller, kubeconfig, workdir, extra, env)
        say(f"[{controller.label}] starting the controller ({controller.path})")
        started = time.monotonic()
        proc.start()
        first = Mark(started, 0.0, 0)
        proc.wait_healthy(args.timeout)
        result.info["controller healthy s"] = time.monotonic() - started

        def mark() -> Mark:
            audit = cp.audit_log.stat().st_size if cp.audit_log.exists() else 0
            return Mark(time.monotonic(), proc.usage().cpu_s, audit)

        objs = Objects(api, NAMESPACE)
        if args.idle:
            run_idle(args, cp, objs, api, result, mark)
            if runtime is not None:
                result.info["runtime /v1/health requests"] = health_requests(runtime.url)
        else:
            run_claims(args, cp, objs, api, result, mark)
            result.histograms = proc.histograms()
        last = mark()
        result.windows.insert(0, Window("whole run", first, last))
        result.usage = proc.usage()
        result.apiserver_total = cp.request_totals() - metrics_before
        result.cp_hwm_mib = sum(tree_usage(pid).hwm_kib for pid in cp.pids.values()) / 1024
        now = os.times()
        result.info["benchmark client CPU s"] = now.user + now.system - own.user - own.system
        for w in result.windows:
            result.by_verb[w.name] = audit_requests(cp.audit_log, w.start.audit, w.end.audit)
    except (TimeoutError, RuntimeError, ApiException, AssertionError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        if proc is not None:
            result.error += f"\ncontroller log tail ({proc.log}):\n{proc.log_tail()}"
    finally:
        if proc is not None:
            proc.stop()
        cp.stop()
        stack.close()
    result.load_after = os.getloadavg()
    return result


def run_claims(
    args: argparse.Namespace,
    cp: BenchControlPlane,
    objs: Objects,
    api: client.ApiClient,
    result: RunResult,
    mark: Callable[[], Mark],
) -> None:
    objs.create(TEMPLATE, TEMPLATES[args.template]("bench"))
    pool_size = 0 if args.cold_only else args.pool
    if not args.cold_only:
        objs.create(
            POOL,
            {
                "metadata": {"name": "bench"},
                "spec": {"replicas": pool_size, "sandboxTemplateRef": {"name": "bench"}},
            },
        )
    if not args.burst and not args.warm_only and args.cold_form == "v1beta1":
        objs.create(
            POOL,
            {"metadata": {"name": "cold"}, "spec": {"replicas": 0, "sandboxTemplateRef": {"name": "bench"}}},
        )
    if pool_size:
        a = mark()
        result.info["pool fill s"] = wait_pool(objs, "bench", pool_size, args.timeout)
        result.windows.append(Window("pool fill", a, mark()))
        say(
            f"[{result.controller.label}] warm pool of {pool_size} Ready after {result.info['pool fill s']:.1f} s"
        )

    if args.burst:
        plan = [("burst", {"warmPoolRef": {"name": "bench"}}, "v1beta1", args.burst, None)]
    else:
        cold = (
            ({"warmPoolRef": {"name": "cold"}}, "v1beta1")
            if args.cold_form == "v1beta1"
            else ({"sandboxTemplateRef": {"name": "bench"}}, "v1alpha1")
        )
        plan = []
        if not args.cold_only:
            plan.append(("warm", {"warmPoolRef": {"name": "bench"}}, "v1beta1", args.claims, args.rate))
        if not args.warm_only:
            plan.append(("cold", cold[0], cold[1], args.claims, args.rate))
    result.phases = {name: Phase(name) for name, *_ in plan}
    watcher = ReadyWatcher(api, CLAIM, result.phases)
    watcher.start()
    try:
        for name, spec, version, n, rate in plan:
            phase = result.phases[name]
            pace = f"at {rate:g}/s" if rate else f"as fast as {args.clients} clients can"
            say(f"[{result.controller.label}] {name}: {n} claims {pace}")
            a = mark()
            create_all(cp.kubeconfig, CLAIM, version, phase, n, spec, rate, args.clients)
            watcher.wait(phase, args.timeout)
            result.windows.append(Window(name, a, mark()))
            if pool_size and (name == "warm" and "cold" in result.phases):
                # Let the pool refill before the next phase so phases do not share a background load.
                b = mark()
                result.info["refill s"] = wait_pool(objs, "bench", pool_size, args.timeout)
                result.windows.append(Window("refill", b, mark()))
    finally:
        watcher.stop()


def run_idle(
    args: argparse.Namespace,
    cp: BenchControlPlane,
    objs: Objects,
    api: client.ApiClient,
    result: RunResult,
    mark: Callable[[], Mark],
) -> None:
    phase = Phase("sandbox")
    result.phases = {"sandbox": phase}
    watcher = ReadyWatcher(api, SANDBOX, result.phases)
    watcher.start()
    try:
        say(f"[{result.controller.label}] creating {args.idle} Sandboxes")
        a = mark()
        spec = sandbox_body("x")["spec"]
        if args.suspend_after:
            spec["autoSuspendPolicy"] = {"suspendThresholdSeconds": args.suspend_after}
        create_all(cp.kubeconfig, SANDBOX, "v1beta1", phase, args.idle, spec, None, args.clients)
        watcher.wait(phase, args.timeout)
        result.windows.append(Window("create until all Ready", a, mark()))
    finally:
        watcher.stop()
    if args.suspend_after:
        b = mark()
        say(f"[{result.controller.label}] all Ready; waiting for all {args.idle} to be suspended when idle")

        def all_suspended() -> bool:
            boxes = objs.list(SANDBOX)
            idle = [b for b in boxes if condition(b, "Suspended").get("reason") == "Idle"]
            return len(idle) == args.idle and not objs.pods()

        wait_for(
            all_suspended, timeout=args.suspend_after + args.timeout, what="all idle-suspended", interval=1.0
        )
        end = mark()
        result.windows.append(Window("all Ready until all idle-suspended (Pods gone)", b, end))
        result.info["all idle-suspended s after all Ready"] = end.at - b.at
    time.sleep(args.idle_settle)
    say(f"[{result.controller.label}] all Ready; quiet window of {args.idle_window:g} s")
    b = mark()
    time.sleep(args.idle_window)
    result.windows.append(Window("quiet window", b, mark()))


# ---- reporting ---------------------------------------------------------------------------------------
def health_requests(url: str) -> int:
    """How many `/v1/health` requests the runtime served (its request histogram's count for that route)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("sandbox_runtime_request_duration_seconds_count") and 'route="/v1/health"' in line
    )


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ratio_cell(value: float, limit: float) -> str:
    return f"{value / limit:.2f}x ({'meets' if value <= limit else 'misses'})"


def phase_stats(phase: Phase, first_seen: bool = False) -> dict[str, float]:
    lat = sorted(phase.first_seen_ms.values()) if first_seen else phase.latencies_ms()
    return {
        "P50": percentile(lat, 50),
        "P90": percentile(lat, 90),
        "P99": percentile(lat, 99),
        "mean": statistics.fmean(lat),
        "max": lat[-1],
    }


def verbs_cell(counts: collections.Counter[str], top: int = 20) -> str:
    common = counts.most_common()
    cell = ", ".join(f"{verb} {n}" for verb, n in common[:top]) or "none"
    if len(common) > top:
        cell += f", {sum(n for _, n in common[top:])} more in {len(common) - top} other kinds"
    return cell


def metrics(result: RunResult) -> dict[str, tuple[float, str]]:
    """The run's figures for the side-by-side table: name -> (value, unit)."""
    out: dict[str, tuple[float, str]] = {}
    for name, phase in result.phases.items():
        s = phase_stats(phase)
        for q in ("P50", "P90", "P99"):
            out[f"{name} {q}"] = (s[q], "ms")
        if phase.first_seen_ms:
            seen = phase_stats(phase, first_seen=True)
            for q in ("P50", "P90", "P99"):
                out[f"{name} first-observed stamp->Ready {q}"] = (seen[q], "ms")
        out[f"{name} all Ready after first create"] = (phase.all_ready_s(), "s")
        out[f"{name} creates achieved"] = (phase.achieved_rate, "/s")
    for (name, launch), own in result.histograms.items():
        for label, value in (("P50", own.p50), ("P90", own.p90), ("P99", own.p99)):
            out[f"own {HISTOGRAM_SPAN[name]} {launch} {label}"] = (value, "ms")
    for key in ("pool fill s", "refill s", "controller healthy s"):
        if key in result.info:
            out[key.removesuffix(" s")] = (result.info[key], "s")
    for w in result.windows:
        out[f"CPU, {w.name}"] = (w.cpu_s, "s")
    for w in result.windows:
        counts = by_verb(result.by_verb.get(w.name, collections.Counter()))
        out[f"API requests, {w.name}"] = (float(sum(counts.values())), "")
        if w.name == "whole run":
            out["API writes, whole run"] = (float(sum(counts[v] for v in WRITE_VERBS)), "")
    assert result.usage is not None
    out["peak RSS (VmHWM)"] = (result.usage.hwm_kib / 1024, "MiB")
    out["RSS at the end"] = (result.usage.rss_kib / 1024, "MiB")
    return out


HISTOGRAM_SPAN = {
    "agent_sandbox_claim_controller_startup_latency_ms": "first seen->Ready",
    "agent_sandbox_claim_startup_latency_ms": "created->Ready",
}


def fmt(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:.0f} ms"
    if unit == "s":
        return f"{value:.3f} s" if value < 1 else f"{value:.2f} s" if value < 10 else f"{value:.1f} s"
    if unit == "MiB":
        return f"{value:.0f} MiB"
    if unit == "/s":
        return f"{value:.1f}/s"
    return f"{value:.0f}"


def run_report(args: argparse.Namespace, result: RunResult) -> str:
    c = result.controller
    la = " / ".join(f"{x:.2f}" for x in result.load_before), " / ".join(f"{x:.2f}" for x in result.load_after)
    head = f"### {c.label} ({c.kind}: {c.path})"
    if result.error:
        return f"{head}\n\nFAILED: {result.error}"
    lines = [head, "", f"Load average 1/5/15 min {la[0]} before, {la[1]} after."]
    if result.phases and result.scenario != "idle":
        lines += [
            "",
            "| Claims | P50 | P90 | P99 | Mean | Max | Achieved rate | All Ready after |",
            "|---|---|---|---|---|---|---|---|",
        ]
        stats = {name: phase_stats(p) for name, p in result.phases.items()}
        for name, phase in result.phases.items():
            s = stats[name]
            from_pool = sum(1 for sb in phase.sandbox.values() if sb.startswith("bench-"))
            if name == "cold":
                how = (
                    "v1beta1 `warmPoolRef` to an empty pool"
                    if args.cold_form == "v1beta1"
                    else "v1alpha1 `sandboxTemplateRef`"
                )
                label = f"cold ({how}, {phase.expected - from_pool}/{phase.expected} new)"
            else:
                label = f"{name} (`warmPoolRef`, {from_pool}/{phase.expected} adopted)"
            lines.append(
                f"| {label} | {s['P50']:.0f} ms | {s['P90']:.0f} ms | {s['P99']:.0f} ms | {s['mean']:.0f} ms "
                f"| {s['max']:.0f} ms | {phase.achieved_rate:.1f}/s | {phase.all_ready_s():.2f} s |"
            )
        if "warm" in stats and "cold" in stats:
            ratios = " | ".join(f"{stats['warm'][q] / stats['cold'][q]:.2f}" for q in ("P50", "P90", "P99"))
            lines.append(f"| warm / cold | {ratios} | | | | |")
        for name in stats:
            cells = " | ".join(ratio_cell(stats[name][q], UPSTREAM[q]) for q in ("P50", "P90", "P99"))
            lines.append(f"| {name} / upstream threshold (300 / 300 / 500 ms) | {cells} | | | | |")
        for name, phase in result.phases.items():
            if not phase.first_seen_ms:
                continue
            s = phase_stats(phase, first_seen=True)
            cells = " | ".join(ratio_cell(s[q], UPSTREAM[q]) for q in ("P50", "P90", "P99"))
            lines += [
                f"| {name}, from the controller's stamp `{FIRST_OBSERVED}` ({len(phase.first_seen_ms)} "
                f"claims) | {s['P50']:.0f} ms | {s['P90']:.0f} ms | {s['P99']:.0f} ms | {s['mean']:.0f} ms "
                f"| {s['max']:.0f} ms | | |",
                f"| that / upstream threshold | {cells} | | | | |",
            ]
        if result.histograms:
            lines += [
                "",
                "The controller's own histograms (its /metrics after the claims; quantiles interpolated inside its "
                "buckets, as upstream's presubmit reads them; upstream gates on `first seen->Ready`):",
                "",
                "| Histogram | Launch type | Count | P50 | P90 | P99 |",
                "|---|---|---|---|---|---|",
            ]
            for (name, launch), own in result.histograms.items():
                lines.append(
                    f"| `{name}` ({HISTOGRAM_SPAN[name]}) | {launch} | {own.count} | {own.p50:.0f} ms "
                    f"| {own.p90:.0f} ms | {own.p99:.0f} ms |"
                )
    elif result.scenario == "idle":
        p = result.phases["sandbox"]
        lines.append(f"{p.expected} Sandboxes all Ready {p.all_ready_s():.1f} s after the first create.")
        if "runtime /v1/health requests" in result.info:
            lines.append(
                f"All suspended for idleness {result.info['all idle-suspended s after all Ready']:.1f} s after all "
                f"were Ready (threshold {args.suspend_after} s); the controller asked the runtime "
                f"{result.info['runtime /v1/health requests']:.0f} times (`/v1/health`)."
            )
    lines += [
        "",
        "| Controller window | Seconds | CPU | CPU share of one core | API requests by verb |",
        "|---|---|---|---|---|",
    ]
    counts = {w.name: result.by_verb.get(w.name, collections.Counter()) for w in result.windows}
    for w in result.windows:
        share = w.cpu_s / w.seconds if w.seconds > 0 else 0.0
        lines.append(
            f"| {w.name} | {w.seconds:.1f} s | {w.cpu_s:.2f} s | {share:.0%} | {verbs_cell(by_verb(counts[w.name]))} |"
        )
    assert result.usage is not None
    total = sum(result.apiserver_total.values())
    lines += [
        "",
        f"Controller peak RSS (VmHWM) {result.usage.hwm_kib / 1024:.0f} MiB, RSS at the end "
        f"{result.usage.rss_kib / 1024:.0f} MiB; healthy {result.info['controller healthy s']:.1f} s after start. "
        f"Control plane (etcd, apiserver, controller-manager, scheduler, kwok) peak RSS {result.cp_hwm_mib:.0f} MiB; "
        f"this script's own CPU {result.info['benchmark client CPU s']:.1f} s. "
        f"API server, all clients, during the run: {total} requests ({verbs_cell(result.apiserver_total)}).",
        "",
        f"Controller requests by resource, whole run: {verbs_cell(by_resource(counts['whole run']))}.",
    ]
    return "\n".join(lines)


def side_by_side(results: list[RunResult], controllers: list[Controller]) -> str:
    """Median (and range) of every figure per controller, with ratios against the first controller."""
    ok = [r for r in results if not r.error]
    per: dict[str, list[dict[str, tuple[float, str]]]] = {c.label: [] for c in controllers}
    for r in ok:
        per[r.controller.label].append(metrics(r))
    names: list[str] = []
    for r in ok:
        for name in metrics(r):
            if name not in names:
                names.append(name)
    labels = [c.label for c in controllers]
    first = labels[0]
    header = [
        "Figure",
        *[f"{lb} (n={len(per[lb])})" for lb in labels],
        *[f"{lb} / {first}" for lb in labels[1:]],
    ]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        cells: list[str] = []
        medians: list[float | None] = []
        for lb in labels:
            values = [m[name][0] for m in per[lb] if name in m]
            unit = next((m[name][1] for m in per[lb] if name in m), "")
            if not values:
                cells.append("-")
                medians.append(None)
                continue
            med = statistics.median(values)
            medians.append(med)
            spread = f" ({fmt(min(values), unit)} to {fmt(max(values), unit)})" if len(values) > 1 else ""
            cells.append(fmt(med, unit) + spread)
        base = medians[0]
        for other in medians[1:]:
            cells.append(f"{other / base:.2f}" if base and other is not None else "-")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    failed = [r for r in results if r.error]
    if failed:
        rows.append("")
        rows.append(f"{len(failed)} run(s) failed: " + ", ".join(r.controller.label for r in failed))
    return "\n".join(rows)


def describe(args: argparse.Namespace) -> str:
    if args.idle:
        return (
            f"{args.idle} Sandboxes created directly ({args.clients} clients), then a quiet window of "
            f"{args.idle_window:g} s after {args.idle_settle:g} s of settling; {args.nodes} kwok nodes."
        )
    if args.burst:
        return (
            f"Warm pool of {args.pool}, then {args.burst} `warmPoolRef` claims created as fast as "
            f"{args.clients} client threads can; template `{args.template}`; {args.nodes} kwok nodes."
        )
    phases = (
        "cold phase only"
        if args.cold_only
        else "warm phase only"
        if args.warm_only
        else ("warm phase first, the pool refilled to Ready before the cold phase")
    )
    cold = (
        ""
        if args.warm_only
        else "; cold claims: v1beta1 `warmPoolRef` to an empty pool with the same template"
        if args.cold_form == "v1beta1"
        else "; cold claims: v1alpha1 `sandboxTemplateRef`"
    )
    return (
        f"Warm pool of {0 if args.cold_only else args.pool}; {args.claims} claims per phase at {args.rate:g}/s "
        f"({args.clients} client threads on a fixed schedule), {phases}{cold}; template `{args.template}`; "
        f"{args.nodes} kwok nodes."
    )


def pods_needed(args: argparse.Namespace) -> int:
    """Pods held at the end: the pool (refilled), every claimed or directly created sandbox."""
    if args.idle:
        return int(args.idle)
    if args.burst:
        return int(args.pool + args.burst)
    if args.cold_only:
        return int(args.claims)
    if args.warm_only:
        return int(args.pool + args.claims)
    return int(args.pool + 2 * args.claims)


def begin(script: str, argv: list[str] | None) -> tuple[str, str]:
    """What a benchmark's main does first: SIGTERM/SIGHUP unwind through the finally blocks that stop the
    controller and the control plane; its command line and start time, to print."""

    def interrupted(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    command = shlex.join([".venv/bin/python", f"hack/bench/{script}", *(argv or sys.argv[1:])])
    return command, dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pool", type=int, default=60, help="warm pool replicas (default 60)")
    parser.add_argument("--claims", type=int, default=40, help="claims per phase, warm and cold (default 40)")
    parser.add_argument("--rate", type=float, default=10.0, help="claims created per second (default 10)")
    parser.add_argument(
        "--duration", type=float, help="seconds of claims at --rate: claims = rate x duration"
    )
    parser.add_argument("--nodes", type=int, default=3, help="kwok fake nodes (110 pods each; default 3)")
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="per-wait timeout in seconds (default 180)"
    )
    parser.add_argument("--cold-only", action="store_true", help="only the cold phase (no warm pool)")
    parser.add_argument(
        "--warm-only", action="store_true", help="only the warm phase (upstream's scale check)"
    )
    parser.add_argument(
        "--cold-form",
        choices=("v1beta1", "v1alpha1"),
        default="v1beta1",
        help="cold claims: v1beta1 warmPoolRef to an empty pool (default) or v1alpha1 sandboxTemplateRef",
    )
    parser.add_argument(
        "--template",
        choices=sorted(TEMPLATES),
        default="runtime",
        help="claims' SandboxTemplate: runtime (Amicable-like: ports, probe, Service; default) or load-test "
        "(upstream's ClusterLoader2 template: one sleeping container, no Service)",
    )
    parser.add_argument("--burst", type=int, default=0, metavar="N", help="N warm claims as fast as possible")
    parser.add_argument("--idle", type=int, default=0, metavar="N", help="N Sandboxes, then a quiet window")
    parser.add_argument(
        "--idle-window", type=float, default=60.0, help="quiet window in seconds (default 60)"
    )
    parser.add_argument("--idle-settle", type=float, default=5.0, help="seconds before the quiet window (5)")
    parser.add_argument(
        "--suspend-after",
        type=int,
        default=0,
        metavar="T",
        help="--idle: give the Sandboxes autoSuspendPolicy T s and wait until all are suspended when idle",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=20,
        help="client threads creating objects (default 20, as upstream's CL2 run)",
    )
    parser.add_argument(
        "--controller",
        action="append",
        default=[],
        metavar="SPEC",
        help="shadow | NAME=/path/checkout | NAME=/path/binary (repeatable; default shadow)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per controller, alternating (default 1)")
    parser.add_argument(
        "--upstream-crds",
        type=Path,
        default=UPSTREAM_CHECKOUT / "k8s" / "crds",
        help="CRD directory for Go controllers (default ~/.cache/shadow-operator/upstream/agent-sandbox/k8s/crds)",
    )
    parser.add_argument("--upstream-flag", action="append", default=[], help="extra flag for Go controllers")
    parser.add_argument(
        "--operator-flag",
        action="append",
        default=[],
        help="extra flag for `shadow_operator run` of every Python controller (e.g. --operator-flag=--leader-elect)",
    )
    parser.add_argument(
        "--operator-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for every Python controller, e.g. --operator-env=SHADOW_WORKERS='{\"SandboxClaim\": 50}'",
    )
    parser.add_argument("--workdir", type=Path, help="keep each run's control plane, logs and audit log here")
    args = parser.parse_args(argv)

    if args.duration is not None:
        if args.duration <= 0:
            parser.error("--duration must be > 0")
        args.claims = max(1, round(args.rate * args.duration))
    if sum(bool(x) for x in (args.burst, args.idle, args.cold_only or args.warm_only)) > 1:
        parser.error("--burst, --idle and --cold-only/--warm-only are separate scenarios")
    if args.cold_only and args.warm_only:
        parser.error("--cold-only and --warm-only exclude each other")
    if any("=" not in item for item in args.operator_env):
        parser.error("--operator-env takes KEY=VALUE")
    if args.claims < 1 or args.rate <= 0 or args.clients < 1 or args.repeat < 1:
        parser.error("need --claims >= 1, --rate > 0, --clients >= 1, --repeat >= 1")
    if not args.idle and not args.burst and not args.cold_only and args.pool < args.claims:
        parser.error("need --pool >= --claims (every warm claim adopts)")
    # Pool, its refill after the warm phase and the cold claims all hold pods; kwok nodes take 110 each.
    if pods_needed(args) > PODS_PER_NODE * args.nodes:
        parser.error(
            f"{pods_needed(args)} pods do not fit on {args.nodes} nodes of {PODS_PER_NODE}: raise --nodes"
        )
    try:
        controllers = [parse_controller(s) for s in args.controller or ["shadow"]]
    except ValueError as exc:
        parser.error(str(exc))
    if len({c.label for c in controllers}) != len(controllers):
        parser.error("controller names must differ")
    if any(c.kind == "go" for c in controllers):
        if not list(args.upstream_crds.glob("*.yaml")):
            parser.error(f"--upstream-crds {args.upstream_crds}: no YAML files")
        if args.cold_form == "v1alpha1" and not (args.burst or args.idle or args.warm_only):
            parser.error("--cold-form v1alpha1 needs upstream's conversion webhook: not with a Go controller")

    command, started = begin("claims_bench.py", argv)
    print(f"$ {command}", flush=True)
    print(
        f"\nCommand: `{command}` ({started}; {os.cpu_count()} cores shared with other sessions). "
        f"{describe(args)}\n",
        flush=True,
    )
    results: list[RunResult] = []
    with workdirs(args.workdir) as make_dir:
        for k in range(args.repeat):
            for controller in controllers:
                result = run_once(args, controller, make_dir(f"{controller.label}-{k + 1}"))
                results.append(result)
                print(run_report(args, result) + "\n", flush=True)
    if len(results) > 1:
        print("### Side by side (medians; range over runs in brackets)\n")
        print(side_by_side(results, controllers), flush=True)
    return 1 if any(r.error for r in results) else 0


@contextlib.contextmanager
def workdirs(keep: Path | None) -> Iterator[Callable[[str], Path]]:
    with tempfile.TemporaryDirectory(prefix="claims-bench-") as tmp:
        base = keep or Path(tmp)

        def make(name: str) -> Path:
            path = base / name
            path.mkdir(parents=True, exist_ok=True)
            return path

        yield make


if __name__ == "__main__":
    sys.exit(main())
