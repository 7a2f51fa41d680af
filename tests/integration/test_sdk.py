"""The SDK (sync and async twins) against a real API server with the operator running: typed errors that carry
the failure code, waits that follow objects by watching, and claims of plain sandboxes (kwok runs the Pods)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from shadow_operator.sdk import (
    AsyncSandboxClient,
    AsyncShadowGateway,
    EnvironmentFailed,
    EnvironmentNotFound,
    EnvironmentSpec,
    GitSource,
    LocalSource,
    SandboxClient,
    SandboxNotFoundError,
    SandboxNotReadyError,
    SandboxTemplateNotFoundError,
    ShadowGateway,
    kube,
    localdirs,
)
from shadow_operator.sdk import sandbox as sandbox_ops

from tests.support.sandbox_operator import ENVIRONMENT, TEMPLATE, Objects, template_body

pytestmark = pytest.mark.integration

ABSENT_TEMPLATE = EnvironmentSpec(git=[GitSource("https://example.com/o/tool.git")], template="absent")


@pytest.fixture
def use_kubeconfig(kubeconfig: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", kubeconfig)


def test_gateway_errors_carry_the_failure_code(objs: Objects, use_kubeconfig: None) -> None:
    ns = objs.namespace
    with ShadowGateway("missing", namespace=ns) as gw, pytest.raises(EnvironmentNotFound) as missing:
        gw.status()
    assert missing.value.hint and "shadowctl list" in missing.value.hint

    with ShadowGateway("sync-env", namespace=ns) as gw:
        with pytest.raises(EnvironmentFailed) as failed:
            gw.start(ABSENT_TEMPLATE, timeout=60)
        assert failed.value.code == "TemplateNotFound" and "absent" in failed.value.message
        gw.stop(wait=True, timeout=60)
    assert objs.get(ENVIRONMENT, "sync-env", "v1alpha1") is None


def test_async_gateway_is_the_same(objs: Objects, use_kubeconfig: None, tmp_path: Path) -> None:
    ns = objs.namespace

    async def scenario() -> str:
        async with AsyncShadowGateway("async-env", namespace=ns) as gw:
            try:
                await gw.start(ABSENT_TEMPLATE, timeout=60)
            except EnvironmentFailed as exc:
                code = exc.code
            else:
                raise AssertionError("an environment without its template cannot become Ready")
            env = await gw.status()
            assert env.status is not None and env.status.failure is not None
            await gw.stop(wait=True, timeout=60)
            return code

    assert asyncio.run(scenario()) == "TemplateNotFound"
    assert objs.get(ENVIRONMENT, "async-env", "v1alpha1") is None


def test_local_directories_are_recorded_for_promote(
    objs: Objects, use_kubeconfig: None, tmp_path: Path
) -> None:
    (tmp_path / "core").mkdir()
    spec = EnvironmentSpec(local=[LocalSource(tmp_path / "core")], template="absent")
    with ShadowGateway("recorded", namespace=objs.namespace) as gw:
        gw.create(spec)
        # This machine's own record, which promote trusts (the annotation only where it agrees).
        recorded = localdirs.recorded(str(gw.client.base_url), objs.namespace, "recorded")
        assert recorded == {"core": str((tmp_path / "core").resolve())}
        with pytest.raises(SandboxNotReadyError):  # no workspace yet: a typed error, not a crash
            gw.plan_promote()
    body = objs.get(ENVIRONMENT, "recorded", "v1alpha1")
    assert body is not None
    assert body["metadata"]["annotations"]["local.shadow.dev/core"] == str(tmp_path / "core")


def test_sandbox_client_sync_and_async(objs: Objects, use_kubeconfig: None) -> None:
    ns = objs.namespace
    objs.create(TEMPLATE, template_body("py"))

    with SandboxClient(namespace=ns) as client:
        with pytest.raises(SandboxTemplateNotFoundError) as absent:
            client.create_sandbox("nope", claim_name="nope-claim", sandbox_ready_timeout=60)
        assert absent.value.code == "TemplateNotFound"
        sandbox = client.create_sandbox("py", claim_name="sync-claim", sandbox_ready_timeout=90)
        assert sandbox.sandbox_name == "sync-claim" and sandbox.namespace == ns
        assert sorted(c["metadata"]["name"] for c in client.list_sandboxes()) == ["nope-claim", "sync-claim"]
        assert client.get_sandbox("sync-claim").sandbox_name == "sync-claim"
        client.delete_sandbox("nope-claim")
    # Leaving the context deleted what the client created.
    objs.wait_gone(("extensions.agents.x-k8s.io", "sandboxclaims"), "sync-claim")

    async def scenario() -> str:
        async with AsyncSandboxClient(namespace=ns) as client:
            sandbox = await client.create_sandbox("py", claim_name="async-claim", sandbox_ready_timeout=90)
            await sandbox.terminate()
            try:
                await client.get_sandbox("async-claim")
            except SandboxNotFoundError as exc:
                return exc.code
            return "still there"

    assert asyncio.run(scenario()) == "NotFound"
    with kube.connect() as http, pytest.raises(SandboxNotFoundError):
        kube.run(http, sandbox_ops.get("ghost", ns))


def test_a_wait_leaves_the_clients_connection_open_for_what_follows(
    objs: Objects, use_kubeconfig: None
) -> None:
    """A claim's wait ends its watch early, which ends that watch's connection: the requests that follow (the
    first command's reads) go on the client's open one, not through a new TLS handshake."""
    ns = objs.namespace
    objs.create(TEMPLATE, template_body("py"))
    opened: list[str] = []

    def trace(event: str, info: dict[str, object]) -> None:
        if event == "connection.connect_tcp.complete":
            opened.append(event)

    def traced(request: httpx.Request) -> None:
        request.extensions["trace"] = trace

    async def atrace(event: str, info: dict[str, object]) -> None:
        trace(event, info)

    async def atraced(request: httpx.Request) -> None:
        request.extensions["trace"] = atrace

    with kube.connect() as http, SandboxClient(namespace=ns, client=http) as client:
        http.event_hooks["request"].append(traced)
        client.list_sandboxes()
        assert len(opened) == 1
        client.create_sandbox("py", claim_name="sync-claim", sandbox_ready_timeout=90)
        client.get_sandbox("sync-claim")
        assert len(opened) == 1

    async def scenario() -> int:
        async with kube.connect_async() as http, AsyncSandboxClient(namespace=ns, client=http) as client:
            http.event_hooks["request"].append(atraced)
            await client.list_sandboxes()
            await client.create_sandbox("py", claim_name="async-claim", sandbox_ready_timeout=90)
            await client.get_sandbox("async-claim")
        return len(opened)

    opened.clear()
    assert asyncio.run(scenario()) == 1
