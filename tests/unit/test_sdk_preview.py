"""sdk.preview: the signed link from a Sandbox's previewURL and the keys Secret, and each way it can fail,
driven on httpx's mock transport (sync and async: one operation, two drivers)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from shadow_operator.common.tokens import KeyRing, TokenError
from shadow_operator.sdk import kube
from shadow_operator.sdk.errors import SandboxNotFoundError, ShadowError
from shadow_operator.sdk.preview import (
    PreviewKeysUnavailable,
    PreviewUnavailable,
    apreview_link,
    preview_link,
    signed_preview,
)

pytestmark = pytest.mark.unit

KEY = b"k" * 32
SANDBOX_PATH = "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/box"
SECRET_PATH = "/api/v1/namespaces/ns/secrets/shadow-preview-link-keys"  # the namespace's own link keys
ROOT_PATH = "/api/v1/namespaces/shadow-system/secrets/shadow-operator-preview-keys"  # the router's
SCOPED = {"annotations": {"shadow.dev/preview-link-namespace": "ns"}}
UID = "0b6a1c5e-8d2f-4e3a-9c7b-1f2e3d4c5b6a"
SANDBOX = {"metadata": {"name": "box", "uid": UID}, "status": {"previewURL": "https://box.preview.example/"}}


def status(code: int, message: str) -> httpx.Response:
    return httpx.Response(code, json={"kind": "Status", "code": code, "message": message})


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def cluster(
    sandbox: dict[str, Any] | None = None, secret: dict[str, Any] | httpx.Response | None = None
) -> Callable[[httpx.Request], httpx.Response]:
    sandbox_body = SANDBOX if sandbox is None else sandbox
    secret_body = {"metadata": SCOPED, "data": {"k1": b64(KEY)}} if secret is None else secret

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == SANDBOX_PATH:
            return httpx.Response(200, json=sandbox_body)
        if request.url.path == ROOT_PATH:
            return httpx.Response(200, json={"data": {"k1": b64(KEY)}})
        if request.url.path == SECRET_PATH:
            return (
                secret_body
                if isinstance(secret_body, httpx.Response)
                else httpx.Response(200, json=secret_body)
            )
        return status(404, f"{request.url.path} not found")

    return handle


def client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(base_url="https://api", transport=httpx.MockTransport(handler))


def test_link_carries_a_token_for_that_sandbox_until_the_ttl() -> None:
    with client(cluster()) as http:
        link = kube.run(http, signed_preview("box", "ns", ttl_seconds=600, now=1_000_000))
    assert link.url.startswith("https://box.preview.example/?shadow_token=v2.k1.")
    assert link.expires_at == 1_000_600 and (link.sandbox, link.namespace) == ("box", "ns")
    claims = KeyRing({"k1": KEY}).verify(link.url.split("shadow_token=")[1], now=1_000_599)
    # Bound to this incarnation of the sandbox: its uid, read from the API server with the previewURL.
    assert (claims.namespace, claims.sandbox, claims.uid, claims.expires) == ("ns", "box", UID, 1_000_600)


def test_sync_and_async_twins_agree() -> None:
    with client(cluster()) as http:
        sync = preview_link("box", "ns", http=http)

    async def run() -> str:
        async with httpx.AsyncClient(
            base_url="https://api", transport=httpx.MockTransport(cluster())
        ) as http:
            return await apreview_link("box", "ns", http=http)

    for url in (sync, asyncio.run(run())):
        assert KeyRing({"k1": KEY}).verify(url.split("shadow_token=")[1]).sandbox == "box"


@pytest.mark.parametrize(
    ("sandbox", "secret", "error", "needle"),
    [
        ({"metadata": {"uid": UID}, "status": {}}, None, PreviewUnavailable, "no status.previewURL"),
        ({"status": SANDBOX["status"]}, None, ShadowError, "no metadata.uid"),
        (None, status(404, 'secrets "x" not found'), PreviewKeysUnavailable, "does not exist"),
        (None, status(403, "secrets is forbidden"), PreviewKeysUnavailable, "forbidden"),
        (None, {"data": {}}, PreviewKeysUnavailable, "holds no preview key"),
        (None, {"data": {"k1": b64(b"short")}}, PreviewKeysUnavailable, "shorter"),
        (
            None,
            {
                "metadata": {"annotations": {"shadow.dev/preview-link-namespace": "team-b"}},
                "data": {"k1": b64(KEY)},
            },
            PreviewKeysUnavailable,
            "signs links for namespace team-b, not ns",
        ),
    ],
)
def test_each_failure_is_a_typed_error_with_a_hint(
    sandbox: dict[str, Any] | None, secret: Any, error: type[ShadowError], needle: str
) -> None:
    with client(cluster(sandbox, secret)) as http, pytest.raises(error, match=needle) as caught:
        preview_link("box", "ns", http=http)
    assert caught.value.hint


def test_missing_sandbox_and_bad_ttl() -> None:
    with client(cluster()) as http:
        with pytest.raises(SandboxNotFoundError, match="ns/other does not exist"):
            preview_link("other", "ns", http=http)
        with pytest.raises(ShadowError, match="live a while"):
            preview_link("box", "ns", ttl_seconds=0, http=http)


def test_links_longer_than_the_routers_maximum_are_not_signed() -> None:
    """The router refuses links signed to live past previewRouter.maxTokenSeconds (24 h by default): the SDK
    says so instead of handing out a link that opens nothing; a larger maximum is the caller's to give."""
    with client(cluster()) as http:
        with pytest.raises(ShadowError, match="at most 86400s, not 86401s") as refused:
            preview_link("box", "ns", ttl_seconds=86401, http=http)
        assert "maxTokenSeconds" in (refused.value.hint or "")
        link = preview_link("box", "ns", ttl_seconds=7 * 86400, max_ttl_seconds=7 * 86400, http=http)
    claims = KeyRing({"k1": KEY}).verify(link.split("shadow_token=")[1])
    assert claims.expires - claims.issued == 7 * 86400


def test_the_routers_own_keys_sign_for_the_namespace_as_the_router_derives_them() -> None:
    """An administrator may name the router's keys Secret (no namespace annotation): the link is signed with the
    keys derived for the sandbox's namespace, never with the root keys themselves (the router refuses those)."""
    with client(cluster()) as http:
        link = preview_link(
            "box", "ns", keys_secret="shadow-operator-preview-keys", keys_namespace="shadow-system", http=http
        )
    token = link.split("shadow_token=")[1]
    assert KeyRing({"k1": KEY}).for_namespace("ns").verify(token).namespace == "ns"
    with pytest.raises(TokenError):
        KeyRing({"k1": KEY}).verify(token)
