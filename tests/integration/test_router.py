"""The router for real: nginx (Debian's binary, the chart's rendered config) and router-auth (a real process
against the local API server) in front of real HTTP, WebSocket and SSE servers on loopback.

The operator does not run: the test writes the Sandboxes, their Pods (never scheduled; the test sets their
status, with loopback pod IPs 127.0.0.x so each sandbox has an address of its own) and runtime token Secrets
the way the operator would, plus objects that must stay unreachable: a plain Service with its pod, a pod that
carries a sandbox's label but is not owned by it, a sandbox in a namespace the router does not serve.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.clients.kube import Kube
from shadow_operator.common.tokens import KeyRing
from shadow_operator.controllers.previewkeys import LinkKeysPublisher
from shadow_operator.sdk.errors import ShadowError
from shadow_operator.sdk.preview import preview_link

from tests.support.controlplane import absent, wait_for
from tests.support.rbac import applied, rendered, token_kubeconfig
from tests.support.router import (
    SSE_EVENTS,
    SSE_GAP_SECONDS,
    Box,
    Router,
    Series,
    Upstreams,
    managed_sandbox,
    metric,
    outside_address,
    raw_get,
    router_account,
    running_router,
    sandbox_object,
    sandbox_pod,
    scrape,
    set_ready,
)
from tests.support.sandbox_operator import install_crds

pytestmark = pytest.mark.integration

DOMAIN = "preview.test"
KEY = b"k" * 32
NGINX_DEFAULT_PAGE = "<center>nginx"


@dataclass
class World:
    router: Router
    namespace: str
    other_namespace: str
    tenant_b: str  # a second namespace the router serves (another tenant's)
    boxes: dict[str, Box]
    uids: dict[str, str]  # metadata.uid of each managed sandbox: what preview tokens are bound to
    root: KeyRing  # the router's keys
    keys: KeyRing  # `namespace`'s link keys, derived from them: what its tenant signs with
    custom: client.CustomObjectsApi
    upstreams: Upstreams


@pytest.fixture(scope="module")
def world(
    k8s_api: client.ApiClient, kubeconfig: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    install_crds(k8s_api)
    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    suffix = uuid.uuid4().hex[:6]
    namespace, other, tenant_b = f"router-{suffix}", f"router-other-{suffix}", f"router-b-{suffix}"
    for ns in (namespace, other, tenant_b):
        core.create_namespace({"metadata": {"name": ns}})
    upstreams = Upstreams()
    boxes: dict[str, Box] = {}
    names = ("sb-a", "sb-b", "sb-private", "sb-cold", "sb-gone", "elsewhere", "vault")
    for number, name in enumerate(names, start=2):
        ip = f"127.0.0.{number}"
        boxes[name] = Box(
            name=name,
            ip=ip,
            preview_port=upstreams.start(f"{name}/preview", ip),
            runtime_port=upstreams.start(f"{name}/runtime", ip),
            token=f"runtime-token-of-{name}-{uuid.uuid4().hex}",
        )
    apis = (custom, core)
    made = {name: managed_sandbox(apis, namespace, boxes[name]) for name in ("sb-a", "sb-b", "sb-gone")}
    made["sb-private"] = managed_sandbox(apis, namespace, boxes["sb-private"], private=True)
    made["sb-cold"] = managed_sandbox(apis, namespace, boxes["sb-cold"], ready=False)
    made["elsewhere"] = managed_sandbox(apis, other, boxes["elsewhere"])
    made["vault"] = managed_sandbox(apis, tenant_b, boxes["vault"], private=True)
    uids = {name: str(body["metadata"]["uid"]) for name, body in made.items()}
    # Must stay unreachable: a Service + pod that are no sandbox, and a pod with a sandbox's label and name
    # for a Sandbox that does not own it.
    intruder_port = upstreams.start("intruder", "127.0.0.20")
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "other-svc"},
            "spec": {"selector": {"app": "other"}, "ports": [{"port": intruder_port}]},
        },
    )
    sandbox_pod(core, namespace, "other-svc", "127.0.0.20", None, {"app": "other"})
    # It declares sb-a's runtime port, so the SDK path's answer for it is about routing, not an undeclared port.
    orphan = Box("sb-orphan", "127.0.0.20", intruder_port, boxes["sb-a"].runtime_port, "x")
    owner = sandbox_object(custom, namespace, "sb-orphan", orphan, {})
    set_ready(custom, namespace, "sb-orphan", True)
    del owner
    sandbox_pod(
        core,
        namespace,
        "sb-orphan",
        "127.0.0.20",
        None,
        {"agents.x-k8s.io/sandbox-name-hash": naming.name_hash("sb-orphan")},
    )

    directory = tmp_path_factory.mktemp("router")
    values = [
        "--set=previewRouter.enabled=true",
        f"--set=previewRouter.domain={DOMAIN}",
        "--set=previewRouter.scheme=http",
        f"--set=previewRouter.sandboxNamespaces={{{namespace},{tenant_b}}}",
        "--set=previewRouter.authCacheSeconds=2",
    ]
    root = KeyRing({"k1": KEY})
    try:
        # router-auth runs as the chart's router ServiceAccount with the chart's RBAC (issue 28 L4: no list or
        # watch of Secrets), not as an administrator.
        with (
            router_account(k8s_api, kubeconfig, values, directory) as account,
            running_router(directory, account, values) as router,
        ):
            (router.keys_dir / "k1").write_bytes(KEY)
            keys = root.for_namespace(namespace)
            yield World(router, namespace, other, tenant_b, boxes, uids, root, keys, custom, upstreams)
    finally:
        upstreams.close()
        for ns in (namespace, other, tenant_b):
            core.delete_namespace(ns, propagation_policy="Background")


def _preview(
    world: World, host: str | None, path: str = "/", headers: list[tuple[str, str]] | None = None
) -> tuple[int, dict[str, str], str]:
    return raw_get(world.router.preview_port, path, headers or [], host=host)


def _served_by(body: str) -> str | None:
    try:
        return str(json.loads(body)["server"])
    except (ValueError, KeyError, TypeError):
        return None


# -------------------------------------------------------------------------------------------- routing
def test_routes_by_host_to_the_sandbox_preview_port(world: World) -> None:
    for name in ("sb-a", "sb-b"):
        status, _, body = _preview(world, f"{name}.{DOMAIN}", "/some/page?x=1")
        assert status == 200, body
        answer = json.loads(body)
        assert answer["server"] == f"{name}/preview"
        assert answer["path"] == "/some/page?x=1"
        assert answer["headers"]["Host"] == f"{name}.{DOMAIN}"


def test_unknown_sandbox_gets_a_friendly_404(world: World) -> None:
    status, headers, body = _preview(world, f"no-such-sandbox.{DOMAIN}")
    assert status == 404
    assert headers["content-type"].startswith("text/html")
    assert "No such preview" in body and "no-such-sandbox" in body
    assert NGINX_DEFAULT_PAGE not in body


def test_not_ready_sandbox_gets_503_with_retry(world: World) -> None:
    status, headers, body = _preview(world, f"sb-cold.{DOMAIN}")
    assert status == 503
    assert headers.get("retry-after") == "5"
    assert "starting" in body and NGINX_DEFAULT_PAGE not in body


@pytest.mark.parametrize(
    "host",
    [
        f"other-svc.{DOMAIN}",  # a Service of the namespace that is no sandbox
        f"OTHER-SVC.{DOMAIN}",  # the same in capitals
        f"elsewhere.{DOMAIN}",  # a sandbox of a namespace the router does not serve
        f"sb-a.other-svc.{DOMAIN}",  # dotted label
        f"sb-a%2eother-svc.{DOMAIN}",  # percent-encoded dot
        f"other-svc%2E{DOMAIN}",
        "127.0.0.20",  # an IP
        "127.0.0.20:80",
        f"127.0.0.20.{DOMAIN}",
        "a" * 64 + f".{DOMAIN}",  # over-long label
        f"-sb-a.{DOMAIN}",
        f"sb_a.{DOMAIN}",
        f"sb-a.{DOMAIN}.evil.example",
        f"kubernetes.{DOMAIN}",
        f"kubernetes.default.svc.{DOMAIN}",
        "other-svc",
        "",  # empty Host
        None,  # no Host at all
    ],
)
def test_host_attack_corpus_reaches_nothing_else(world: World, host: str | None) -> None:
    status, headers, body = _preview(world, host)
    assert status in (400, 404), (status, body)
    assert headers["content-type"].startswith("text/html")
    assert _served_by(body) is None, body
    assert NGINX_DEFAULT_PAGE not in body


def test_sandbox_whose_labelled_pod_it_does_not_own_is_not_routed(world: World) -> None:
    # A pod with the sandbox's name and label, but no owner reference to it: never an upstream.
    status, _, body = _preview(world, f"sb-orphan.{DOMAIN}")
    assert status == 503 and _served_by(body) is None


@pytest.mark.parametrize("host", [f"SB-A.{DOMAIN.upper()}", f"sb-a.{DOMAIN}:3000", f"sb-a.{DOMAIN}:1"])
def test_case_and_explicit_port_still_reach_only_that_sandbox(world: World, host: str) -> None:
    status, _, body = _preview(world, host)
    assert status == 200, body
    assert _served_by(body) == "sb-a/preview"


def test_absolute_uri_in_the_request_line_routes_by_its_host(world: World) -> None:
    status, _, body = _preview(world, "sb-a." + DOMAIN, f"http://other-svc.{DOMAIN}/")
    assert status == 404 and _served_by(body) is None


def test_deleted_sandbox_stops_being_routed(world: World) -> None:
    host = f"sb-gone.{DOMAIN}"
    assert _served_by(_preview(world, host)[2]) == "sb-gone/preview"
    world.custom.delete_namespaced_custom_object(
        "agents.x-k8s.io", "v1beta1", world.namespace, "sandboxes", "sb-gone"
    )
    # The watch removes it at once; nginx may still hold an allowed answer for authCacheSeconds (2 here).
    wait_for(lambda: _preview(world, host)[0] == 404, timeout=15, what="sb-gone to answer 404")


# --------------------------------------------------------------------------------- streams and bodies
def test_websocket_round_trips(world: World) -> None:
    async def talk() -> list[str]:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"{world.router.preview}/ws", headers={"Host": f"sb-a.{DOMAIN}"}) as ws,
        ):
            got = []
            for text in ("hello", "vite-hmr"):
                await ws.send_str(text)
                got.append((await ws.receive(timeout=5)).data)
            return got

    assert asyncio.run(talk()) == ["sb-a/preview:hello", "sb-a/preview:vite-hmr"]


def test_server_sent_events_arrive_one_by_one(world: World) -> None:
    arrivals: list[float] = []
    with httpx.stream(
        "GET", f"{world.router.preview}/events", headers={"Host": f"sb-b.{DOMAIN}"}, timeout=10
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                arrivals.append(time.monotonic())
    assert len(arrivals) == SSE_EVENTS
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # Buffered, they would arrive together at the end; streamed, about SSE_GAP_SECONDS apart.
    assert all(gap > SSE_GAP_SECONDS / 2 for gap in gaps), gaps


def test_large_request_bodies_pass(world: World) -> None:
    body = b"x" * (32 * 1024 * 1024)
    response = httpx.post(
        f"{world.router.preview}/upload", content=body, headers={"Host": f"sb-a.{DOMAIN}"}, timeout=60
    )
    assert response.status_code == 200, response.text
    assert response.json()["body_length"] == len(body)


# ---------------------------------------------------------------------------------- private previews
def test_private_preview_without_token_is_401(world: World) -> None:
    status, headers, body = _preview(world, f"sb-private.{DOMAIN}")
    assert status == 401
    assert "private" in body and NGINX_DEFAULT_PAGE not in body
    assert headers["content-type"].startswith("text/html")


@pytest.mark.parametrize(
    "case",
    [
        "valid",
        "expired",
        "too-long-lived",
        "issued-ahead",
        "other-uid",
        "tampered-signature",
        "tampered-payload",
        "other-sandbox",
        "other-namespace",
        "unknown-key",
        "garbage",
    ],
)
def test_private_preview_token_in_header(world: World, case: str) -> None:
    keys, ns, uid = world.keys, world.namespace, world.uids["sb-private"]
    token = {
        "valid": lambda: keys.sign(ns, "sb-private", uid, 60),
        "expired": lambda: keys.sign(ns, "sb-private", uid, 10, now=time.time() - 60),
        "too-long-lived": lambda: keys.sign(ns, "sb-private", uid, 24 * 3600 + 1),
        "issued-ahead": lambda: keys.sign(ns, "sb-private", uid, 60, now=time.time() + 3600),
        "other-uid": lambda: keys.sign(ns, "sb-private", world.uids["sb-a"], 60),
        "tampered-signature": lambda: keys.sign(ns, "sb-private", uid, 60)[:-2] + "AA",
        "tampered-payload": lambda: _swap_payload(
            keys.sign(ns, "sb-private", uid, 60), keys.sign(ns, "sb-a", world.uids["sb-a"], 60)
        ),
        "other-sandbox": lambda: keys.sign(ns, "sb-a", world.uids["sb-a"], 60),
        "other-namespace": lambda: keys.sign(world.other_namespace, "sb-private", uid, 60),
        "unknown-key": lambda: KeyRing({"k9": b"z" * 32}).sign(ns, "sb-private", uid, 60),
        "garbage": lambda: "not-a-token",
    }[case]()
    status, _, body = _preview(world, f"sb-private.{DOMAIN}", headers=[("X-Shadow-Preview-Token", token)])
    if case == "valid":
        assert status == 200 and _served_by(body) == "sb-private/preview"
        # The token is the router's business: the sandbox never sees it.
        assert "X-Shadow-Preview-Token" not in json.loads(body)["headers"]
    else:
        assert status == 401, (case, body)


def _swap_payload(token: str, other: str) -> str:
    parts, donor = token.split("."), other.split(".")
    return ".".join([parts[0], parts[1], donor[2], parts[3]])


def test_signed_link_is_exchanged_for_a_host_only_cookie(world: World) -> None:
    token = world.keys.sign(world.namespace, "sb-private", world.uids["sb-private"], 120)
    status, headers, _ = _preview(world, f"sb-private.{DOMAIN}", f"/app/page?shadow_token={token}&tab=2")
    assert status == 302
    assert headers["location"] == "/app/page?tab=2"
    cookie = headers["set-cookie"]
    name_value, *attributes = [part.strip() for part in cookie.split(";")]
    assert name_value == f"shadow_preview={token}"
    assert "HttpOnly" in attributes and "Path=/" in attributes and "SameSite=Lax" in attributes
    assert not any(a.lower().startswith("domain=") for a in attributes), "host-only: no Domain attribute"
    assert 100 <= int(next(a for a in attributes if a.startswith("Max-Age="))[8:]) <= 120

    status, _, body = _preview(
        world, f"sb-private.{DOMAIN}", "/app/page?tab=2", [("Cookie", f"a=b; {name_value}")]
    )
    assert status == 200 and _served_by(body) == "sb-private/preview"
    # The same cookie presented to another private sandbox's host would be for the wrong sandbox: the
    # cookie is host-only anyway, and the token names its sandbox.
    status, _, _ = _preview(
        world,
        f"sb-private.{DOMAIN}",
        "/",
        [("Cookie", "shadow_preview=" + world.keys.sign(world.namespace, "sb-a", world.uids["sb-a"], 60))],
    )
    assert status == 401


def test_invalid_signed_link_is_401_not_a_redirect(world: World) -> None:
    expired = world.keys.sign(
        world.namespace, "sb-private", world.uids["sb-private"], 10, now=time.time() - 60
    )
    status, headers, body = _preview(world, f"sb-private.{DOMAIN}", f"/?shadow_token={expired}")
    assert status == 401 and "set-cookie" not in headers
    assert "expired" in body


def test_websocket_to_a_private_preview_needs_the_cookie(world: World) -> None:
    token = world.keys.sign(world.namespace, "sb-private", world.uids["sb-private"], 60)

    async def talk(cookie: str | None) -> str:
        headers = {"Host": f"sb-private.{DOMAIN}"}
        if cookie:
            headers["Cookie"] = cookie
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(f"{world.router.preview}/ws", headers=headers) as ws:
                    await ws.send_str("hi")
                    return str((await ws.receive(timeout=5)).data)
            except aiohttp.WSServerHandshakeError as exc:
                return f"refused {exc.status}"

    assert asyncio.run(talk(None)) == "refused 401"
    assert asyncio.run(talk(f"shadow_preview={token}")) == "sb-private/preview:hi"


# --------------------------------------------------------------------------------- shadowctl preview
def _shadowctl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    shadowctl = str(Path(sys.executable).parent / "shadowctl")
    env = {**os.environ, "KUBECONFIG": kubeconfig, "COLUMNS": "80"}
    return subprocess.run([shadowctl, *args], env=env, capture_output=True, text=True, timeout=120)


def _open_link(world: World, url: str) -> tuple[int, str]:
    """Follow a signed link as a browser would: the redirect that sets the cookie, then the page."""
    parts = urlsplit(url)
    status, headers, _ = _preview(world, parts.netloc, f"{parts.path}?{parts.query}")
    assert status == 302, (status, headers)
    cookie = headers["set-cookie"].split(";")[0]
    status, _, body = _preview(world, parts.netloc, headers["location"], [("Cookie", cookie)])
    return status, body


def test_shadowctl_prints_links_that_open_the_private_preview(
    world: World, k8s_api: client.ApiClient, kubeconfig: str
) -> None:
    """`shadowctl preview ENV` and `shadowctl sandbox preview CLAIM`, signed with the keys Secret the router
    mounts, opened through the real nginx and router-auth."""
    ns, custom = world.namespace, world.custom
    host = f"sb-private.{DOMAIN}"
    custom.patch_namespaced_custom_object_status(
        "agents.x-k8s.io",
        "v1beta1",
        ns,
        "sandboxes",
        "sb-private",
        {"status": {"previewURL": f"http://{host}/"}},
    )
    client.CoreV1Api(k8s_api).create_namespaced_secret(
        ns, {"metadata": {"name": "preview-keys"}, "data": {"k1": base64.b64encode(KEY).decode()}}
    )
    custom.create_namespaced_custom_object(
        "shadow.dev",
        "v1alpha1",
        ns,
        "shadowenvironments",
        {
            "apiVersion": "shadow.dev/v1alpha1",
            "kind": "ShadowEnvironment",
            "metadata": {"name": "env-p"},
            "spec": {"sources": [{"name": "s", "repo": "o/s", "upload": {}}]},
        },
    )
    custom.patch_namespaced_custom_object_status(
        "shadow.dev", "v1alpha1", ns, "shadowenvironments", "env-p", {"status": {"sandbox": "sb-private"}}
    )
    custom.create_namespaced_custom_object(
        "extensions.agents.x-k8s.io",
        "v1beta1",
        ns,
        "sandboxclaims",
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {"name": "claim-p"},
            "spec": {"sandboxTemplateRef": {"name": "t"}},
        },
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": now}
    custom.patch_namespaced_custom_object_status(
        "extensions.agents.x-k8s.io",
        "v1beta1",
        ns,
        "sandboxclaims",
        "claim-p",
        {"status": {"conditions": [ready], "sandbox": {"name": "sb-private"}}},
    )
    keys = ["--keys-secret", "preview-keys", "--keys-namespace", ns, "-n", ns]

    text = _shadowctl(kubeconfig, "preview", "env-p", *keys, "--ttl", "300")
    assert text.returncode == 0, text.stderr
    url = text.stdout.strip()
    assert "\n" not in url and url.startswith(f"http://{host}/?shadow_token=")  # one line, however narrow
    assert "valid until" in text.stderr
    assert world.keys.verify(url.split("shadow_token=")[1]).expires <= time.time() + 300
    status, body = _open_link(world, url)
    assert status == 200 and _served_by(body) == "sb-private/preview"

    as_json = _shadowctl(kubeconfig, "sandbox", "preview", "claim-p", *keys, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert (data["sandbox"], data["namespace"]) == ("sb-private", ns)
    assert data["expiresAt"].endswith("Z") and data["url"].startswith(f"http://{host}/?shadow_token=")
    status, body = _open_link(world, data["url"])
    assert status == 200 and _served_by(body) == "sb-private/preview"

    as_yaml = _shadowctl(kubeconfig, "sandbox", "preview", "claim-p", *keys, "-o", "yaml")
    # -o yaml is not re-wrapped at the terminal width (COLUMNS=80 here): the link parses back whole.
    assert as_yaml.returncode == 0, as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout)["url"].startswith(f"http://{host}/?shadow_token=")


ROOT_KEYS = "root-keys"


@dataclass
class OperatorAccount:
    kubeconfig: str
    namespace: str  # the release's (and the router's) namespace, where the root keys Secret is


@pytest.fixture
def operator_account(
    world: World, k8s_api: client.ApiClient, kubeconfig: str, tmp_path: Path
) -> Iterator[OperatorAccount]:
    """The operator's ServiceAccount with the chart's RBAC for a router serving the world's two tenant
    namespaces (its keys Secret ROOT_KEYS in the release namespace), the operator itself watching a third: the
    link keys are published with the Roles the chart gives for them and nothing else."""
    release = f"op-{uuid.uuid4().hex[:6]}"
    home = f"{release}-system"
    values = [
        "--set=previewRouter.enabled=true",
        f"--set=previewRouter.sandboxNamespaces={{{world.namespace},{world.tenant_b}}}",
        f"--set=previewRouter.keysSecret={ROOT_KEYS}",
        f"--set=operator.watchNamespaces={{{world.other_namespace}}}",
    ]
    docs = rendered(release, home, values, "templates/rbac.yaml", "templates/serviceaccount.yaml")
    core = client.CoreV1Api(k8s_api)
    with applied(k8s_api, docs, home) as account:
        request = {"spec": {"expirationSeconds": 3600}}
        token = str(core.create_namespaced_service_account_token(account, home, request).status.token)
        yield OperatorAccount(token_kubeconfig(kubeconfig, token, tmp_path / "operator"), home)


def _publish_link_keys(operator: OperatorAccount, namespaces: list[str]) -> list[str]:
    """One pass of the operator's link keys loop (controllers/previewkeys.py), as the operator's account."""

    async def run() -> list[str]:
        kube = await Kube.connect()
        try:
            return await LinkKeysPublisher(kube, operator.namespace, ROOT_KEYS, namespaces).publish()
        finally:
            await kube.close()

    previous = os.environ["KUBECONFIG"]
    os.environ["KUBECONFIG"] = operator.kubeconfig
    try:
        return asyncio.run(run())
    finally:
        os.environ["KUBECONFIG"] = previous


def test_a_tenant_signs_preview_links_for_its_own_namespace_only(
    world: World,
    k8s_api: client.ApiClient,
    kubeconfig: str,
    operator_account: OperatorAccount,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 28 L3, through the real router: the operator (its account, the chart's RBAC) writes each served
    namespace its own link keys; a tenant of namespace A reads A's (and may not read B's nor the root), and a
    link it signs for B's private sandbox is refused while its link to A's own private sandbox opens. Rotation
    and a tenant's edits are followed."""
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    ns_a, ns_b, home = world.namespace, world.tenant_b, operator_account.namespace
    core.create_namespaced_secret(
        home, {"metadata": {"name": ROOT_KEYS}, "data": {"k1": base64.b64encode(KEY).decode()}}
    )

    def publish() -> list[str]:
        return _publish_link_keys(operator_account, [ns_a, ns_b])

    assert publish() == [ns_a, ns_b]
    assert publish() == []  # nothing changed: nothing written

    token = _service_account_token(core, ns_a, "tenant-a")
    read = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    _grant(rbac, ns_a, (ns_a, "tenant-a"), "tenant-a", read)
    tenant = client.CoreV1Api(
        config.new_client_from_config(token_kubeconfig(kubeconfig, token, tmp_path / "tenant-a"))
    )
    secret = tenant.read_namespaced_secret(c.PREVIEW_LINK_KEYS_SECRET, ns_a)
    assert secret.metadata.annotations[c.ANNOTATION_PREVIEW_LINK_NAMESPACE] == ns_a
    mine = KeyRing.from_secret_data(secret.data)
    for namespace, name in ((ns_b, c.PREVIEW_LINK_KEYS_SECRET), (home, ROOT_KEYS)):
        with pytest.raises(ApiException) as refused:
            tenant.read_namespaced_secret(name, namespace)
        assert refused.value.status == 403

    vault_host = f"vault.{DOMAIN}"
    forged = mine.sign(ns_b, "vault", world.uids["vault"], 60)
    status, _, body = _preview(world, vault_host, headers=[("X-Shadow-Preview-Token", forged)])
    assert status == 401 and _served_by(body) is None, body
    status, _, body = _preview(world, vault_host, f"/?shadow_token={forged}")
    assert status == 401 and _served_by(body) is None, body  # no cookie for it either
    legacy = world.root.sign(ns_b, "vault", world.uids["vault"], 60)  # the one shared key of before
    assert _preview(world, vault_host, headers=[("X-Shadow-Preview-Token", legacy)])[0] == 401
    own = mine.sign(ns_a, "sb-private", world.uids["sb-private"], 60)
    status, _, body = _preview(world, f"sb-private.{DOMAIN}", headers=[("X-Shadow-Preview-Token", own)])
    assert status == 200 and _served_by(body) == "sb-private/preview", body
    theirs = KeyRing.from_secret_data(core.read_namespaced_secret(c.PREVIEW_LINK_KEYS_SECRET, ns_b).data)
    status, _, body = _preview(
        world,
        vault_host,
        headers=[("X-Shadow-Preview-Token", theirs.sign(ns_b, "vault", world.uids["vault"], 60))],
    )
    assert status == 200 and _served_by(body) == "vault/preview", body

    # The SDK signs with the namespace's own Secret by default, as the tenant; B's sandbox is out of its reach.
    custom = world.custom
    url = f"http://sb-private.{DOMAIN}/"
    custom.patch_namespaced_custom_object_status(
        "agents.x-k8s.io", "v1beta1", ns_a, "sandboxes", "sb-private", {"status": {"previewURL": url}}
    )
    _grant(
        rbac,
        ns_a,
        (ns_a, "tenant-a"),
        "tenant-a-sandboxes",
        {**read, "apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"]},
    )
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "tenant-a"))
    status, body = _open_link(world, preview_link("sb-private", ns_a, ttl_seconds=120))
    assert status == 200 and _served_by(body) == "sb-private/preview"
    with pytest.raises(ShadowError):
        preview_link("vault", ns_b)
    monkeypatch.setenv("KUBECONFIG", kubeconfig)

    # A tenant's edit of its Secret is undone on the operator's next pass.
    core.patch_namespaced_secret(
        c.PREVIEW_LINK_KEYS_SECRET, ns_a, {"data": {"k1": base64.b64encode(b"m" * 32).decode()}}
    )
    assert publish() == [ns_a]
    assert (
        KeyRing.from_secret_data(
            tenant.read_namespaced_secret(c.PREVIEW_LINK_KEYS_SECRET, ns_a).data
        ).secrets()
        == mine.secrets()
    )

    # Rotation: a newer root key reaches every namespace; links signed with it open once the router has it.
    newer = b"n" * 32
    core.patch_namespaced_secret(ROOT_KEYS, home, {"data": {"k2": base64.b64encode(newer).decode()}})
    assert publish() == [ns_a, ns_b]
    rotated = KeyRing.from_secret_data(tenant.read_namespaced_secret(c.PREVIEW_LINK_KEYS_SECRET, ns_a).data)
    assert rotated.signing_id == "k2" and set(rotated.secrets()) == {"k1", "k2"}
    (world.router.keys_dir / "k2").write_bytes(newer)
    fresh = rotated.sign(ns_a, "sb-private", world.uids["sb-private"], 60)
    wait_for(
        lambda: (
            _preview(world, f"sb-private.{DOMAIN}", headers=[("X-Shadow-Preview-Token", fresh)])[0] == 200
        ),
        timeout=30,
        what="the router to accept links signed with the rotated key",
    )


