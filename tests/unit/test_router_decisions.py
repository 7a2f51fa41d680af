"""router-auth's decisions over an index fed with bodies like the watches deliver: Host and SDK header rules."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from shadow_operator.clients.kube import ApiError
from shadow_operator.common.tokens import KeyRing
from shadow_operator.router import validation
from shadow_operator.router.decisions import (
    INSECURE_ALLOW_ALL,
    Decision,
    PreviewPolicy,
    SdkPolicy,
)
from shadow_operator.router.index import Index

pytestmark = pytest.mark.unit

NS = "team-a"
ROOT = KeyRing({"k1": b"s" * 32})  # the router's keys
KEYS = ROOT.for_namespace(NS)  # what team-a signs its links with
NOW = 1_800_000_000.0
LOOPBACK = "127.0.0.1"
NETWORK = "10.244.1.7"  # another pod


def sandbox(
    name: str, uid: str, *, ready: bool = True, access: str | None = None, namespace: str = NS
) -> dict[str, Any]:
    annotations = {"shadow.dev/preview-access": access} if access else {}
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
        "spec": {
            "podTemplate": {
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "ports": [
                                {"name": "runtime", "containerPort": 8888},
                                {"name": "preview", "containerPort": 3000},
                            ],
                        }
                    ]
                }
            }
        },
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pod(name: str, owner_uid: str | None, ip: str, namespace: str = NS) -> dict[str, Any]:
    refs = [{"uid": owner_uid, "controller": True}] if owner_uid else []
    return {
        "metadata": {"name": name, "namespace": namespace, "ownerReferences": refs},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


@pytest.fixture
def index() -> Index:
    index = Index(default_preview_port=3000)
    index.put("Sandbox", sandbox("web", "u-web"))
    index.put("Pod", pod("web", "u-web", "10.0.0.5"))
    index.put("Sandbox", sandbox("secret", "u-secret", access="private"))
    index.put("Pod", pod("secret", "u-secret", "10.0.0.6"))
    index.put("Sandbox", sandbox("cold", "u-cold", ready=False))
    index.put("Pod", pod("cold", "u-cold", "10.0.0.7"))
    index.put("Pod", pod("stray", None, "10.0.0.8"))
    return index


def preview(index: Index, **kwargs: Any) -> PreviewPolicy:
    settings: dict[str, Any] = {"namespaces": (NS,), "keys": lambda: ROOT, "clock": lambda: NOW, **kwargs}
    return PreviewPolicy(index=index, domain="p.example", **settings)


def test_public_preview_routes_to_the_owned_pod(index: Index) -> None:
    decision = preview(index).decide("web.p.example", "/")
    assert (decision.status, decision.upstream) == (200, "10.0.0.5:3000")


@pytest.mark.parametrize(
    ("host", "status"),
    [("stray.p.example", 404), ("cold.p.example", 503), ("web.q.example", 404), ("a.web.p.example", 404)],
)
def test_preview_refusals(index: Index, host: str, status: int) -> None:
    assert preview(index).decide(host, "/").status == status


def test_private_by_default_needs_a_token(index: Index) -> None:
    policy = preview(index, default_access="private")
    assert policy.decide("web.p.example", "/").status == 401
    token = KEYS.sign(NS, "web", "u-web", 60, now=NOW)
    assert policy.decide("web.p.example", "/", header_token=token).status == 200
    # A sandbox's own annotation wins over the default.
    index.put("Sandbox", sandbox("web", "u-web", access="public"))
    assert policy.decide("web.p.example", "/").status == 200


def test_template_annotation_sets_the_default_of_its_sandboxes(index: Index) -> None:
    body = sandbox("tpl", "u-tpl")
    body["metadata"]["annotations"] = {"agents.x-k8s.io/sandbox-template-ref": "locked"}
    index.put("Sandbox", body)
    index.put("Pod", pod("tpl", "u-tpl", "10.0.0.9"))
    index.put(
        "SandboxTemplate",
        {
            "metadata": {
                "name": "locked",
                "namespace": NS,
                "annotations": {"shadow.dev/preview-access": "private"},
            }
        },
    )
    assert preview(index).decide("tpl.p.example", "/").status == 401


def test_https_cookie_is_host_prefixed_and_secure(index: Index) -> None:
    token = KEYS.sign(NS, "secret", "u-secret", 60, now=NOW)
    decision = preview(index, secure=True).decide("secret.p.example", f"/?shadow_token={token}")
    assert decision.status == 302
    cookie = decision.headers["Set-Cookie"]
    assert cookie.startswith(f"__Host-shadow_preview={token};") and "; Secure" in cookie
    assert (
        preview(index, secure=True).decide("secret.p.example", "/", f"__Host-shadow_preview={token}").status
        == 200
    )


def test_preview_token_is_bound_to_the_sandbox_uid(index: Index) -> None:
    """A sandbox deleted and created again under its name is another sandbox: old links open nothing."""
    policy = preview(index)
    token = KEYS.sign(NS, "secret", "u-secret", 60, now=NOW)
    assert policy.decide("secret.p.example", "/", header_token=token).status == 200
    index.remove("Sandbox", NS, "secret")
    index.put("Sandbox", sandbox("secret", "u-secret-2", access="private"))
    index.put("Pod", pod("secret", "u-secret-2", "10.0.0.6"))
    assert policy.decide("secret.p.example", "/", header_token=token).status == 401
    assert policy.decide("secret.p.example", f"/?shadow_token={token}").status == 401
    fresh = KEYS.sign(NS, "secret", "u-secret-2", 60, now=NOW)
    assert policy.decide("secret.p.example", "/", header_token=fresh).status == 200


def test_preview_token_signed_to_live_longer_than_the_maximum_is_refused(index: Index) -> None:
    policy = preview(index, max_token_seconds=3600)
    within = KEYS.sign(NS, "secret", "u-secret", 3600, now=NOW)
    beyond = KEYS.sign(NS, "secret", "u-secret", 3601, now=NOW)
    assert policy.decide("secret.p.example", "/", header_token=within).status == 200
    assert policy.decide("secret.p.example", "/", header_token=beyond).status == 401
    assert policy.decide("secret.p.example", f"/?shadow_token={beyond}").status == 401


def test_a_namespace_signs_links_for_its_own_sandboxes_only(index: Index) -> None:
    """Issue 28 L3: team-a's keys (which team-a may read) open team-a's previews, never team-b's; nor do links
    signed with the router's root keys themselves (the format before per-namespace keys)."""
    index.put("Sandbox", sandbox("vault", "u-vault", access="private", namespace="team-b"))
    index.put("Pod", pod("vault", "u-vault", "10.0.1.5", namespace="team-b"))
    policy = preview(index, namespaces=(NS, "team-b"))
    forged = KEYS.sign("team-b", "vault", "u-vault", 60, now=NOW)
    assert policy.decide("vault.p.example", "/", header_token=forged).status == 401
    assert policy.decide("vault.p.example", f"/?shadow_token={forged}").status == 401
    own = ROOT.for_namespace("team-b").sign("team-b", "vault", "u-vault", 60, now=NOW)
    assert policy.decide("vault.p.example", "/", header_token=own).status == 200
    assert policy.decide("secret.p.example", "/", header_token=own).status == 401
    mine = KEYS.sign(NS, "secret", "u-secret", 60, now=NOW)
    assert policy.decide("secret.p.example", "/", header_token=mine).status == 200
    legacy = ROOT.sign("team-b", "vault", "u-vault", 60, now=NOW)
    assert policy.decide("vault.p.example", "/", header_token=legacy).status == 401


