"""Access to the kind cluster `make e2e` sets up (operator installed by Helm) for the e2e tests.

SHADOW_E2E_KUBECONFIG points at the cluster (default: the kubeconfig hack/kind/cluster.sh writes);
SHADOW_RELEASE_NAMESPACE and SHADOW_RELEASE name the Helm release's namespace and name (hack/lib.sh's defaults:
release sandboxes in sandbox-platform, as hack/kind/deploy.sh installs it); FULLNAME is the chart's name for
its objects (templates/_helpers.tpl "shadow-operator.fullname").
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from shadow_operator.sdk import kube

from tests.support.controlplane import wait_for

CACHE = Path(os.environ.get("SHADOW_CACHE", Path.home() / ".cache" / "shadow-operator"))
KUBECONFIG = os.environ.get("SHADOW_E2E_KUBECONFIG", str(CACHE / "kind" / "kubeconfig"))
OPERATOR_NAMESPACE = os.environ.get("SHADOW_RELEASE_NAMESPACE", "sandbox-platform")
RELEASE = os.environ.get("SHADOW_RELEASE", "sandboxes")
FULLNAME = RELEASE if "shadow-operator" in RELEASE else f"{RELEASE}-shadow-operator"
DEFAULT_TEMPLATE = "workspace"
EXT_GROUP, CORE_GROUP, VERSION = "extensions.agents.x-k8s.io", "agents.x-k8s.io", "v1beta1"
# The group and version each custom resource plural is served at (the Sandbox API's others: EXT_GROUP).
API_OF = {
    "sandboxes": (CORE_GROUP, VERSION),
    "shadowenvironments": ("shadow.dev", "v1alpha1"),
    "shadowenvironmentpools": ("shadow.dev", "v1alpha1"),
}


def api_of(plural: str) -> tuple[str, str]:
    return API_OF.get(plural, (EXT_GROUP, VERSION))


READY_TIMEOUT = float(os.environ.get("SHADOW_E2E_READY_TIMEOUT", "180"))
TIMINGS = CACHE / "e2e-timings.json"
# Why hack/kind/cluster.sh did not create RuntimeClass gvisor (runsc does not run on the node), when it did not.
GVISOR_UNAVAILABLE = CACHE / "kind" / "gvisor-unavailable"
GVISOR = "gvisor"
# The runtimes the workspace tests run under (`under_each_runtime`): the node's default (runc) and gVisor.
RUNTIME_CLASSES = [pytest.param(None, id="runc"), pytest.param(GVISOR, id=GVISOR)]

T = TypeVar("T")


def eventually(probe: Callable[[], T | None], what: str, timeout: float = READY_TIMEOUT) -> T:
    """Poll `probe` until it returns something truthy, and return that (`wait_for`: an object not found yet is
    "not yet"); fail with `what` and the last value otherwise."""
    last: list[T | None] = [None]

    def probe_and_keep() -> T | None:
        last[0] = None  # a probe that raises (an object not found yet) leaves no value
        last[0] = probe()
        return last[0]

    try:
        found = wait_for(probe_and_keep, timeout=timeout, what=what, interval=0.1, max_interval=1.0)
    except TimeoutError as exc:
        pytest.fail(f"{exc} (last value: {last[0]!r})")
    return cast(T, found)


def _millicpu(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def is_ready(obj: dict[str, Any] | None) -> bool:
    cond = condition(obj, "Ready")
    return bool(cond and cond.get("status") == "True")


@dataclass
class Cluster:
    api: client.ApiClient
    kubeconfig: str
    core: client.CoreV1Api = field(init=False)
    custom: client.CustomObjectsApi = field(init=False)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    # -- custom resources (the Sandbox API, ShadowEnvironments) --------------------------------------
    def create(self, namespace: str, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        group, version = api_of(plural)
        body = {"apiVersion": f"{group}/{version}", **body}
        return dict(self.custom.create_namespaced_custom_object(group, version, namespace, plural, body))

    def get(self, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
        group, version = api_of(plural)
        try:
            return dict(self.custom.get_namespaced_custom_object(group, version, namespace, plural, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        group, version = api_of(plural)
        return list(self.custom.list_namespaced_custom_object(group, version, namespace, plural)["items"])

    def delete(self, namespace: str, plural: str, name: str) -> None:
        group, version = api_of(plural)
        try:
            self.custom.delete_namespaced_custom_object(group, version, namespace, plural, name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def claim(self, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.create(
            namespace, "sandboxclaims", {"kind": "SandboxClaim", "metadata": {"name": name}, "spec": spec}
        )

    def wait_claim_ready(self, namespace: str, name: str, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            claim = self.get(namespace, "sandboxclaims", name)
            return claim if is_ready(claim) else None

        try:
            return eventually(probe, f"SandboxClaim {namespace}/{name} Ready", timeout)
        except pytest.fail.Exception as exc:
            raise pytest.fail.Exception(f"{exc.msg}\n{self.why_not_ready(namespace, name)}") from None

    def why_not_ready(self, namespace: str, name: str) -> str:
        """The claim's conditions, its Pod's phase and conditions, the namespace's warnings and what the node has
        left: what a person looks at when a sandbox does not come up."""
        claim = self.get(namespace, "sandboxclaims", name) or {}
        lines = [f"claim conditions: {(claim.get('status') or {}).get('conditions')}"]
        sandbox = self.sandbox_of(claim) if claim else name
        try:
            pod = self.core.read_namespaced_pod(sandbox, namespace)
            lines.append(f"pod {sandbox}: {pod.status.phase} {pod.status.conditions}")
        except ApiException as exc:
            lines.append(f"pod {sandbox}: {exc.status} {exc.reason}")
        warnings = self.core.list_namespaced_event(namespace, field_selector="type=Warning").items
        lines += [f"event {e.involved_object.name}: {e.reason}: {e.message}" for e in warnings[-10:]]
        pods = self.core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded").items
        requested = {
            f"{p.metadata.namespace}/{p.metadata.name}": sum(
                _millicpu((c.resources.requests or {}).get("cpu", "0")) for c in p.spec.containers
            )
            for p in pods
            if p.status.phase != "Failed"
        }
        lines.append(f"CPU requested on the cluster: {sum(requested.values())}m by {len(requested)} pods")
        return "\n".join(lines)

    def sandbox_of(self, claim: dict[str, Any]) -> str:
        return str(
            ((claim.get("status") or {}).get("sandbox") or {}).get("name") or claim["metadata"]["name"]
        )

    # -- runtime access ------------------------------------------------------------------------------
    def runtime_token(self, namespace: str, sandbox: str) -> str | None:
        obj = self.get(namespace, "sandboxes", sandbox) or {}
        secret_name = (obj.get("status") or {}).get("runtimeTokenSecret")
        if not secret_name:
            return None
        secret = self.core.read_namespaced_secret(secret_name, namespace)
        return base64.b64decode(secret.data["token"]).decode()

    @contextmanager
    def port_forward(self, namespace: str, target: str, port: int) -> Iterator[str]:
        """`kubectl port-forward` TARGET (pod/x, svc/y) to a free local port; yields its base URL."""
        proc = subprocess.Popen(
            ["kubectl", "--kubeconfig", self.kubeconfig, "-n", namespace, "port-forward", target, f":{port}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            match = re.search(r"127\.0\.0\.1:(\d+)", line)
            if not match:
                proc.kill()
                pytest.fail(
                    f"kubectl port-forward {target} failed: {line}{proc.stderr.read() if proc.stderr else ''}"
                )
            yield f"http://127.0.0.1:{match.group(1)}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    def kubectl(self, *args: str, timeout: float = 60) -> str:
        """`kubectl ARGS` against the cluster; its stdout (a failure raises with its stderr)."""
        result = subprocess.run(
            ["kubectl", "--kubeconfig", self.kubeconfig, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr.strip()}"
        return result.stdout

    @contextmanager
    def runtime(self, namespace: str, sandbox: str) -> Iterator[httpx.Client]:
        """An HTTP client for the sandbox's runtime, through `kubectl port-forward` to its pod; for a Pod under
        gVisor through the API server's pod proxy (the SDK's path) instead: containerd 1.6 forwards a port by
        dialling the pod's loopback in its network namespace, where gVisor's own network stack is not (the
        connection is refused)."""
        token = self.runtime_token(namespace, sandbox)
        if self.core.read_namespaced_pod(sandbox, namespace).spec.runtime_class_name == GVISOR:
            with kube.connect(timeout=60, kubeconfig=self.kubeconfig) as http:
                http.base_url = http.base_url.join(
                    f"/api/v1/namespaces/{namespace}/pods/{sandbox}:8888/proxy/"
                )
                http.headers.update({"X-Sandbox-Runtime-Token": token} if token else {})
                yield http
            return
        with self.port_forward(namespace, f"pod/{sandbox}", 8888) as url:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
                yield http

    # -- operator ------------------------------------------------------------------------------------
    def operator_leader(self) -> str | None:
        """Name of the operator pod holding the leader-election Lease (identity `<pod>_<suffix>`), if any."""
        leases = client.CoordinationV1Api(self.api).list_namespaced_lease(OPERATOR_NAMESPACE).items
        pods = {p.metadata.name for p in self.operator_pods()}
        for lease in leases:
            holder = (lease.spec.holder_identity or "").rsplit("_", 1)[0]
            if holder in pods:
                return holder
        return None

    def operator_pods(self) -> list[client.V1Pod]:
        pods = self.core.list_namespaced_pod(
            OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/component=operator"
        ).items
        return [p for p in pods if p.metadata.deletion_timestamp is None]


OPERATOR_METRICS_PORT = 9090


class OperatorMemory:
    """Samples the operators' resident memory (`process_resident_memory_bytes` of their /metrics, read through
    the API server's pod proxy) every second, in a thread, while the scenario runs; and their CPU seconds
    (`process_cpu_seconds_total`, summed over the pods, with the time read) for `cpu_rate`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.samples: list[float] = []
        self.cpu: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1):
            cpu = 0.0
            for pod in self.cluster.operator_pods():
                try:
                    text = self.cluster.core.connect_get_namespaced_pod_proxy_with_path(
                        f"{pod.metadata.name}:{OPERATOR_METRICS_PORT}", OPERATOR_NAMESPACE, "metrics"
                    )
                except ApiException:
                    continue
                for line in str(text).splitlines():
                    if line.startswith("process_resident_memory_bytes "):
                        self.samples.append(float(line.split()[1]))
                    elif line.startswith("process_cpu_seconds_total "):
                        cpu += float(line.split()[1])
            self.cpu.append((time.monotonic(), cpu))

    def cpu_rate(self, start: float, end: float) -> float:
        """The operators' CPU seconds per second between two `time.monotonic()` readings (the samples nearest
        inside them)."""
        inside = [x for x in self.cpu if start <= x[0] <= end]
        assert len(inside) >= 2, f"fewer than two CPU samples of the operator between {start} and {end}"
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return (c1 - c0) / (t1 - t0)

    def __enter__(self) -> OperatorMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def memory_limit(cluster: Cluster) -> float:
    limit = cluster.operator_pods()[0].spec.containers[0].resources.limits["memory"]
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    return float(limit[:-2]) * units[limit[-2:]]