# -------------------------------------------------------------------------------------------- the SDK
def _sdk(
    world: World, box: str, port: int | str, extra: dict[str, str] | None = None, path: str = "/execute"
) -> httpx.Response:
    headers = {"X-Sandbox-ID": box, "X-Sandbox-Namespace": world.namespace, "X-Sandbox-Port": str(port)}
    headers.update(extra or {})
    return httpx.post(f"{world.router.sdk}{path}", headers=headers, json={"command": "true"}, timeout=10)


def test_sdk_healthz(world: World) -> None:
    response = httpx.get(f"{world.router.sdk}/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_sdk_request_gets_the_runtime_token_and_loses_the_callers_credentials(world: World) -> None:
    box = world.boxes["sb-a"]
    response = _sdk(
        world,
        "sb-a",
        box.runtime_port,
        {"Authorization": "Bearer callers-own-secret", "X-Sandbox-Runtime-Token": "forged"},
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["server"] == "sb-a/runtime" and answer["method"] == "POST" and answer["path"] == "/execute"
    seen = answer["headers"]
    assert seen["X-Sandbox-Runtime-Token"] == box.token
    assert "Authorization" not in seen
    assert seen["Host"] == f"{box.ip}:{box.runtime_port}"


def test_sdk_request_to_another_port_gets_no_runtime_token(world: World) -> None:
    box = world.boxes["sb-a"]
    response = _sdk(world, "sb-a", box.preview_port, {"X-Sandbox-Runtime-Token": "forged"})
    assert response.status_code == 200, response.text
    assert response.json()["server"] == "sb-a/preview"
    assert "X-Sandbox-Runtime-Token" not in response.json()["headers"]


@pytest.mark.parametrize(
    ("headers", "status", "detail"),
    [
        ({"X-Sandbox-ID": "Bad_Name"}, 400, "DNS-1123"),
        ({"X-Sandbox-ID": "sb-a.other-svc"}, 400, "DNS-1123"),
        ({"X-Sandbox-ID": "a" * 64}, 400, "DNS-1123"),
        ({"X-Sandbox-Namespace": "kube-system/x"}, 400, "DNS-1123"),
        ({"X-Sandbox-Port": "0"}, 400, "1 to 65535"),
        ({"X-Sandbox-Port": "65536"}, 400, "1 to 65535"),
        ({"X-Sandbox-Port": "88 88"}, 400, "1 to 65535"),
        ({"X-Sandbox-Pod-IP": "127.0.0.2"}, 400, "loopback"),
        ({"X-Sandbox-Pod-IP": "169.254.169.254"}, 400, "metadata"),
        ({"X-Sandbox-Pod-IP": "::1"}, 400, "loopback"),
        ({"X-Sandbox-Pod-IP": "0.0.0.0"}, 400, "loopback"),
        ({"X-Sandbox-Pod-IP": "224.0.0.1"}, 400, "multicast"),
        ({"X-Sandbox-Pod-IP": "10.1.2.3"}, 502, "not the sandbox's pod"),
        ({"X-Sandbox-UID": "00000000-0000-0000-0000-000000000000"}, 404, "not found"),
        ({"X-Sandbox-ID": "other-svc"}, 404, "not found"),
        ({"X-Sandbox-ID": "sb-orphan"}, 502, "not ready"),
        ({"X-Sandbox-ID": "sb-cold"}, 502, "not ready"),
        ({"X-Sandbox-ID": "elsewhere"}, 404, "not found"),
    ],
)
def test_sdk_headers_are_validated(world: World, headers: dict[str, str], status: int, detail: str) -> None:
    base = {
        "X-Sandbox-ID": "sb-a",
        "X-Sandbox-Namespace": world.namespace,
        "X-Sandbox-Port": str(world.boxes["sb-a"].runtime_port),
    }
    if headers.get("X-Sandbox-ID") == "elsewhere":
        base["X-Sandbox-Namespace"] = world.other_namespace
    if headers.get("X-Sandbox-ID") in world.boxes:  # a port its template declares
        base["X-Sandbox-Port"] = str(world.boxes[headers["X-Sandbox-ID"]].runtime_port)
    base.update(headers)
    response = httpx.post(f"{world.router.sdk}/execute", headers=base, json={}, timeout=10)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert detail in response.json()["detail"]


def test_sdk_repeated_routing_header_is_400(world: World) -> None:
    headers = [
        ("X-Sandbox-ID", "sb-a"),
        ("X-Sandbox-ID", "sb-b"),
        ("X-Sandbox-Namespace", world.namespace),
        ("X-Sandbox-Port", str(world.boxes["sb-a"].runtime_port)),
    ]
    status, _, body = raw_get(world.router.sdk_port, "/execute", headers, host="localhost")
    assert status == 400 and json.loads(body) == {"detail": "X-Sandbox-ID given more than once"}


def test_sdk_request_without_headers_is_400(world: World) -> None:
    response = httpx.get(f"{world.router.sdk}/list/.", timeout=10)
    assert response.status_code == 400 and response.json() == {"detail": "missing X-Sandbox-ID"}


def _sdk_headers(world: World, box: str, port: int, namespace: str | None = None) -> list[tuple[str, str]]:
    return [
        ("X-Sandbox-ID", box),
        ("X-Sandbox-Namespace", namespace or world.namespace),
        ("X-Sandbox-Port", str(port)),
    ]


def _sdk_call(
    router: Router, headers: list[tuple[str, str]], address: str, path: str = "/execute"
) -> tuple[int, dict[str, str], str]:
    return raw_get(router.sdk_port, path, headers, host="sandbox-router-svc", address=address)


def _service_account_token(core: client.CoreV1Api, namespace: str, name: str) -> str:
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    request = {"spec": {"expirationSeconds": 600}}
    return str(core.create_namespaced_service_account_token(name, namespace, request).status.token)


def _grant(
    rbac: client.RbacAuthorizationV1Api,
    namespace: str,
    subject: tuple[str, str],
    name: str,
    rule: dict[str, Any],
) -> None:
    """A Role with one rule in `namespace`, bound to the ServiceAccount `subject` (namespace, name)."""
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": [rule]})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "namespace": subject[0], "name": subject[1]}],
        },
    )


