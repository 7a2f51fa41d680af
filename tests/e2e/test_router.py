"""The router on kind, through its Services: a private preview (401 without a token, 200 with a signed link,
then by cookie), a WebSocket to a dev server started in the sandbox, and the unmodified k8s-agent-sandbox SDK
in its default connection mode (kubectl port-forward to `sandbox-router-svc`, X-Sandbox-* headers).

Needs, besides `make e2e`'s cluster, `kubectl` on PATH (the SDK runs it); the SDK is a dev dependency.
"""

from __future__ import annotations

import asyncio
import base64
import os
import uuid
from collections.abc import Iterator

import aiohttp
import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from shadow_operator.common.tokens import generate_key
from shadow_operator.sdk import preview_link
from shadow_operator.sdk.kube import connect
from shadow_operator.sdk.preview import PreviewKeysUnavailable

from tests.e2e.cluster import DEFAULT_TEMPLATE, FULLNAME, KUBECONFIG, OPERATOR_NAMESPACE, Cluster, eventually
from tests.e2e.devserver import WS_SERVER

pytestmark = pytest.mark.e2e

PREVIEW_DOMAIN = "preview.localhost"
ROUTER_SERVICE = f"{FULLNAME}-preview-router"
KEYS_SECRET = f"{FULLNAME}-preview-keys"
# The kubelet refreshes a mounted Secret within its sync period (about a minute), plus nginx's auth cache.
KEYS_PROPAGATION_SECONDS = 150


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def ensure_keys_secret(cluster: Cluster) -> None:
    """The router's signing keys (the chart mounts the Secret as optional: create it if the install has none)."""
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=KEYS_SECRET),
        data={"e2e-1": base64.b64encode(generate_key().encode()).decode()},
    )
    try:
        cluster.core.create_namespaced_secret(OPERATOR_NAMESPACE, body)
    except ApiException as exc:
        if exc.status != 409:
            raise


@pytest.fixture
def dev_server_sandbox(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """(sandbox, marker): a claimed sandbox of the router's namespace serving WS_SERVER on :3000."""
    namespace, name = OPERATOR_NAMESPACE, unique("private")
    cluster.claim(namespace, name, {"sandboxTemplateRef": {"name": DEFAULT_TEMPLATE}})
    try:
        sandbox = cluster.sandbox_of(cluster.wait_claim_ready(namespace, name))
        marker = f"dev server of {sandbox} {uuid.uuid4().hex}"
        with cluster.runtime(namespace, sandbox) as http:
            put = http.put("/v1/files/dev/server.py", content=WS_SERVER.encode())
            assert put.status_code == 204, put.text
            started = http.post("/v1/processes", json={"argv": ["python3", "dev/server.py", marker]})
            assert started.status_code == 201, started.text
        yield sandbox, marker
    finally:
        cluster.delete(namespace, "sandboxclaims", name)


def test_private_preview_needs_a_signed_link(cluster: Cluster, dev_server_sandbox: tuple[str, str]) -> None:
    sandbox, marker = dev_server_sandbox
    host = f"{sandbox}.{PREVIEW_DOMAIN}"
    ensure_keys_secret(cluster)
    cluster.custom.patch_namespaced_custom_object(
        "agents.x-k8s.io",
        "v1beta1",
        OPERATOR_NAMESPACE,
        "sandboxes",
        sandbox,
        {"metadata": {"annotations": {"shadow.dev/preview-access": "private"}}},
    )
    os.environ["KUBECONFIG"] = KUBECONFIG

    def signed() -> str | None:
        try:
            with connect() as kube:
                return preview_link(sandbox, OPERATOR_NAMESPACE, ttl_seconds=600, http=kube)
        except PreviewKeysUnavailable:
            return None  # the operator writes the namespace's link keys within 30 s of the router's keys

    # Signed with the namespace's own link keys (shadow-preview-link-keys), which the operator derives.
    link = eventually(signed, "the operator to publish the namespace's preview link keys", 90)
    assert link.startswith(f"http://{host}/?shadow_token=")
    path = link[len(f"http://{host}") :]

    with (
        cluster.port_forward(OPERATOR_NAMESPACE, f"svc/{ROUTER_SERVICE}", 80) as router,
        httpx.Client(base_url=router, timeout=10, headers={"Host": host}) as http,
    ):
        eventually(lambda: http.get("/").status_code == 401 or None, f"{host} to become private (401)", 60)
        refused = http.get("/")
        assert "private" in refused.text

        def exchanged() -> httpx.Response | None:
            response = http.get(path)
            return response if response.status_code == 302 else None

        # The keys Secret may have just been created: wait for the kubelet to hand it to router-auth.
        redirect = eventually(exchanged, "the signed link to be accepted", KEYS_PROPAGATION_SECONDS)
        assert redirect.headers["location"] == "/"
        cookie = redirect.headers["set-cookie"].split(";")[0]
        assert "HttpOnly" in redirect.headers["set-cookie"]

        page = http.get("/", headers={"Cookie": cookie})
        assert page.status_code == 200 and page.text == marker
        assert http.get("/", headers={"Cookie": cookie + "x"}).status_code == 401

        async def websocket() -> str:
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(f"{router}/ws", headers={"Host": host, "Cookie": cookie}) as ws,
            ):
                await ws.send_str("hmr")
                return str((await ws.receive(timeout=10)).data)

        assert asyncio.run(websocket()) == "echo:hmr"


def test_unmodified_sdk_in_its_default_mode(cluster: Cluster) -> None:
    from k8s_agent_sandbox import SandboxClient
    from k8s_agent_sandbox.models import SandboxLocalTunnelConnectionConfig

    os.environ["KUBECONFIG"] = KUBECONFIG
    pool = unique("sdk-pool")
    cluster.create(
        OPERATOR_NAMESPACE,
        "sandboxwarmpools",
        {
            "kind": "SandboxWarmPool",
            "metadata": {"name": pool},
            "spec": {"replicas": 1, "sandboxTemplateRef": {"name": DEFAULT_TEMPLATE}},
        },
    )
    try:
        # The default mode (a kubectl port-forward to svc/sandbox-router-svc), in the router's namespace.
        # api_client: the kubernetes library froze its default kubeconfig path when the test session imported it;
        # the SDK accepts a configured client for exactly this (its port-forward reads KUBECONFIG).
        sandbox_client = SandboxClient(
            connection_config=SandboxLocalTunnelConnectionConfig(router_namespace=OPERATOR_NAMESPACE),
            api_client=cluster.api,
        )
        sandbox = sandbox_client.create_sandbox(warmpool=pool, namespace=OPERATOR_NAMESPACE)
        try:
            result = sandbox.commands.run("echo hello from the sdk")
            assert result.exit_code == 0 and result.stdout.strip() == "hello from the sdk", result
            sandbox.files.write("sdk/notes.txt", b"through the router\n")
            assert sandbox.files.read("sdk/notes.txt") == b"through the router\n"
        finally:
            sandbox.terminate()
    finally:
        cluster.delete(OPERATOR_NAMESPACE, "sandboxwarmpools", pool)
