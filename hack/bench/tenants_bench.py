#!/usr/bin/env python3
"""The control loop at many ShadowEnvironments across uneven tenants: time to Ready per namespace, CPU, memory.

One run starts a local control plane (etcd, kube-apiserver, controller-manager, scheduler and kwok playing
the kubelets; tests/support/controlplane.py, with claims_bench.py's audit log of the operator's own requests),
the operator as a subprocess (`python -m shadow_operator run --standalone`), and the two things an environment
talks to besides the API server, as real processes on loopback like the integration tests
(tests/integration/test_environment_timings.py):

  Gitea    ONE pinned Gitea binary (tests/support/gitea.py) stands in for every environment's Gitea:
           SHADOW_GITEA_API_URL points the operator at it. Each environment gets a Gitea user of its own,
           made by this script before the operator starts and written into the environment's
           `<name>-gitea-admin` Secret (the operator's own manifest, resources/environment.py), so the
           operator's bootstrap runs in full per environment: a token from basic auth, its organization, its
           repository; then the copy-in pushes its snapshot there. Only the Secret's create is skipped (it
           exists), and one Gitea serves all (on a cluster each environment's Gitea is a Pod of its own).
  runtime  ONE sandbox-runtime process (tests/runtime/conftest.py) stands in for every workspace:
           SHADOW_RUNTIME_API_URL. Each environment's source has its own `path` in that shared root, so every
           environment clones, snapshots, bundles and verifies its own tree through the runtime, for real.
           The Pods (workspace and Gitea StatefulSet) are kwok's: Ready without running anything.

Each environment: one git source (a file:// clone of a small repository this script makes), a 1Gi workspace
on a PersistentVolume pre-bound to its claim (there is no provisioner), spec.template in its namespace, and by
default a verification without the install check (`verify.install: false`: no pip or npm from the network)
and one command that reads the clone (`git log`). `--no-verify` stops at Ready. spec.startupTimeoutSeconds is
raised to --timeout so that slow environments are measured rather than marked Timeout.

Tenants are uneven: namespace t00 holds --busiest environments, the other --namespaces - 1 share the rest.
`--order busy-first` (default) creates all of t00's first, then the others' in turn, as fast as --clients
threads can: the busy tenant floods the queue before the quiet ones arrive (the case fair queuing is for);
`--order interleaved` deals them out in turn instead.

Time to Ready of one environment = from just before its create request until a watch on shadowenvironments
(all namespaces, no polling) delivers it with condition Ready=True; its verdict likewise (status.verdict).
Percentiles are nearest-rank. Reported: time until all are Ready (and all verdicts), per namespace P50/max
for the busiest and the quietest namespace (and the spread over all), the operator's CPU seconds per
environment and peak RSS (its process tree, from /proc), its RSS over time, API requests by verb and
resource (audit log of its own user), failure codes seen on the way, and a quiet window (--quiet, 30 s)
with every environment Ready: what the operator spends holding them.

Usage: .venv/bin/python hack/bench/tenants_bench.py [--environments 40] [--namespaces 4] [--busiest 16]
       [--nodes N] [--clients 8] [--order busy-first|interleaved] [--no-verify] [--timeout 900]
       [--operator-flag=--x] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import datetime as dt
import functools
import itertools
import math
import os
import queue
import secrets
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from claims_bench import (  # noqa: E402
    PODS_PER_NODE,
    WRITE_VERBS,
    BenchControlPlane,
    Controller,
    ControllerProcess,
    Mark,
    Window,
    audit_requests,
    begin,
    by_resource,
    by_verb,
    percentile,
    say,
    tree_usage,
    verbs_cell,
)
from environment_bench import git  # noqa: E402
from kubernetes import client, config, watch  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from shadow_operator.api import constants as c  # noqa: E402
from shadow_operator.api import naming  # noqa: E402
from shadow_operator.resources import environment as res  # noqa: E402

from tests.runtime.conftest import Server, start_server  # noqa: E402
from tests.support.controlplane import free_port  # noqa: E402
from tests.support.gitea import GiteaServer  # noqa: E402
from tests.support.sandbox_operator import TEMPLATE, Objects, install_crds, template_body  # noqa: E402
from tests.support.volumes import persistent_volume  # noqa: E402

GROUP, VERSION, PLURAL = "shadow.dev", "v1alpha1", "shadowenvironments"
RUN_LABEL = "bench.shadow.dev/tenants"
TEMPLATE_NAME = "workspace"
ENGINE_COUNTERS = ("ShadowEnvironment passes", "failed", "passes of the other kinds")
PHASES = ("scheduled", "workspaceReady", "giteaReady", "copiedIn", "ready", "verified")
PODS_PER_ENVIRONMENT = 2  # the workspace and Gitea's StatefulSet Pod


# ---- the plan ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Env:
    namespace: str
    name: str

    @property
    def slug(self) -> str:
        """Unique over the run: the directory in the shared workspace, the Gitea user and organization."""
        return f"{self.namespace}-{self.name}"


def tenant_sizes(total: int, namespaces: int, busiest: int) -> list[int]:
    """Environments per namespace: the first has `busiest`, the others share the rest as evenly as may be."""
    rest = total - busiest
    others = namespaces - 1
    return [busiest] + [rest // others + (1 if i < rest % others else 0) for i in range(others)]


def plan(args: argparse.Namespace) -> list[Env]:
    """Every environment in creation order (--order)."""
    per_ns = [
        [Env(f"t{k:02d}", f"env-{i:04d}") for i in range(n)]
        for k, n in enumerate(tenant_sizes(args.environments, args.namespaces, args.busiest))
    ]
    if args.order == "busy-first":
        rest = per_ns[1:]
        ordered = list(per_ns[0])
    else:
        rest = per_ns
        ordered = []
    for i in range(max(len(x) for x in rest)):
        ordered.extend(x[i] for x in rest if i < len(x))
    return ordered


def env_body(env: Env, origin: Path, args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "template": TEMPLATE_NAME,
        "sources": [
            {"name": "app", "path": env.slug, "repo": f"{env.slug}/app", "git": {"url": f"file://{origin}"}}
        ],
        "workspace": {"size": "1Gi"},
        "startupTimeoutSeconds": min(86400, max(600, int(args.timeout))),
    }
    if args.verify:
        spec["verify"] = {
            "install": False,
            "commands": [{"name": "log", "command": f"git -C {env.slug} log --oneline -1"}],
        }
    else:
        spec["verify"] = {"enabled": False}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ShadowEnvironment",
        "metadata": {"name": env.name, "namespace": env.namespace, "labels": {RUN_LABEL: "1"}},
        "spec": spec,
    }


def make_origin(path: Path) -> Path:
    """A small Python project in a bare-able working repository, cloned by every environment (file://)."""
    (path / "app").mkdir(parents=True)
    (path / "pyproject.toml").write_text('[project]\nname = "app"\nversion = "0.1.0"\n')
    (path / "app" / "__init__.py").write_text('GREETING = "hello"\n')
    (path / "README.md").write_text("A source every benchmark environment clones.\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "initial")
    return path


# ---- what the watch sees ------------------------------------------------------------------------------
@dataclass
class Seen:
    created: dict[Env, float] = field(default_factory=dict)
    ready_at: dict[Env, float] = field(default_factory=dict)
    verdict_at: dict[Env, float] = field(default_factory=dict)
    verdict: dict[Env, str] = field(default_factory=dict)
    # failure code -> environments that showed it (status.failure), and one message of each.
    failures: dict[str, set[Env]] = field(default_factory=lambda: collections.defaultdict(set))
    failure_message: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class EnvWatcher:
    """Records, in a thread, when each environment of the run is first seen Ready and with a verdict, from a
    watch over all namespaces (resumed from the last resourceVersion when the server ends it)."""

    def __init__(self, api: client.ApiClient, seen: Seen, expected: int, verify: bool) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.seen = seen
        self.expected = expected
        self.verify = verify
        self.all_ready = threading.Event()
        self.all_verdicts = threading.Event()
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        listing = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, label_selector=RUN_LABEL)
        self.resource_version: str = listing["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, name="env-watch", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                    self.custom.list_cluster_custom_object,
                    GROUP,
                    VERSION,
                    PLURAL,
                    label_selector=RUN_LABEL,
                    resource_version=self.resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=30,
                )
                for event in stream:
                    self._see(event, time.monotonic())
                    if self.stopping.is_set():
                        break
        except BaseException as exc:  # surfaced by the main thread; a dead watcher must not hang the run
            self.error = exc
            self.all_ready.set()
            self.all_verdicts.set()

    def _see(self, event: dict[str, Any], at: float) -> None:
        obj: dict[str, Any] = event["object"]
        meta = obj["metadata"]
        self.resource_version = meta["resourceVersion"]
        if event["type"] not in ("ADDED", "MODIFIED"):
            return
        env = Env(meta["namespace"], meta["name"])
        status = obj.get("status") or {}
        ready = any(
            x["type"] == c.COND_READY and x["status"] == "True" for x in status.get("conditions") or ()
        )
        seen = self.seen
        with seen.lock:
            failure = status.get("failure") or {}
            if failure.get("code"):
                seen.failures[failure["code"]].add(env)
                seen.failure_message.setdefault(failure["code"], str(failure.get("message", ""))[:300])
            if ready and env not in seen.ready_at:
                seen.ready_at[env] = at
                if len(seen.ready_at) == self.expected:
                    self.all_ready.set()
            verdict = status.get("verdict") or {}
            if verdict.get("result") and env not in seen.verdict_at:
                seen.verdict_at[env] = at
                seen.verdict[env] = verdict["result"]
                if len(seen.verdict_at) == self.expected:
                    self.all_verdicts.set()

    def wait(self, event: threading.Event, what: str, timeout: float, count: Callable[[], int]) -> None:
        if not event.wait(timeout):
            raise TimeoutError(f"only {count()}/{self.expected} {what} after {timeout:.0f} s")
        if self.error is not None:
            raise RuntimeError("the watch on shadowenvironments failed") from self.error


# ---- set-up ------------------------------------------------------------------------------------------
def setup_tenants(
    api: client.ApiClient, envs: list[Env], gitea: GiteaServer, workdir: Path, clients: int
) -> None:
    """Namespaces, a template in each, a volume pre-bound to each workspace claim, and for each environment a
    Gitea user and the `<name>-gitea-admin` Secret naming it (the operator's manifest for it)."""
    core = client.CoreV1Api(api)
    for namespace in sorted({e.namespace for e in envs}):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        Objects(api, namespace).create(TEMPLATE, template_body(TEMPLATE_NAME))
    admin_token = gitea.create_token("bench", ["write:admin"])

    def one(env: Env) -> None:
        password = secrets.token_urlsafe(18)
        user = f"u-{env.slug}"
        gitea.api(
            "POST",
            "admin/users",
            {
                "username": user,
                "email": f"{user}@bench.local",
                "password": password,
                "must_change_password": False,
            },
            auth=admin_token,
        )
        named = {"metadata": {"name": env.name, "namespace": env.namespace}}
        core.create_namespaced_secret(env.namespace, res.build_gitea_secret(named, user, password))
        claim = naming.pvc_name(c.WORKSPACE_VOLUME, env.name)
        core.create_persistent_volume(
            persistent_volume(f"pv-{env.slug}", workdir / "volumes" / env.slug, claim=(env.namespace, claim))
        )

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(one, e) for e in envs]:
            future.result()