PROXY_RULE = {"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes/proxy"], "verbs": ["create"]}


@pytest.fixture(scope="module")
def outside() -> str:
    return outside_address()


def test_sdk_from_the_network_without_credentials_is_refused(world: World, outside: str) -> None:
    """A caller that is not a port-forward (its connection does not come from loopback) and sends no token
    reaches nothing: not even whether a sandbox exists. Headers claiming loopback change nothing (nginx sets
    the peer from the connection), and an answer nginx cached for a port-forward is not reused for it."""
    box = world.boxes["sb-a"]
    headers = _sdk_headers(world, "sb-a", box.runtime_port)
    status, _, body = _sdk_call(world.router, headers, "127.0.0.1")
    assert status == 200 and _served_by(body) == "sb-a/runtime", body  # a port-forward: cached 2 s by nginx
    spoofs = [
        [],
        [("X-Shadow-Peer", "127.0.0.1")],
        [("X-Forwarded-For", "127.0.0.1"), ("X-Real-IP", "127.0.0.1")],
        [("X-Shadow-Peer", "127.0.0.1"), ("X-Shadow-Peer", "::1")],
    ]
    for spoof in spoofs:
        status, response_headers, body = _sdk_call(world.router, [*headers, *spoof], outside)
        assert status == 401, (spoof, body)
        assert response_headers["content-type"].startswith("application/json")
        assert "bearer token is required" in json.loads(body)["detail"] and _served_by(body) is None
    for name, port in (("no-such-sandbox", 8888), ("sb-private", world.boxes["sb-private"].runtime_port)):
        status, _, body = _sdk_call(world.router, _sdk_headers(world, name, port), outside)
        assert status == 401, body