# ---------------------------------------------------------------------------------------------- the SDK path
class ApiServer:
    """Stands in for TokenReview + SubjectAccessReview (the real ones run in tests/integration/test_router.py):
    `grants` maps a token to the sandboxes (namespace, name) it may reach; any other token is unknown."""

    def __init__(self, grants: Mapping[str, set[tuple[str, str]]]) -> None:
        self.grants = grants
        self.asked: list[tuple[str, str, str]] = []

    async def __call__(self, authorization: str, namespace: str, name: str) -> Decision | None:
        self.asked.append((authorization, namespace, name))
        token = authorization.removeprefix("Bearer ")
        if token not in self.grants:
            return Decision(401, "the bearer token was not accepted by the API server")
        if (namespace, name) not in self.grants[token]:
            return Decision(403, f"may not create sandboxes/proxy of {namespace}/{name}")
        return None


class TokenSecrets:
    """Stands in for reading a token Secret by name (router/secrets.py; the real one in test_router.py):
    (namespace, sandbox, uid) -> token; what it was asked is kept."""

    def __init__(self, tokens: Mapping[tuple[str, str, str], str]) -> None:
        self.tokens = tokens
        self.asked: list[tuple[str, str, str]] = []

    async def __call__(self, namespace: str, sandbox: str, uid: str) -> str | None:
        self.asked.append((namespace, sandbox, uid))
        return self.tokens.get((namespace, sandbox, uid))