def create_all(
    kubeconfig: Path, envs: list[Env], origin: Path, args: argparse.Namespace, seen: Seen
) -> float:
    """Create every environment in order, as fast as `args.clients` threads (a connection each, opened before
    the first create) can; the achieved rate."""
    workers = max(1, min(args.clients, len(envs)))
    apis = [config.new_client_from_config(config_file=str(kubeconfig)) for _ in range(workers)]  # type: ignore[no-untyped-call]
    free: queue.SimpleQueue[client.CustomObjectsApi] = queue.SimpleQueue()
    for api in apis:
        custom = client.CustomObjectsApi(api)
        custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)  # connected before the clock
        free.put(custom)

    def create(env: Env) -> None:
        custom = free.get()
        try:
            with seen.lock:
                seen.created[env] = time.monotonic()
            custom.create_namespaced_custom_object(
                GROUP, VERSION, env.namespace, PLURAL, env_body(env, origin, args)
            )
        finally:
            free.put(custom)

    try:
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="create") as pool:
            # map() submits in order, so creates start in the planned order; the first error is raised here.
            list(pool.map(create, envs))
    except ApiException as exc:
        raise RuntimeError(f"creating environments failed: {exc}") from exc
    finally:
        for api in apis:
            api.close()
    span = max(seen.created.values()) - min(seen.created.values())
    return (len(envs) - 1) / span if len(envs) > 1 and span > 0 else float(len(envs))