def test_sdk_bearer_token_needs_rbac_on_that_sandbox(
    world: World, k8s_api: client.ApiClient, outside: str
) -> None:
    """From the network, a ServiceAccount token of another namespace: unknown tokens 401; authenticated but
    without `create sandboxes/proxy` (even with `get sandboxes`) 403; with a RoleBinding to it for one sandbox,
    that sandbox only; the binding deleted, refused again within the router's short cache."""
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    ns, elsewhere = world.namespace, world.other_namespace
    nobody = _service_account_token(core, elsewhere, "sdk-nobody")
    reader = _service_account_token(core, elsewhere, "sdk-reader")
    runner = _service_account_token(core, elsewhere, "sdk-runner")
    read_rule = {"apiGroups": ["agents.x-k8s.io"], "resources": ["sandboxes"], "verbs": ["get", "list"]}
    _grant(rbac, ns, (elsewhere, "sdk-reader"), "sdk-reader", read_rule)
    _grant(rbac, ns, (elsewhere, "sdk-runner"), "sdk-runner", {**PROXY_RULE, "resourceNames": ["sb-b"]})
    box = world.boxes["sb-b"]
    headers = _sdk_headers(world, "sb-b", box.runtime_port)

    def call(token: str, sandbox: str = "sb-b") -> tuple[int, str]:
        target = _sdk_headers(world, sandbox, world.boxes[sandbox].runtime_port)
        status, _, body = _sdk_call(world.router, [*target, ("Authorization", f"Bearer {token}")], outside)
        return status, body

    for bad in ("not-a-real-token", f"{runner}x"):
        status, body = call(bad)
        assert status == 401 and "not accepted" in json.loads(body)["detail"], body
    status, _, body = _sdk_call(world.router, [*headers, ("Authorization", f"Basic {runner}")], outside)
    assert status == 401, body
    for token, who in ((nobody, "sdk-nobody"), (reader, "sdk-reader")):
        status, body = call(token)
        assert status == 403, body
        detail = json.loads(body)["detail"]
        assert f"system:serviceaccount:{elsewhere}:{who}" in detail and "sandboxes/proxy" in detail
    status, body = call(runner)
    assert status == 200 and _served_by(body) == "sb-b/runtime", body
    seen = json.loads(body)["headers"]
    # The caller's credential stops at the router; the sandbox gets its own runtime token instead.
    assert "Authorization" not in seen and seen["X-Sandbox-Runtime-Token"] == box.token
    assert call(runner, "sb-a")[0] == 403  # resourceNames: sb-b only

    rbac.delete_namespaced_role_binding("sdk-runner", ns)
    wait_for(lambda: call(runner)[0] == 403, timeout=30, what="the revoked binding to stop working")


