"""Helpers for the Sandbox API integration tests: install the CRDs, run the operator, poll objects.

The operator runs in-process through `kopf.testing.KopfRunner` (tracebacks surface in the test), or as a
real subprocess when a test needs to kill it.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.controlplane import free_port, wait_for
from tests.support.gitea import missing_tools

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"
SANDBOX = ("agents.x-k8s.io", "sandboxes")
CLAIM = ("extensions.agents.x-k8s.io", "sandboxclaims")
TEMPLATE = ("extensions.agents.x-k8s.io", "sandboxtemplates")
POOL = ("extensions.agents.x-k8s.io", "sandboxwarmpools")
ENVIRONMENT = ("shadow.dev", "shadowenvironments")
ENVIRONMENT_POOL = ("shadow.dev", "shadowenvironmentpools")
KINDS = {
    SANDBOX: "Sandbox",
    CLAIM: "SandboxClaim",
    TEMPLATE: "SandboxTemplate",
    POOL: "SandboxWarmPool",
    ENVIRONMENT: "ShadowEnvironment",
    ENVIRONMENT_POOL: "ShadowEnvironmentPool",
}
OPERATOR_ENV = {"SHADOW_METRICS_PORT": "0"}


def install_crds(api: client.ApiClient) -> None:
    """Create or update every generated CRD and wait until the API server serves them."""
    apply_crds(api, [yaml.safe_load(path.read_text()) for path in sorted(CRD_DIR.glob("*.yaml"))])


def apply_crds(api: client.ApiClient, crds: list[dict[str, Any]]) -> None:
    """Create or update these CRDs and wait until the API server serves them."""
    ext = client.ApiextensionsV1Api(api)
    names = []
    for crd in crds:
        names.append(crd["metadata"]["name"])
        try:
            current = ext.read_custom_resource_definition(crd["metadata"]["name"])
        except ApiException as exc:
            if exc.status != 404:
                raise
            ext.create_custom_resource_definition(crd)
        else:
            crd["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)

    def established() -> bool:
        for name in names:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    wait_for(established, timeout=30, what="CRDs to be established")


@contextlib.contextmanager
def in_process_operator(**env: str) -> Iterator[Any]:
    """Run the operator in a thread (KopfRunner); fail the test if it crashed. `env`: extra settings."""
    from kopf.testing import KopfRunner

    settings = {**OPERATOR_ENV, **env}
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        with KopfRunner(
            ["run", "--all-namespaces", "--standalone", "-m", "shadow_operator.controllers"], timeout=60
        ) as runner:
            yield runner
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert runner.exception is None, runner.exception
    assert runner.exit_code == 0, runner.output


@contextlib.contextmanager
def gitea_operator(api: client.ApiClient, gitea_url: str, **env: str) -> Iterator[Any]:
    """The operator in-process for environments whose Gitea is the real binary at `gitea_url` (the Gitea
    StatefulSet's Pods are kwok's and serve nothing); fails when the Gitea binary was not built."""
    reason = missing_tools()
    if reason is not None:
        pytest.fail(reason)
    install_crds(api)
    with in_process_operator(
        SHADOW_GITEA_API_URL=gitea_url, SHADOW_GITEA_IMAGE="gitea:test", **env
    ) as runner:
        yield runner


class OperatorProcess:
    """The operator as a subprocess (`python -m shadow_operator run --standalone`) that tests may SIGKILL."""

    def __init__(
        self, kubeconfig: str, log: Path, args: Sequence[str] = (), env: Mapping[str, str] | None = None
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.args = list(args)
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, **OPERATOR_ENV, **self.env, "KUBECONFIG": self.kubeconfig}
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "shadow_operator",
                    "run",
                    "--standalone",
                    f"--liveness={liveness}",
                    *self.args,
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


class Objects:
    """Thin access to our custom objects (by group/plural) for one namespace."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.namespace = namespace

    def create(self, kind: tuple[str, str], body: dict[str, Any], version: str = "v1beta1") -> dict[str, Any]:
        group, plural = kind
        body = {"apiVersion": f"{group}/{version}", "kind": KINDS[kind], **body}
        result: dict[str, Any] = self.custom.create_namespaced_custom_object(
            group, version, self.namespace, plural, body
        )
        return result

    def get(self, kind: tuple[str, str], name: str, version: str = "v1beta1") -> dict[str, Any] | None:
        group, plural = kind
        try:
            result: dict[str, Any] = self.custom.get_namespaced_custom_object(
                group, version, self.namespace, plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return result

    def list(self, kind: tuple[str, str], labels: str | None = None) -> list[dict[str, Any]]:
        group, plural = kind
        result = self.custom.list_namespaced_custom_object(
            group, "v1beta1", self.namespace, plural, label_selector=labels or ""
        )
        items: list[dict[str, Any]] = result["items"]
        return items

    def patch(
        self, kind: tuple[str, str], name: str, body: dict[str, Any], version: str = "v1beta1"
    ) -> dict[str, Any]:
        group, plural = kind
        result: dict[str, Any] = self.custom.patch_namespaced_custom_object(
            group, version, self.namespace, plural, name, body
        )
        return result

    def annotate(
        self, kind: tuple[str, str], name: str, annotations: dict[str, str], version: str = "v1beta1"
    ) -> dict[str, Any]:
        return self.patch(kind, name, {"metadata": {"annotations": annotations}}, version)

    def delete(self, kind: tuple[str, str], name: str) -> None:
        group, plural = kind
        with contextlib.suppress(ApiException):
            self.custom.delete_namespaced_custom_object(group, "v1beta1", self.namespace, plural, name)

    def wait(
        self,
        kind: tuple[str, str],
        name: str,
        check: Callable[[dict[str, Any]], bool],
        *,
        timeout: float = 60,
        what: str = "",
        version: str = "v1beta1",
    ) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def probe() -> bool:
            obj = self.get(kind, name, version)
            if obj is None:
                return False
            seen["obj"] = obj
            return check(obj)

        try:
            wait_for(probe, timeout=timeout, what=what or f"{KINDS[kind]} {name}", interval=0.1)
        except Exception as exc:
            raise AssertionError(f"{exc}; last seen status: {seen.get('obj', {}).get('status')}") from None
        return seen["obj"]

    def wait_condition(
        self,
        kind: tuple[str, str],
        name: str,
        status: str = "True",
        reason: str | None = None,
        *,
        type_: str = "Ready",
        timeout: float = 60,
        version: str = "v1beta1",
    ) -> dict[str, Any]:
        return self.wait(
            kind,
            name,
            lambda obj: any(
                c["type"] == type_ and c["status"] == status and (reason is None or c["reason"] == reason)
                for c in (obj.get("status") or {}).get("conditions") or []
            ),
            timeout=timeout,
            what=f"{KINDS[kind]} {name} {type_}={status}" + (f"/{reason}" if reason else ""),
            version=version,
        )

    def wait_gone(self, kind: tuple[str, str], name: str, timeout: float = 60) -> None:
        wait_for(
            lambda: self.get(kind, name) is None, timeout=timeout, what=f"{KINDS[kind]} {name} to be deleted"
        )

    def pods(self, labels: str = "") -> list[Any]:
        items: list[Any] = self.core.list_namespaced_pod(self.namespace, label_selector=labels).items
        return items

    def secret_exists(self, name: str) -> bool:
        try:
            self.core.read_namespaced_secret(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def secret_data(self, name: str) -> dict[str, str]:
        """The Secret's data, decoded."""
        secret = self.core.read_namespaced_secret(name, self.namespace)
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def template_body(name: str, *, image: str = "sandbox-runtime:dev", **spec: Any) -> dict[str, Any]:
    """A template like Amicable's: runtime on 8888 named `runtime`, preview on 3000 named `preview`."""
    return {
        "metadata": {"name": name},
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {"app": "sandbox"}},
                "spec": {
                    "containers": [
                        {
                            "name": "runtime",
                            "image": image,
                            "ports": [
                                {"name": "runtime", "containerPort": 8888},
                                {"name": "preview", "containerPort": 3000},
                            ],
                            "readinessProbe": {"tcpSocket": {"port": 8888}},
                        }
                    ]
                },
            },
            "service": True,
            **spec,
        },
    }


def sandbox_body(name: str, **spec: Any) -> dict[str, Any]:
    body = template_body(name)
    return {"metadata": {"name": name}, "spec": {**body["spec"], **spec}}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    """The object's condition of that type, or {}."""
    return next((x for x in (obj.get("status") or {}).get("conditions") or () if x["type"] == type_), {})


def ready(obj: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )
