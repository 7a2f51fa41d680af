"""The SDK (sync and async) and shadowctl wake a sandbox suspended for idleness: through the real API server's
pod proxy to a real sandbox-runtime.

The operator does not run: the test writes what it would. A sleeping sandbox is a SandboxClaim (not Ready) bound
to a Sandbox whose status says Suspended=True (reason Idle), Ready=False, with no Pod; the runtime already
listens. The stand-in plays the operator's resume: once a client sets a new shadow.dev/resume-requested, it
creates the Pod (at the runtime's address) and marks the Sandbox and the claim Ready.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.sdk import AsyncSandboxClient, SandboxClient
from shadow_operator.sdk.errors import WaitTimeout
from shadow_operator.sdk.kube import connect
from shadow_operator.sdk.wake import is_ready

from tests.runtime.conftest import Server, free_port, start_server
from tests.support.controlplane import wait_for
from tests.support.proxied_workspace import proxied_environment
from tests.support.rbac import rendered, token_kubeconfig
from tests.support.router import outside_address, sandbox_pod, token_secret
from tests.support.sandbox_operator import install_crds
from tests.support.shadowctl import run

pytestmark = pytest.mark.integration

GROUP, EXT, VERSION = "agents.x-k8s.io", "extensions.agents.x-k8s.io", "v1beta1"


@dataclass
class Sleeper:
    claim: str
    sandbox: str
    namespace: str
    server: Server | None  # None: the runtime starts only with the new Pod
    custom: client.CustomObjectsApi
    core: client.CoreV1Api
    port: int

    def annotation(self) -> str | None:
        body = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "sandboxes", self.sandbox
        )
        return (body["metadata"].get("annotations") or {}).get(c.ANNOTATION_RESUME_REQUEST)

    def resume_on_request(self) -> threading.Thread:
        """In the background, the operator's part: the Pod back and Ready once a resume is asked for."""

        def wake() -> None:
            wait_for(self.annotation, timeout=30, what=f"a resume request on {self.sandbox}")
            sandbox_pod(
                self.core, self.namespace, self.sandbox, outside_address(), None, {"app": self.sandbox}
            )
            _status(self, ready=True)

        thread = threading.Thread(target=wake, daemon=True)
        thread.start()
        return thread


def _conditions(ready: bool) -> list[dict[str, str]]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return [
        {
            "type": c.COND_READY,
            "status": str(ready),
            "reason": c.REASON_DEPENDENCIES_READY if ready else "Suspended",
            "message": "the test's",
            "lastTransitionTime": now,
        },
        {
            "type": c.COND_SUSPENDED,
            "status": str(not ready),
            "reason": c.REASON_NOT_SUSPENDED if ready else c.REASON_IDLE,
            "message": "the test's",
            "lastTransitionTime": now,
        },
    ]


def _status(s: Sleeper, *, ready: bool, starting: bool = False) -> None:
    """Asleep (ready False), awake (ready True), or resumed with its new Pod starting: the Pod has an address,
    Ready is not True yet."""
    conditions = _conditions(ready or starting)
    if starting:
        conditions[0] = {**conditions[0], "status": "False", "reason": "DependenciesNotReady"}
    status: dict[str, Any] = {
        "conditions": conditions,
        "runtimeURL": f"http://{s.sandbox}.{s.namespace}.svc:{s.port}",
        "runtimeTokenSecret": naming.token_secret_name(s.sandbox),
        "podIPs": [outside_address()] if ready or starting else None,
    }
    s.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, s.namespace, "sandboxes", s.sandbox, {"status": status}
    )
    claim = {"conditions": _conditions(ready)[:1], "sandbox": {"name": s.sandbox}}
    s.custom.patch_namespaced_custom_object_status(
        EXT, VERSION, s.namespace, "sandboxclaims", s.claim, {"status": claim}
    )


def _runtime(tmp_path: Path, token: str, port: int | None = None) -> Server:
    root = tmp_path / "workspace"
    root.mkdir(exist_ok=True)
    return start_server(
        root,
        env={"SANDBOX_RUNTIME_TOKEN": token},
        token=token,
        host=outside_address(),
        log=tmp_path / "rt.log",
        port=port,
    )


@pytest.fixture
def sleeper(k8s_api: client.ApiClient, namespace: str, tmp_path: Path, kubeconfig: str) -> Iterator[Sleeper]:
    token = secrets.token_hex(16)
    server = _runtime(tmp_path, token)
    try:
        yield _sleeping(k8s_api, namespace, server, int(server.url.rsplit(":", 1)[1]), token)
    finally:
        server.stop()


