"""router-auth's decisions over an index fed with bodies like the watches deliver: Host and SDK header rules."""

from __future__ import annotations

from typing import Any

import pytest
from shadow_operator.api import naming
from shadow_operator.router import validation
from shadow_operator.router.decisions import PreviewPolicy, SdkPolicy
from shadow_operator.router.index import Index
from shadow_operator.router.tokens import KeyRing

pytestmark = pytest.mark.unit

NS = "team-a"
KEYS = KeyRing({"k1": b"s" * 32})
NOW = 1_800_000_000.0


def sandbox(name: str, uid: str, *, ready: bool = True, access: str | None = None) -> dict[str, Any]:
    annotations = {"shadow.dev/preview-access": access} if access else {}
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid, "annotations": annotations},
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


def pod(name: str, owner_uid: str | None, ip: str) -> dict[str, Any]:
    refs = [{"uid": owner_uid, "controller": True}] if owner_uid else []
    return {
        "metadata": {"name": name, "namespace": NS, "ownerReferences": refs},
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
    index.put(
        "Secret",
        {
            "metadata": {
                "name": naming.token_secret_name("web"),
                "namespace": NS,
                "labels": {"app.kubernetes.io/managed-by": "shadow-operator"},
            },
            "data": {"token": "cnVudGltZS10b2tlbg=="},
        },
    )
    return index


def preview(index: Index, **kwargs: Any) -> PreviewPolicy:
    return PreviewPolicy(
        index=index, domain="p.example", namespaces=(NS,), keys=lambda: KEYS, clock=lambda: NOW, **kwargs
    )


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
    token = KEYS.sign(NS, "web", 60, now=NOW)
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
    token = KEYS.sign(NS, "secret", 60, now=NOW)
    decision = preview(index, secure=True).decide("secret.p.example", f"/?shadow_token={token}")
    assert decision.status == 302
    cookie = decision.headers["Set-Cookie"]
    assert cookie.startswith(f"__Host-shadow_preview={token};") and "; Secure" in cookie
    assert (
        preview(index, secure=True).decide("secret.p.example", "/", f"__Host-shadow_preview={token}").status
        == 200
    )


def test_sdk_routes_with_the_runtime_token_only_on_the_runtime_port(index: Index) -> None:
    sdk = SdkPolicy(index=index, namespaces=(NS,))
    headers = {"X-Sandbox-ID": "web", "X-Sandbox-Namespace": NS, "X-Sandbox-Port": "8888"}
    decision = sdk.decide(headers)
    assert (decision.status, decision.upstream, decision.runtime_token) == (
        200,
        "10.0.0.5:8888",
        "runtime-token",
    )
    assert sdk.decide({**headers, "X-Sandbox-Port": "3000"}).runtime_token is None
    # A matching pod IP is used; a foreign one is never an upstream.
    assert sdk.decide({**headers, "X-Sandbox-Pod-IP": "10.0.0.5"}).upstream == "10.0.0.5:8888"
    assert sdk.decide({**headers, "X-Sandbox-Pod-IP": "10.0.0.8"}).status == 502
    assert sdk.decide({**headers, "X-Sandbox-UID": "00000000-0000-0000-0000-000000000000"}).status == 404
    assert sdk.decide({**headers, "X-Sandbox-Namespace": "team-b"}).status == 404


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