def test_sdk_reaches_only_ports_the_template_declares(world: World) -> None:
    """A port the sandbox's pod really listens on, but that its template does not declare: refused."""
    box = world.boxes["sb-a"]
    undeclared = world.upstreams.start("sb-a/undeclared", box.ip)
    assert httpx.get(f"http://{box.ip}:{undeclared}/", timeout=5).json()["server"] == "sb-a/undeclared"
    for port in (undeclared, 22, 65535):
        status, headers, body = _sdk_call(world.router, _sdk_headers(world, "sb-a", port), "127.0.0.1")
        assert status == 403, body
        assert headers["content-type"].startswith("application/json") and _served_by(body) is None
        assert f"port {port} is not declared" in json.loads(body)["detail"]


def test_sdk_insecure_mode_keeps_private_sandboxes_private(
    world: World, k8s_api: client.ApiClient, kubeconfig: str, tmp_path: Path, outside: str
) -> None:
    """The explicit opt-out: anyone reaches public sandboxes; a private one still needs a port-forward or a
    token allowed on it."""
    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    token = _service_account_token(core, world.other_namespace, "sdk-private")
    rule = {**PROXY_RULE, "resourceNames": ["sb-private"]}
    _grant(rbac, world.namespace, (world.other_namespace, "sdk-private"), "sdk-private", rule)
    values = [
        "--set=previewRouter.enabled=true",
        f"--set=previewRouter.domain={DOMAIN}",
        f"--set=previewRouter.sandboxNamespaces={{{world.namespace}}}",
        "--set=previewRouter.sdk.authorizationMode=insecure-allow-all",
    ]
    public = _sdk_headers(world, "sb-a", world.boxes["sb-a"].runtime_port)
    private = _sdk_headers(world, "sb-private", world.boxes["sb-private"].runtime_port)
    with running_router(tmp_path, kubeconfig, values) as router:
        status, _, body = _sdk_call(router, public, outside)
        assert status == 200 and _served_by(body) == "sb-a/runtime", body
        status, _, body = _sdk_call(router, private, outside)
        assert status == 401 and _served_by(body) is None, body
        status, _, body = _sdk_call(router, [*private, ("Authorization", f"Bearer {token}")], outside)
        assert status == 200 and _served_by(body) == "sb-private/runtime", body
        status, _, body = _sdk_call(router, private, "127.0.0.1")
        assert status == 200 and _served_by(body) == "sb-private/runtime", body