def _sleeping(
    k8s_api: client.ApiClient, namespace: str, server: Server | None, port: int, token: str
) -> Sleeper:
    """A claim bound to a Sandbox asleep (no Pod), whose runtime listens on `port` once it runs."""
    install_crds(k8s_api)
    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    claim = {
        "apiVersion": f"{EXT}/{VERSION}",
        "kind": "SandboxClaim",
        "metadata": {"name": "my-claim"},
        "spec": {"sandboxTemplateRef": {"name": "python"}},
    }
    custom.create_namespaced_custom_object(EXT, VERSION, namespace, "sandboxclaims", claim)
    sandbox = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": "my-sandbox"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "runtime", "image": "runtime:dev"}]}}},
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", sandbox)
    token_secret(core, namespace, "my-sandbox", token)
    found = Sleeper("my-claim", "my-sandbox", namespace, server, custom, core, port)
    _status(found, ready=False)
    return found


@pytest.fixture
def use_kubeconfig(kubeconfig: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", kubeconfig)


def test_sdk_call_wakes_the_sandbox_and_runs(sleeper: Sleeper, use_kubeconfig: None) -> None:
    told: list[str] = []
    waker = sleeper.resume_on_request()
    with SandboxClient(namespace=sleeper.namespace, on_wake=told.append) as sdk:
        sandbox = sdk.get_sandbox("my-claim")  # a sleeping sandbox is not "not ready": the call wakes it
        result = sandbox.commands.run("echo awake")
    waker.join(10)
    assert result.exit_code == 0 and result.stdout == "awake\n"
    assert told == [f"waking sandbox {sleeper.namespace}/my-sandbox…"]
    assert sleeper.annotation() is not None


def test_async_sdk_call_wakes_the_sandbox_and_runs(sleeper: Sleeper, use_kubeconfig: None) -> None:
    waker = sleeper.resume_on_request()

    async def call() -> str:
        async with AsyncSandboxClient(namespace=sleeper.namespace) as sdk:
            sandbox = await sdk.get_sandbox("my-claim")
            await sandbox.files.write("note.txt", "kept")
            return (await sandbox.files.read("note.txt")).decode()

    assert asyncio.run(call()) == "kept"
    waker.join(10)


def test_shadowctl_sandbox_exec_says_it_is_waking_the_sandbox(sleeper: Sleeper, kubeconfig: str) -> None:
    waker = sleeper.resume_on_request()
    done = run(kubeconfig, "sandbox", "exec", "my-claim", "-n", sleeper.namespace, "--", "echo", "hi")
    waker.join(10)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hi\n"
    assert f"waking sandbox {sleeper.namespace}/my-sandbox…" in done.stderr


def test_a_sandbox_found_asleep_runs_the_call_as_soon_as_its_new_runtime_answers(
    k8s_api: client.ApiClient, namespace: str, tmp_path: Path, use_kubeconfig: None
) -> None:
    """Two waits of the old wake are gone (issue 30, exec on a sleeping sandbox): a call that would fail
    through the pod proxy first, when the claim's read has just shown the sandbox asleep; and the wait for
    Ready, which comes after the kubelet's next readiness probe (once a second) and the operator's status.

    Here the resumed Sandbox gets its new Pod's address and never Ready; its runtime starts only then (it
    refuses connections until it listens). The call goes through all the same."""
    token, port = secrets.token_hex(16), free_port()
    s = _sleeping(k8s_api, namespace, None, port, token)
    started: list[Server] = []

    def resume() -> None:
        wait_for(s.annotation, timeout=30, what=f"a resume request on {s.sandbox}")
        sandbox_pod(s.core, s.namespace, s.sandbox, outside_address(), None, {"app": s.sandbox})
        _status(s, ready=False, starting=True)
        started.append(_runtime(tmp_path, token, port))

    waker = threading.Thread(target=resume, daemon=True)
    waker.start()
    sent: list[tuple[str, str]] = []
    http = connect()
    http.event_hooks["request"].append(lambda request: sent.append((request.method, request.url.path)))
    try:
        with SandboxClient(namespace=s.namespace, client=http, wake_timeout=40) as sdk:
            sandbox = sdk.get_sandbox("my-claim")
            sent.clear()
            result = sandbox.commands.run("echo early")
        waker.join(30)
    finally:
        for server in started:
            server.stop()
    assert result.exit_code == 0 and result.stdout == "early\n"
    box = s.custom.get_namespaced_custom_object(GROUP, VERSION, s.namespace, "sandboxes", s.sandbox)
    assert not is_ready(box)  # it ran before anyone said Ready
    first = next(call for call in sent if call[0] != "GET")
    assert first == ("PATCH", f"/apis/{GROUP}/{VERSION}/namespaces/{s.namespace}/sandboxes/{s.sandbox}"), sent


@pytest.fixture
def tenant_kubeconfig(
    k8s_api: client.ApiClient,
    namespace: str,
    kubeconfig: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[str]:
    """KUBECONFIG of a ServiceAccount bound to the built-in `edit` in `namespace`, with the chart's tenant
    ClusterRoles aggregated into it: a tenant, who may annotate claims but has no verb on Sandboxes but read."""
    release = f"wake-{secrets.token_hex(3)}"
    docs = [  # the ClusterRoles aggregated into edit and view
        doc
        for doc in rendered(release, namespace, [], "templates/tenant-rbac.yaml")
        if doc["metadata"]["name"].endswith(("-tenant-edit", "-tenant-view"))
    ]
    rbac, core = client.RbacAuthorizationV1Api(k8s_api), client.CoreV1Api(k8s_api)
    for doc in docs:
        rbac.create_cluster_role(doc)
    try:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": "agent"}})
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "agent-edit"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
                "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": namespace}],
            },
        )

        def aggregated() -> bool:
            rules = rbac.read_cluster_role("edit").rules or []
            return any("sandboxclaims" in (rule.resources or []) for rule in rules)

        wait_for(aggregated, timeout=30, what="the tenant roles aggregated into edit")
        token = core.create_namespaced_service_account_token(
            "agent", namespace, {"spec": {"expirationSeconds": 3600}}
        ).status.token
        path = token_kubeconfig(kubeconfig, token, tmp_path / "tenant.kubeconfig")
        monkeypatch.setenv("KUBECONFIG", path)
        yield path
    finally:
        for doc in docs:
            rbac.delete_cluster_role(doc["metadata"]["name"])