def restarts(cluster: Cluster) -> int:
    return sum(
        cs.restart_count for p in cluster.operator_pods() for cs in (p.status.container_statuses or [])
    )


@contextmanager
def tenant_namespace(cluster: Cluster, *, runtime_class: str | None = None) -> Iterator[str]:
    """A fresh namespace as the chart prepares a tenant's: Pod Security's restricted level enforced (the operator
    labels those; here the test does), so every Pod the product makes there must pass it; with a copy of the
    chart's default SandboxTemplate (asking for `runtime_class` when given). Deleted afterwards, claims first
    while the operator can still run their finalizers."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    restricted = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}
    cluster.core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=restricted))
    )
    try:
        template = cluster.get(OPERATOR_NAMESPACE, "sandboxtemplates", DEFAULT_TEMPLATE)
        assert template is not None, (
            f"the chart's SandboxTemplate {OPERATOR_NAMESPACE}/{DEFAULT_TEMPLATE} is missing"
        )
        if runtime_class:
            template["spec"]["podTemplate"]["spec"]["runtimeClassName"] = runtime_class
        cluster.create(
            name,
            "sandboxtemplates",
            {"kind": "SandboxTemplate", "metadata": {"name": DEFAULT_TEMPLATE}, "spec": template["spec"]},
        )
        yield name
    finally:
        for claim in cluster.list(name, "sandboxclaims"):
            cluster.delete(name, "sandboxclaims", claim["metadata"]["name"])
        cluster.core.delete_namespace(name)


def pod_ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


# Run a module's (or a test's) workspaces under each runtime class: its e2e_namespace's copy of the default
# template gets the class as runtimeClassName, so every claim and environment there (environments take the
# namespace's `workspace` template) runs under it.
under_each_runtime = pytest.mark.parametrize("e2e_namespace", RUNTIME_CLASSES, indirect=True, scope="module")


def namespace_runtime_class(cluster: Cluster, namespace: str) -> str | None:
    """The runtime class of the namespace's `workspace` template (None: the node's default)."""
    template = cluster.get(namespace, "sandboxtemplates", DEFAULT_TEMPLATE)
    assert template is not None
    return cast("str | None", template["spec"]["podTemplate"]["spec"].get("runtimeClassName"))


def assert_runs_under_namespace_runtime(cluster: Cluster, namespace: str, pod: str) -> None:
    """The Pod asks for the runtime class of its namespace's `workspace` template (none: the node's default), and
    its container's kernel says which runtime it got: gVisor's Sentry reports itself in /proc/version (`Linux
    version 4.19.0-gvisor`) and in its boot log (dmesg); under runc /proc/version is the node's kernel."""
    runtime_class = namespace_runtime_class(cluster, namespace)
    spec = cluster.core.read_namespaced_pod(pod, namespace).spec
    assert spec.runtime_class_name == runtime_class, (pod, spec.runtime_class_name)
    kernel = cluster.kubectl("exec", "-n", namespace, pod, "--", "cat", "/proc/version")
    assert ("gvisor" in kernel) == (runtime_class == GVISOR), kernel
    if runtime_class == GVISOR:
        assert "Starting gVisor" in cluster.kubectl("exec", "-n", namespace, pod, "--", "dmesg")