def test_recreated_sandbox_refuses_links_to_its_predecessor(world: World, k8s_api: client.ApiClient) -> None:
    """Links are bound to the sandbox's uid: deleted and created again under the same name, it is another
    sandbox, and the old link opens nothing (the new one does)."""
    core, ns, name = client.CoreV1Api(k8s_api), world.namespace, "sb-reborn"
    ip = "127.0.0.41"
    port = world.upstreams.start(f"{name}/preview", ip)
    box = Box(name, ip, port, world.upstreams.start(f"{name}/runtime", ip), "t")
    apis = (world.custom, core)
    first = managed_sandbox(apis, ns, box, private=True)["metadata"]["uid"]
    old = world.keys.sign(ns, name, first, 600)

    def status_with(token: str) -> int:
        return _preview(world, f"{name}.{DOMAIN}", headers=[("X-Shadow-Preview-Token", token)])[0]

    wait_for(lambda: status_with(old) == 200, timeout=15, what="the first sb-reborn to be routed")
    world.custom.delete_namespaced_custom_object("agents.x-k8s.io", "v1beta1", ns, "sandboxes", name)
    # The garbage collector may delete the Sandbox's Pod and Secret first.
    for delete, what in (
        (lambda: core.delete_namespaced_pod(name, ns, grace_period_seconds=0), "pod"),
        (lambda: core.delete_namespaced_secret(naming.token_secret_name(name), ns), "secret"),
    ):
        try:
            delete()
        except ApiException as exc:
            if exc.status != 404:
                raise AssertionError(
                    f"deleting the first sb-reborn's {what}: {exc.status} {exc.reason}"
                ) from exc

    wait_for(
        lambda: absent(lambda: core.read_namespaced_pod(name, ns)),
        timeout=15,
        what="the first sb-reborn's pod to be gone",
    )
    second = managed_sandbox(apis, ns, box, private=True)["metadata"]["uid"]
    assert second != first
    new = world.keys.sign(ns, name, second, 600)
    wait_for(lambda: status_with(new) == 200, timeout=15, what="the second sb-reborn to be routed")
    # nginx may still hold the old link's allowed answer for authCacheSeconds (2 s here), no longer.
    wait_for(lambda: status_with(old) == 401, timeout=10, what="the old link to stop opening sb-reborn")
    status, _, _ = _preview(world, f"{name}.{DOMAIN}", f"/?shadow_token={old}")
    assert status == 401