class RssSampler:
    """The operator's RSS every `interval` seconds (MiB, with seconds since the first create)."""

    def __init__(self, sample: Callable[[], int], interval: float) -> None:
        self.sample = sample
        self.interval = interval
        self.points: list[tuple[float, float]] = []
        self.origin = time.monotonic()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rss", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            with contextlib.suppress(Exception):
                self.points.append((time.monotonic() - self.origin, self.sample() / 1024))

    def stop(self) -> None:
        self.stopping.set()


# ---- one run -----------------------------------------------------------------------------------------
@dataclass
class Result:
    envs: list[Env]
    seen: Seen = field(default_factory=Seen)
    windows: list[Window] = field(default_factory=list)
    info: dict[str, float] = field(default_factory=dict)
    rss: list[tuple[float, float]] = field(default_factory=list)
    counts: dict[str, collections.Counter[str]] = field(default_factory=dict)
    hwm_mib: float = 0.0
    rss_end_mib: float = 0.0
    cp_hwm_mib: float = 0.0
    gitea_cpu_s: float = 0.0
    runtime_cpu_s: float = 0.0
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    error: str = ""
    # (window, the operator's engine counters at its end): the first entry is the start.
    passes: list[tuple[str, collections.Counter[str]]] = field(default_factory=list)
    # status.timings: phase -> environment -> seconds after its creationTimestamp (whole seconds).
    phases: dict[str, dict[Env, float]] = field(default_factory=dict)