def test_a_tenant_wakes_its_sandbox_through_its_claim(sleeper: Sleeper, tenant_kubeconfig: str) -> None:
    """A tenant (the chart's role: no `patch` on Sandboxes) asks for the resume on its claim; the operator
    passes the claim's value to the Sandbox (tests/integration/test_sandbox_idle.py). The stand-in here plays
    both: it resumes the sandbox once the claim asks. Before, the SDK's PATCH of the Sandbox was refused (403)."""

    def claim_asked() -> str | None:
        body = sleeper.custom.get_namespaced_custom_object(
            EXT, VERSION, sleeper.namespace, "sandboxclaims", sleeper.claim
        )
        return (body["metadata"].get("annotations") or {}).get(c.ANNOTATION_RESUME_REQUEST)

    def resume() -> None:
        wait_for(claim_asked, timeout=30, what="a resume request on the claim")
        sandbox_pod(sleeper.core, sleeper.namespace, sleeper.sandbox, outside_address(), None, {})
        _status(sleeper, ready=True)

    waker = threading.Thread(target=resume, daemon=True)
    waker.start()
    with SandboxClient(namespace=sleeper.namespace, wake_timeout=30) as sdk:
        result = sdk.get_sandbox(sleeper.claim).commands.run("echo tenant")
    waker.join(10)
    assert result.exit_code == 0 and result.stdout == "tenant\n"
    assert sleeper.annotation() is None  # the Sandbox itself was never written by the tenant


def test_a_sandbox_that_does_not_wake_is_a_one_line_error(sleeper: Sleeper, use_kubeconfig: None) -> None:
    with SandboxClient(namespace=sleeper.namespace, wake_timeout=2) as sdk:
        sandbox = sdk.get_sandbox("my-claim")
        with pytest.raises(WaitTimeout) as raised:
            sandbox.commands.run("true")
    message = str(raised.value)
    assert "\n" not in message
    assert f"sandbox {sleeper.namespace}/my-sandbox did not wake up within 2s" in message
    assert sleeper.annotation() is not None


def test_shadowctl_exec_wakes_an_idle_environment(
    k8s_api: client.ApiClient, namespace: str, tmp_path: Path, kubeconfig: str
) -> None:
    install_crds(k8s_api)
    custom = client.CustomObjectsApi(k8s_api)
    root = tmp_path / "workspace"
    root.mkdir()
    with proxied_environment(k8s_api, namespace, "ws", root):
        now = "2026-01-01T00:00:00Z"
        suspended = {
            "type": c.COND_WORKSPACE_READY,
            "status": "False",
            "reason": "Suspended",
            "message": "idle",
            "lastTransitionTime": now,
        }
        custom.patch_namespaced_custom_object_status(
            "shadow.dev",
            "v1alpha1",
            namespace,
            "shadowenvironments",
            "ws",
            {"status": {"conditions": [suspended]}},
        )

        def wake() -> None:
            def asked() -> bool:
                env = custom.get_namespaced_custom_object(
                    "shadow.dev", "v1alpha1", namespace, "shadowenvironments", "ws"
                )
                return c.ANNOTATION_RESUME_REQUEST in (env["metadata"].get("annotations") or {})

            wait_for(asked, timeout=30, what="a resume request on the environment")
            ready = {**suspended, "status": "True", "reason": "Ready", "message": ""}
            custom.patch_namespaced_custom_object_status(
                "shadow.dev",
                "v1alpha1",
                namespace,
                "shadowenvironments",
                "ws",
                {"status": {"conditions": [ready]}},
            )

        waker = threading.Thread(target=wake, daemon=True)
        waker.start()
        done = run(kubeconfig, "exec", "ws", "-n", namespace, "echo up")
        waker.join(10)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "up\n"
    assert f"waking environment {namespace}/ws…" in done.stderr