# -------------------------------------------------------------------------------------------- metrics
def _requests(series: Series, route: str, ns: str, sandbox: str, code: str = "2xx") -> float:
    labels = {"route": route, "namespace": ns, "sandbox": sandbox, "code": code}
    return metric(series, "shadow_router_requests_total", **labels)


def _latency_count(series: Series, route: str, ns: str, sandbox: str) -> float:
    labels = {"route": route, "namespace": ns, "sandbox": sandbox}
    return metric(series, "shadow_router_upstream_latency_seconds_count", **labels)


def test_metrics_count_routed_requests_and_upstream_latency_per_sandbox(world: World) -> None:
    """From nginx's access log (syslog over UDP to router-auth): only routed requests count, each under the
    sandbox router-auth's decision named, with the sandbox's answer time in a histogram."""
    ns, router = world.namespace, world.router
    before = scrape(router)
    # Refused first (unknown host, a private preview without a token, an SDK call for a Service): UDP from
    # nginx to router-auth on loopback keeps their order, so they would be counted before the routed ones.
    for host in ("no-such-sandbox", "other-svc", "sb-private"):
        assert _preview(world, f"{host}.{DOMAIN}")[0] in (401, 404)
    assert _sdk(world, "other-svc", 8080).status_code == 404
    for _ in range(7):
        assert _preview(world, f"sb-a.{DOMAIN}", "/metered")[0] == 200
    for _ in range(3):
        assert _preview(world, f"SB-B.{DOMAIN}", "/metered")[0] == 200  # counted under its canonical name
    for _ in range(4):
        assert _sdk(world, "sb-a", world.boxes["sb-a"].runtime_port).status_code == 200

    def delta(route: str, sandbox: str) -> float:
        return _requests(scrape(router), route, ns, sandbox) - _requests(before, route, ns, sandbox)

    wait_for(
        lambda: (delta("preview", "sb-a"), delta("preview", "sb-b"), delta("sdk", "sb-a")) == (7, 3, 4),
        timeout=10,
        what="the routed requests to be counted",
    )
    after = scrape(router)
    assert _latency_count(after, "preview", ns, "sb-a") - _latency_count(before, "preview", ns, "sb-a") == 7
    assert _latency_count(after, "sdk", ns, "sb-a") - _latency_count(before, "sdk", ns, "sb-a") == 4
    buckets = {
        dict(labels)["le"]: value
        for (name, labels), value in after.items()
        if name == "shadow_router_upstream_latency_seconds_bucket"
        and dict(labels)["sandbox"] == "sb-b"
        and dict(labels)["route"] == "preview"
    }
    assert buckets["+Inf"] >= 3 and buckets["1.0"] >= 3  # loopback answers take well under a second
    # Refused requests count nowhere: no label for names that are no sandbox, nothing more for sb-private.
    sandboxes = {dict(labels).get("sandbox") for (_, labels) in after}
    assert not sandboxes & {"no-such-sandbox", "other-svc"}
    assert _requests(after, "preview", ns, "sb-private") == _requests(before, "preview", ns, "sb-private")
    assert metric(after, "shadow_router_log_lines_invalid_total") == 0