def run(args: argparse.Namespace, workdir: Path) -> Result:
    envs = plan(args)
    result = Result(envs, load_before=os.getloadavg())
    own = os.times()
    cp = BenchControlPlane(directory=workdir / "controlplane", nodes=args.nodes, die_with_parent=True)
    gitea = GiteaServer(workdir / "gitea")
    runtime: Server | None = None
    proc: ControllerProcess | None = None
    watcher: EnvWatcher | None = None
    sampler: RssSampler | None = None
    try:
        say(f"starting the control plane ({args.nodes} kwok nodes), Gitea and the runtime")
        cp.start()
        api = config.new_client_from_config(config_file=str(cp.kubeconfig))  # type: ignore[no-untyped-call]
        install_crds(api)
        gitea.start()
        runtime = start_server(workdir / "workspace", log=workdir / "runtime.log")
        origin = make_origin(workdir / "origin")
        say(f"set-up: {len(envs)} Gitea users, Secrets and volumes in {args.namespaces} namespaces")
        started = time.monotonic()
        setup_tenants(api, envs, gitea, workdir, args.clients)
        result.info["set-up s"] = time.monotonic() - started

        kubeconfig = cp.issue_controller_kubeconfig()
        metrics_port = free_port()
        scrape = functools.partial(reconciles, f"http://127.0.0.1:{metrics_port}/metrics")
        environ = {
            "SHADOW_GITEA_API_URL": gitea.url.rstrip("/"),
            "SHADOW_GITEA_IMAGE": "gitea:test",
            "SHADOW_RUNTIME_API_URL": runtime.url,
            "SHADOW_METRICS_PORT": str(metrics_port),
        }
        proc = ControllerProcess(
            Controller("shadow", "python", ROOT), kubeconfig, workdir, args.operator_flag, environ
        )
        say("starting the operator")
        started = time.monotonic()
        proc.start()
        first = Mark(started, 0.0, 0)
        proc.wait_healthy(args.timeout)
        result.info["operator healthy s"] = time.monotonic() - started
        operator = proc

        def mark() -> Mark:
            audit = cp.audit_log.stat().st_size if cp.audit_log.exists() else 0
            return Mark(time.monotonic(), operator.usage().cpu_s, audit)

        time.sleep(args.settle)  # the operator's start-up listings done before the clock starts
        seen = result.seen
        watcher = EnvWatcher(api, seen, len(envs), args.verify)
        sampler = RssSampler(lambda: operator.usage().rss_kib, args.rss_interval)
        a = mark()
        passes = [("before the first create", scrape())]
        say(f"creating {len(envs)} environments ({args.order}, {args.clients} clients)")
        result.info["creates per s"] = create_all(cp.kubeconfig, envs, origin, args, seen)
        say(f"created at {result.info['creates per s']:.1f}/s; waiting for all Ready")
        deadline = a.at + args.timeout

        def wait(event: threading.Event, what: str, done: dict[Env, float]) -> None:
            assert watcher is not None
            while not event.wait(min(30.0, max(0.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    break
                with seen.lock:
                    codes = {k: len(v) for k, v in seen.failures.items()}
                say(
                    f"{len(done)}/{len(envs)} {what}; operator RSS {operator.usage().rss_kib / 1024:.0f} MiB"
                    + (f"; failures seen {codes}" if codes else "")
                )
            watcher.wait(event, what, max(0.0, deadline - time.monotonic()), lambda: len(done))

        try:
            wait(watcher.all_ready, "Ready", seen.ready_at)
            b = mark()
            result.windows.append(Window("create until all Ready", a, b))
            if args.verify:
                say("all Ready; waiting for all verdicts")
                wait(watcher.all_verdicts, "verdicts", seen.verdict_at)
                result.windows.append(Window("all Ready until all verdicts", b, mark()))
        except TimeoutError:
            # What was reached by the deadline is reported with the error (the figures are still measured).
            result.windows.insert(0, Window("create until the timeout", a, mark()))
            passes.append(("create until the timeout", scrape()))
            raise
        finally:
            result.passes = passes
        result.windows.append(Window("create until done", a, mark()))
        passes.append(("create until done", scrape()))
        say(f"done; quiet window of {args.quiet:g} s")
        q = mark()
        time.sleep(args.quiet)
        result.windows.append(Window(f"quiet window, {len(envs)} Ready", q, mark()))
        passes.append((f"quiet window, {len(envs)} Ready", scrape()))
        last = mark()
        result.windows.insert(0, Window("whole run (from operator start)", first, last))
        usage = operator.usage()
        result.hwm_mib, result.rss_end_mib = usage.hwm_kib / 1024, usage.rss_kib / 1024
    except (
        TimeoutError,
        RuntimeError,
        ApiException,
        AssertionError,
        OSError,
        KeyboardInterrupt,
        SystemExit,
    ) as exc:
        # An interrupted run (Ctrl-C, SIGTERM) is reported too, with what it reached.
        result.error = f"{type(exc).__name__}: {exc}"
        if proc is not None:
            result.error += f"\noperator log tail ({proc.log}):\n{proc.log_tail()}"
            with contextlib.suppress(RuntimeError):
                usage = proc.usage()
                result.hwm_mib, result.rss_end_mib = usage.hwm_kib / 1024, usage.rss_kib / 1024
    finally:
        if sampler is not None:
            sampler.stop()
            result.rss = sampler.points
        if watcher is not None:
            watcher.stop()
        with contextlib.suppress(Exception):
            result.phases = phase_seconds(api)
        with contextlib.suppress(Exception):
            result.cp_hwm_mib = sum(tree_usage(pid).hwm_kib for pid in cp.pids.values()) / 1024
            if gitea.process is not None:
                result.gitea_cpu_s = tree_usage(gitea.process.pid).cpu_s
            if runtime is not None:
                result.runtime_cpu_s = tree_usage(runtime.proc.pid).cpu_s
        for w in result.windows:
            result.counts[w.name] = audit_requests(cp.audit_log, w.start.audit, w.end.audit)
        now = os.times()
        result.info["benchmark client CPU s"] = now.user + now.system - own.user - own.system
        if proc is not None:
            proc.stop()
        if runtime is not None:
            runtime.stop()
        gitea.stop()
        cp.stop()
    result.load_after = os.getloadavg()
    return result


def reconciles(url: str) -> collections.Counter[str]:
    """The operator's engine counters: reconcile passes and failed passes per kind, apply() calls that found
    nothing to change."""
    counts: collections.Counter[str] = collections.Counter()
    wanted = {
        "shadow_operator_reconcile_total": "passes",
        "shadow_operator_reconcile_errors_total": "failed passes",
        "shadow_operator_api_writes_skipped_total": "writes skipped",
    }
    with urllib.request.urlopen(url, timeout=30) as answer:
        for raw in answer:
            line = raw.decode()
            name, _, rest = line.partition("{")
            if name not in wanted or " " not in rest:
                continue
            labels, value = rest.rsplit(" ", 1)
            kind = labels.split('kind="', 1)[1].split('"', 1)[0] if 'kind="' in labels else "?"
            counts[f"{wanted[name]} {kind}"] += int(float(value))
    return counts


def phase_seconds(api: client.ApiClient) -> dict[str, dict[Env, float]]:
    """The operator's own record of when each phase finished (status.timings), per environment, in seconds
    after its creation (creationTimestamp has whole seconds: the figures are +-1 s)."""
    listing = client.CustomObjectsApi(api).list_cluster_custom_object(
        GROUP, VERSION, PLURAL, label_selector=RUN_LABEL
    )
    out: dict[str, dict[Env, float]] = {p: {} for p in PHASES}
    for obj in listing["items"]:
        meta = obj["metadata"]
        created = dt.datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
        for phase, at in ((obj.get("status") or {}).get("timings") or {}).items():
            if phase in out:
                finished = dt.datetime.fromisoformat(at.replace("Z", "+00:00"))
                out[phase][Env(meta["namespace"], meta["name"])] = (finished - created).total_seconds()
    return {p: v for p, v in out.items() if v}


# ---- reporting ---------------------------------------------------------------------------------------
def seconds(values: list[float]) -> tuple[float, float]:
    """(P50, max) of a non-empty list of seconds."""
    ordered = sorted(values)
    return percentile(ordered, 50), ordered[-1]


def per_namespace(result: Result, done: dict[Env, float]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = collections.defaultdict(list)
    for env, at in done.items():
        out[env.namespace].append(at - result.seen.created[env])
    return out


def report(args: argparse.Namespace, result: Result) -> str:
    seen, envs = result.seen, result.envs
    la = [" / ".join(f"{x:.2f}" for x in load) for load in (result.load_before, result.load_after)]
    sizes = collections.Counter(e.namespace for e in envs)
    busiest = max(sizes, key=lambda ns: (sizes[ns], ns))
    quietest = min(sizes, key=lambda ns: (sizes[ns], ns))
    lines = [f"Load average 1/5/15 min {la[0]} before, {la[1]} after."]
    if result.error:
        lines += ["", f"FAILED: {result.error}"]
    if not seen.created:
        return "\n".join(lines)
    start = min(seen.created.values())
    lines += [
        "",
        "| Environments | Done | P50 | P90 | P99 | Max | All done after first create |",
        "|---|---|---|---|---|---|---|",
    ]
    stages = [("Ready", seen.ready_at)] + ([("verdict", seen.verdict_at)] if args.verify else [])
    for what, done in stages:
        if not done:
            lines.append(f"| {what} | 0/{len(envs)} | | | | | |")
            continue
        lat = sorted(at - seen.created[e] for e, at in done.items())
        lines.append(
            f"| {what} | {len(done)}/{len(envs)} | {percentile(lat, 50):.1f} s | {percentile(lat, 90):.1f} s "
            f"| {percentile(lat, 99):.1f} s | {lat[-1]:.1f} s | {max(done.values()) - start:.1f} s |"
        )
    results = collections.Counter(seen.verdict.values())
    if args.verify:
        lines.append(f"\nVerdicts: {', '.join(f'{k} {n}' for k, n in sorted(results.items())) or 'none'}.")

    lines += [
        "",
        "| Namespace | Environments | Ready P50 | Ready max | First create | Last create |"
        + (" Verdict P50 | Verdict max |" if args.verify else ""),
        "|---|---|---|---|---|---|" + ("---|---|" if args.verify else ""),
    ]
    ready_ns = per_namespace(result, seen.ready_at)
    verdict_ns = per_namespace(result, seen.verdict_at)
    created_ns: dict[str, list[float]] = collections.defaultdict(list)
    for env, at in seen.created.items():
        created_ns[env.namespace].append(at - start)
    others = [ns for ns in sorted(sizes) if ns not in (busiest, quietest)]
    rows = [(f"{busiest} (busiest)", busiest), (f"{quietest} (quietest)", quietest)]
    rows += [(f"{ns}", ns) for ns in others] if args.all_namespaces else []
    for label, ns in rows:
        cells = [label, str(sizes[ns])]
        for values in (ready_ns.get(ns),) + ((verdict_ns.get(ns),) if args.verify else ()):
            if values:
                p50, top = seconds(values)
                cells += [f"{p50:.1f} s", f"{top:.1f} s"]
            else:
                cells += ["-", "-"]
        cells[4:4] = [f"{min(created_ns[ns]):.1f} s", f"{max(created_ns[ns]):.1f} s"]
        lines.append("| " + " | ".join(cells) + " |")
    quiet_ns = [ns for ns in sizes if ns != busiest and ready_ns.get(ns)]
    if quiet_ns and ready_ns.get(busiest):
        p50s = sorted(seconds(ready_ns[ns])[0] for ns in quiet_ns)
        maxes = sorted(seconds(ready_ns[ns])[1] for ns in quiet_ns)
        b50, bmax = seconds(ready_ns[busiest])
        lines.append(
            f"\nReady over the {len(quiet_ns)} other namespaces: P50 per namespace {p50s[0]:.1f} to {p50s[-1]:.1f} s "
            f"(median {percentile(p50s, 50):.1f} s), max per namespace {maxes[0]:.1f} to {maxes[-1]:.1f} s. "
            f"Busiest / quietest: P50 {b50 / seconds(ready_ns[quietest])[0]:.2f}x, "
            f"max {bmax / seconds(ready_ns[quietest])[1]:.2f}x."
        )
    if result.phases:
        lines += [
            "",
            "Where the time goes (status.timings, seconds after each environment's creationTimestamp, +-1 s): "
            "P50 / max",
            "",
            f"| Phase | All | {busiest} (busiest) | {quietest} (quietest) |",
            "|---|---|---|---|",
        ]
        for phase, done in result.phases.items():
            cells = [phase]
            for pick in (None, busiest, quietest):
                values = [v for e, v in done.items() if pick is None or e.namespace == pick]
                p50, top = seconds(values) if values else (0.0, 0.0)
                cells.append(f"{p50:.0f} / {top:.0f} s" if values else "-")
            lines.append("| " + " | ".join(cells) + " |")
    with seen.lock:
        failures = {k: (len(v), seen.failure_message.get(k, "")) for k, v in seen.failures.items()}
    if failures:
        lines.append(
            "\nFailure codes seen on the way (status.failure; environments that showed each, one message):"
        )
        for code, (n, message) in sorted(failures.items()):
            lines.append(f"- {code}: {n} environments; e.g. {message!r}")
    else:
        lines.append("\nNo environment showed a failure code (status.failure) on the way.")

    n = len(envs)
    lines += [
        "",
        "| Operator window | Seconds | CPU | CPU per environment | CPU share of one core | API requests by verb |",
        "|---|---|---|---|---|---|",
    ]
    for w in result.windows:
        share = w.cpu_s / w.seconds if w.seconds > 0 else 0.0
        counts = by_verb(result.counts.get(w.name, collections.Counter()))
        lines.append(
            f"| {w.name} | {w.seconds:.1f} s | {w.cpu_s:.1f} s | {w.cpu_s / n * 1000:.0f} ms | {share:.0%} "
            f"| {verbs_cell(counts)} |"
        )
    if len(result.passes) > 1:
        lines += [
            "",
            "| Operator engine, per window | " + " | ".join(ENGINE_COUNTERS) + " |",
            "|---|---|---|---|",
        ]
        for (_, before), (name, after) in itertools.pairwise(result.passes):
            delta = after - before
            cells = [
                f"{delta[f'{k} ShadowEnvironment']} ({delta[f'{k} ShadowEnvironment'] / n:.1f} per env.)"
                for k in ("passes", "failed passes")
            ]
            other_kinds = sum(
                v
                for k, v in delta.items()
                if k.startswith("passes ") and not k.endswith(" ShadowEnvironment")
            )
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {other_kinds} |")
    whole = result.counts.get(result.windows[0].name) if result.windows else None
    rss = ", ".join(f"{at:.0f} s: {mib:.0f}" for at, mib in thin(result.rss, 12))
    lines += [
        "",
        f"Operator peak RSS (VmHWM) {result.hwm_mib:.0f} MiB, RSS at the end {result.rss_end_mib:.0f} MiB; "
        f"healthy {result.info.get('operator healthy s', 0):.1f} s after start. RSS (MiB) by seconds since the "
        f"first create: {rss or 'not sampled'}.",
        "",
        f"Creates achieved {result.info.get('creates per s', 0):.1f}/s. Set-up before the operator started "
        f"(Gitea users, Secrets, volumes) {result.info.get('set-up s', 0):.0f} s. Stand-ins' CPU over the run: "
        f"Gitea {result.gitea_cpu_s:.0f} s, runtime {result.runtime_cpu_s:.0f} s. Control plane (etcd, "
        f"apiserver, controller-manager, scheduler, kwok) peak RSS {result.cp_hwm_mib:.0f} MiB; this script's "
        f"own CPU {result.info.get('benchmark client CPU s', 0):.0f} s.",
    ]
    if whole is not None:
        writes = sum(by_verb(whole)[v] for v in WRITE_VERBS)
        lines += [
            "",
            f"Operator API writes over the whole run: {writes} ({writes / n:.1f} per environment). Requests by "
            f"resource: {verbs_cell(by_resource(whole), top=25)}.",
        ]
    return "\n".join(lines)


def thin(points: list[tuple[float, float]], keep: int) -> list[tuple[float, float]]:
    if len(points) <= keep:
        return points
    step = (len(points) - 1) / (keep - 1)
    return [points[round(i * step)] for i in range(keep)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--environments", type=int, default=40, help="environments in all (default 40)")
    parser.add_argument("--namespaces", type=int, default=4, help="tenants, namespaces t00.. (default 4)")
    parser.add_argument(
        "--busiest", type=int, help="environments of the busiest namespace t00 (default 30%% of all, rounded)"
    )
    parser.add_argument(
        "--nodes", type=int, help="kwok nodes (110 Pods each; default: enough for 2 per environment)"
    )
    parser.add_argument("--clients", type=int, default=8, help="client threads creating objects (default 8)")
    parser.add_argument("--order", choices=("busy-first", "interleaved"), default="busy-first")
    parser.add_argument(
        "--no-verify", dest="verify", action="store_false", help="stop at Ready (no verdicts)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds from the first create (900)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the operator is healthy (5)")
    parser.add_argument("--quiet", type=float, default=30.0, help="quiet window with all done, seconds (30)")
    parser.add_argument("--rss-interval", type=float, default=5.0, help="seconds between RSS samples (5)")
    parser.add_argument("--all-namespaces", action="store_true", help="a table row for every namespace")
    parser.add_argument(
        "--operator-flag", action="append", default=[], help="extra flag for `shadow_operator run`"
    )
    parser.add_argument("--workdir", type=Path, help="keep the control plane, logs and audit log here")
    args = parser.parse_args(argv)

    if args.busiest is None:
        args.busiest = max(1, round(args.environments * 0.3))
    if args.namespaces < 2 or args.environments < args.namespaces:
        parser.error("need --namespaces >= 2 and at least one environment per namespace")
    rest = args.environments - args.busiest
    if args.busiest < 1 or rest < args.namespaces - 1:
        parser.error("--busiest leaves fewer environments than the other namespaces need (one each)")
    if args.busiest <= math.ceil(rest / (args.namespaces - 1)):
        parser.error("--busiest must exceed every other namespace's share, or no namespace is the busiest")
    needed = math.ceil(PODS_PER_ENVIRONMENT * args.environments / (PODS_PER_NODE - 10))
    if args.nodes is None:
        args.nodes = needed
    elif args.nodes * PODS_PER_NODE < PODS_PER_ENVIRONMENT * args.environments:
        parser.error(f"{PODS_PER_ENVIRONMENT * args.environments} Pods do not fit on {args.nodes} nodes")

    command, started = begin("tenants_bench.py", argv)
    sizes = tenant_sizes(args.environments, args.namespaces, args.busiest)
    print(f"$ {command}", flush=True)
    print(
        f"\nCommand: `{command}` ({started}; {os.cpu_count()} cores shared with other sessions). "
        f"{args.environments} ShadowEnvironments in {args.namespaces} namespaces (t00: {sizes[0]}, the others "
        f"{min(sizes[1:])} to {max(sizes[1:])}), created {args.order} by {args.clients} clients; "
        f"{'verify on (install: false, one command)' if args.verify else 'verify off'}; {args.nodes} kwok nodes.\n",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="tenants-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = run(args, workdir)
    print(report(args, result), flush=True)
    return 1 if result.error else 0


if __name__ == "__main__":
    sys.exit(main())