def sdk(index: Index, api: ApiServer | None = None, **kwargs: Any) -> SdkPolicy:
    settings: dict[str, Any] = {
        "runtime_tokens": TokenSecrets({(NS, "web", "u-web"): "runtime-token"}),
        **kwargs,
    }
    return SdkPolicy(index=index, namespaces=(NS,), authorize=api or ApiServer({}), **settings)


def decide(policy: SdkPolicy, headers: Mapping[str, str], peer: str = LOOPBACK) -> Decision:
    return asyncio.run(policy.decide(headers, peer))


WEB = {"X-Sandbox-ID": "web", "X-Sandbox-Namespace": NS, "X-Sandbox-Port": "8888"}


def test_sdk_routes_with_the_runtime_token_only_on_the_runtime_port(index: Index) -> None:
    policy = sdk(index)
    decision = decide(policy, WEB)
    assert (decision.status, decision.upstream, decision.runtime_token) == (
        200,
        "10.0.0.5:8888",
        "runtime-token",
    )
    assert decide(policy, {**WEB, "X-Sandbox-Port": "3000"}).runtime_token is None
    # A matching pod IP is used; a foreign one is never an upstream.
    assert decide(policy, {**WEB, "X-Sandbox-Pod-IP": "10.0.0.5"}).upstream == "10.0.0.5:8888"
    assert decide(policy, {**WEB, "X-Sandbox-Pod-IP": "10.0.0.8"}).status == 502
    assert decide(policy, {**WEB, "X-Sandbox-UID": "00000000-0000-0000-0000-000000000000"}).status == 404
    assert decide(policy, {**WEB, "X-Sandbox-Namespace": "team-b"}).status == 404


def test_sdk_reads_the_runtime_token_of_the_routed_sandbox_only_and_says_when_it_cannot(index: Index) -> None:
    """The token Secret is read by name for the sandbox (and uid) the request was routed to, on the runtime port
    only; a failed read is a 503 to retry, never a request sent on without its token."""
    tokens = TokenSecrets({(NS, "web", "u-web"): "runtime-token"})
    policy = sdk(index, runtime_tokens=tokens)
    decide(policy, {**WEB, "X-Sandbox-Port": "3000"})
    assert tokens.asked == []
    assert decide(policy, WEB).runtime_token == "runtime-token"
    assert tokens.asked == [(NS, "web", "u-web")]

    async def failing(namespace: str, sandbox: str, uid: str) -> str | None:
        raise ApiError(403, "Forbidden", "secrets is forbidden")

    refused = decide(sdk(index, runtime_tokens=failing), WEB)
    assert (refused.status, refused.upstream) == (503, None)


@pytest.mark.parametrize("port", ["22", "8080", "9090", "65535"])
def test_sdk_reaches_only_ports_the_pod_template_declares(index: Index, port: str) -> None:
    decision = decide(sdk(index), {**WEB, "X-Sandbox-Port": port})
    assert decision.status == 403 and decision.upstream is None
    assert f"port {port} is not declared" in decision.detail and "3000, 8888" in decision.detail


def test_sdk_loopback_peer_is_a_port_forward_and_needs_no_token(index: Index) -> None:
    api = ApiServer({})
    for peer in ("127.0.0.1", "127.0.0.5", "::1", "::ffff:127.0.0.1"):
        assert decide(sdk(index, api), WEB, peer).status == 200, peer
    assert api.asked == []