def test_metrics_sandbox_labels_are_bounded(
    world: World, k8s_api: client.ApiClient, kubeconfig: str, tmp_path: Path
) -> None:
    """With room for one sandbox label: the first sandbox has it, the next counts as `_other` until the first
    is deleted, then takes the freed label (and the deleted sandbox's series are gone)."""
    ns = world.namespace
    apis = (world.custom, client.CoreV1Api(k8s_api))
    boxes = []
    for number, name in enumerate(("sb-m1", "sb-m2"), start=30):
        ip = f"127.0.0.{number}"
        port = world.upstreams.start(f"{name}/preview", ip)
        boxes.append(Box(name, ip, port, port, "t"))
        managed_sandbox(apis, ns, boxes[-1])
    values = [
        "--set=previewRouter.enabled=true",
        f"--set=previewRouter.domain={DOMAIN}",
        f"--set=previewRouter.sandboxNamespaces={{{ns}}}",
        "--set=previewRouter.authCacheSeconds=1",
        "--set=previewRouter.metrics.maxSandboxes=1",
    ]
    with running_router(tmp_path, kubeconfig, values) as router:

        def get(name: str) -> int:
            return raw_get(router.preview_port, "/", [], host=f"{name}.{DOMAIN}")[0]

        def counts() -> tuple[float, float, float]:
            series = scrape(router)
            return (
                _requests(series, "preview", ns, "sb-m1"),
                _requests(series, "preview", ns, "sb-m2"),
                _requests(series, "preview", "_other", "_other"),
            )

        assert get("sb-m1") == 200
        wait_for(lambda: counts() == (1, 0, 0), timeout=10, what="sb-m1 to hold the one label")
        assert get("sb-m2") == 200 and get("sb-m2") == 200
        wait_for(lambda: counts() == (1, 0, 2), timeout=10, what="sb-m2 to count as _other")

        world.custom.delete_namespaced_custom_object("agents.x-k8s.io", "v1beta1", ns, "sandboxes", "sb-m1")
        wait_for(lambda: get("sb-m1") == 404, timeout=15, what="sb-m1 to be gone")
        assert get("sb-m2") == 200
        wait_for(lambda: counts() == (0, 1, 2), timeout=10, what="sb-m2 to take the freed label")
        series = scrape(router)
        assert not any(dict(labels).get("sandbox") == "sb-m1" for (_, labels) in series)
        assert {dict(labels).get("sandbox") for (_, labels) in series} - {None} == {"sb-m2", "_other"}
