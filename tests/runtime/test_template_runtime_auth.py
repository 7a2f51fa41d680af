"""Templates that serve clients without the runtime token (Amicable's backend reaches the runtime by the claim's
Service and sends none): `shadow.dev/runtime-auth: none` on the SandboxTemplate, honoured only when the template's
managed NetworkPolicy admits named peers alone.

The Pod the operator builds for a claim (the real blueprint and pod builders) is turned into a real runtime
process with that container's environment and token file, then asked what Amicable asks: without the
annotation it refuses with 401 (today's behaviour), with it every Amicable request works.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.resources import blueprint, runtime_auth
from shadow_operator.resources import sandbox as res

from tests.runtime.conftest import Server, start_server

pytestmark = pytest.mark.unit

# Amicable's backend namespace: the only peer its template lets in.
AMICABLE_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "amicable"}}}


def amicable_template(*, annotation: str | None, ingress: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Amicable's v1alpha1 template shape (runtime 8888 named runtime, preview 3000, tcp readiness)."""
    spec: dict[str, Any] = {
        "podTemplate": {
            "spec": {
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "runtime",
                        "image": "ghcr.io/shadow-operator/workspace:0.1.0",
                        "ports": [
                            {"name": "runtime", "containerPort": 8888},
                            {"name": "preview", "containerPort": 3000},
                        ],
                        "readinessProbe": {"tcpSocket": {"port": 8888}},
                    }
                ],
            }
        },
        "networkPolicyManagement": "Managed",
    }
    if ingress is not None:
        spec["networkPolicy"] = {"ingress": ingress, "egress": []}
    meta: dict[str, Any] = {"name": "amicable-sandbox", "namespace": "amicable", "uid": "t-uid"}
    if annotation is not None:
        meta["annotations"] = {c.ANNOTATION_RUNTIME_AUTH: annotation}
    return {"apiVersion": "extensions.agents.x-k8s.io/v1alpha1", "kind": "SandboxTemplate", "metadata": meta, "spec": spec}  # fmt: skip


def claimed_sandbox(template: dict[str, Any]) -> dict[str, Any]:
    """The Sandbox the operator makes for Amicable's claim (`amicable-<sha8>`, v1alpha1, template ref only)."""
    claim = {
        "apiVersion": "extensions.agents.x-k8s.io/v1alpha1",
        "kind": "SandboxClaim",
        "metadata": {"name": "amicable-1a2b3c4d", "namespace": "amicable", "uid": "claim-uid"},
        "spec": {"sandboxTemplateRef": {"name": template["metadata"]["name"]}},
    }
    sandbox = blueprint.build_claimed_sandbox(claim, template)
    sandbox["metadata"]["uid"] = "sandbox-uid"
    return sandbox


def claimed_pod(template: dict[str, Any]) -> dict[str, Any]:
    sandbox = claimed_sandbox(template)
    required, _ = runtime_auth.token_required(sandbox, template)
    token_secret = naming.token_secret_name(sandbox["metadata"]["name"]) if required else None
    return res.build_pod(sandbox, token_secret=token_secret)


def run_pod(pod: dict[str, Any], root: Path, secrets: Path) -> Server:
    """The runtime with the Pod's runtime container environment; its token file where the Pod mounts it."""
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container.get("env") or ()}
    if c.RUNTIME_TOKEN_ENV in env:
        secrets.mkdir()
        (secrets / c.RUNTIME_TOKEN_KEY).write_text("the-token")
        env[c.RUNTIME_TOKEN_ENV] = str(secrets / c.RUNTIME_TOKEN_KEY)
    return start_server(root, env=env)


def amicable_requests(server: Server) -> list[int]:
    """Amicable's calls, as its backend sends them (no credentials): status codes."""
    client = server.client()
    content = base64.b64encode(b"export default 1\n").decode()
    return [
        client.get("/healthz").status_code,
        client.post("/write_b64", json={"path": "src/App.tsx", "content_b64": content}).status_code,
        client.get("/list", params={"dir": "src"}).status_code,
        client.get("/download/src/App.tsx").status_code,
        client.post("/execute", json={"command": "sh -c 'cat src/App.tsx'"}).status_code,
        client.post("/exec", json={"command": "sh -c 'true'"}).status_code,
    ]


def test_by_default_amicable_is_refused(tmp_path: Path) -> None:
    pod = claimed_pod(amicable_template(annotation=None, ingress=[{"from": [AMICABLE_PEER]}]))
    server = run_pod(pod, tmp_path / "root", tmp_path / "secrets")
    try:
        codes = amicable_requests(server)
        assert codes[0] == 200  # the health check stays open (kubelet probes)
        assert set(codes[1:]) == {401}
    finally:
        server.stop()


def test_a_template_serving_without_token_answers_amicables_requests(tmp_path: Path) -> None:
    pod = claimed_pod(amicable_template(annotation="none", ingress=[{"from": [AMICABLE_PEER]}]))
    container = pod["spec"]["containers"][0]
    assert c.RUNTIME_TOKEN_ENV not in {e["name"] for e in container.get("env") or ()}
    assert c.RUNTIME_TOKEN_VOLUME not in {v["name"] for v in pod["spec"].get("volumes") or ()}
    root = tmp_path / "root"
    root.mkdir()
    server = run_pod(pod, root, tmp_path / "secrets")
    try:
        assert amicable_requests(server) == [200] * 6
        listed = server.client().get("/list", params={"dir": "src"}).json()
        assert listed == {"files": ["src/App.tsx"]}
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("ingress", "management", "why"),
    [
        ([{"from": [AMICABLE_PEER]}], "Unmanaged", "networkPolicyManagement is Unmanaged"),
        ([{}], "Managed", "networkPolicy.ingress[0] has no `from`"),
        ([{"from": [{"namespaceSelector": {}}]}], "Managed", "admits every pod of every namespace"),
        ([{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}], "Managed", "admits every address (0.0.0.0/0)"),
    ],
)
def test_none_is_not_honoured_unless_the_network_policy_names_the_peers(
    ingress: list[dict[str, Any]], management: str, why: str
) -> None:
    template = amicable_template(annotation="none", ingress=ingress)
    template["spec"]["networkPolicyManagement"] = management
    pod = claimed_pod(template)
    env = {e["name"] for e in pod["spec"]["containers"][0].get("env") or ()}
    assert c.RUNTIME_TOKEN_ENV in env
    _, kept_because = runtime_auth.token_required(claimed_sandbox(template), template)
    assert kept_because is not None and why in kept_because


def test_the_default_network_policy_counts_as_named_peers_and_other_values_keep_the_token() -> None:
    default = amicable_template(annotation="none", ingress=None)
    assert runtime_auth.token_required(claimed_sandbox(default), default) == (False, None)
    odd = amicable_template(annotation="off", ingress=None)
    required, why = runtime_auth.token_required(claimed_sandbox(odd), odd)
    assert required and why is not None and "neither none nor token" in why
    # A Sandbox whose pod the template's NetworkPolicy would not select (a hand-made Sandbox naming the template).
    stray = claimed_sandbox(default)
    stray["metadata"]["labels"].pop(c.LABEL_TEMPLATE_REF_HASH)
    required, why = runtime_auth.token_required(stray, default)
    assert required and why is not None and "would not be selected" in why