def test_sdk_caller_from_the_network_needs_a_token_the_api_server_allows(index: Index) -> None:
    api = ApiServer({"alice": {(NS, "web")}, "bob": {(NS, "secret")}})
    policy = sdk(index, api)
    anonymous = decide(policy, WEB, NETWORK)
    assert anonymous.status == 401 and "bearer token is required" in anonymous.detail
    assert decide(policy, {**WEB, "Authorization": "Bearer mallory"}, NETWORK).status == 401
    refused = decide(policy, {**WEB, "Authorization": "Bearer bob"}, NETWORK)
    assert refused.status == 403 and refused.upstream is None
    allowed = decide(policy, {**WEB, "Authorization": "Bearer alice"}, NETWORK)
    assert (allowed.status, allowed.upstream, allowed.runtime_token) == (
        200,
        "10.0.0.5:8888",
        "runtime-token",
    )
    assert api.asked[-1] == ("Bearer alice", NS, "web")


@pytest.mark.parametrize("peer", ["", "unix:", "10.0.0.1", "127.0.0.1, 10.0.0.1", "localhost", "fe80::1"])
def test_sdk_peer_that_is_not_one_loopback_address_is_not_trusted(index: Index, peer: str) -> None:
    assert decide(sdk(index), WEB, peer).status == 401


def test_sdk_loopback_trust_can_be_turned_off(index: Index) -> None:
    policy = sdk(index, ApiServer({"alice": {(NS, "web")}}), trust_loopback=False)
    assert decide(policy, WEB, LOOPBACK).status == 401
    assert decide(policy, {**WEB, "Authorization": "Bearer alice"}, LOOPBACK).status == 200


def test_sdk_refuses_unauthorized_callers_before_saying_whether_a_sandbox_exists(index: Index) -> None:
    policy = sdk(index)
    for name in ("web", "no-such-sandbox"):
        assert decide(policy, {**WEB, "X-Sandbox-ID": name}, NETWORK).status == 401
    assert decide(policy, {**WEB, "X-Sandbox-ID": "no-such-sandbox"}, LOOPBACK).status == 404


def test_sdk_insecure_mode_admits_anyone_to_public_sandboxes_only(index: Index) -> None:
    api = ApiServer({"alice": {(NS, "secret")}})
    policy = sdk(index, api, mode=INSECURE_ALLOW_ALL)
    assert decide(policy, WEB, NETWORK).status == 200
    private = {**WEB, "X-Sandbox-ID": "secret"}
    assert decide(policy, private, NETWORK).status == 401
    assert decide(policy, {**private, "Authorization": "Bearer alice"}, NETWORK).status == 200
    assert decide(policy, private, LOOPBACK).status == 200
    # Private by default: every sandbox without its own annotation needs authorization.
    assert decide(sdk(index, mode=INSECURE_ALLOW_ALL, default_access="private"), WEB, NETWORK).status == 401


@pytest.mark.parametrize(
    "value",
    [
        "127.0.0.1",
        "::1",
        "169.254.169.254",
        "fe80::1",
        "224.0.0.1",
        "0.0.0.0",
        "::",
        "fd00:ec2::254",
        "::ffff:127.0.0.1",
        "not-an-ip",
    ],
)
def test_pod_ip_header_refuses_special_addresses(value: str) -> None:
    with pytest.raises(validation.Invalid):
        validation.parse_pod_ip(value)


@pytest.mark.parametrize("value", ["0", "65536", "-1", "+80", " 80", "8e3", "\uff18\uff10", "123456"])
def test_port_header_must_be_a_plain_number_in_range(value: str) -> None:
    with pytest.raises(validation.Invalid):
        validation.parse_port(value)


@pytest.mark.parametrize(
    "host", ["web.p.example.", "WEB.p.example", "we%62.p.example", "p.example", "x" * 64 + ".p.example"]
)
def test_host_must_be_one_lowercase_label_before_the_domain(host: str) -> None:
    with pytest.raises(validation.Invalid):
        validation.sandbox_of_host(host, "p.example")
