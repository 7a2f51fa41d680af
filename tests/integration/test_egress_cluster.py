"""The egress gateway following a real API server: templates, claims, sandbox Pods and credential Secrets become
its table, and a change reaches it within 2 s."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.common.egress import proxy_token

from tests.support.controlplane import wait_for
from tests.support.egress import Gateway, Upstream, start_gateway, start_upstream
from tests.support.pki import CertificateAuthority
from tests.support.sandbox_operator import CLAIM, TEMPLATE, Objects, install_crds

pytestmark = pytest.mark.integration

SECRET = "sk-cluster-secret-value"


@pytest.fixture(scope="module", autouse=True)
def crds(k8s_api: client.ApiClient) -> None:
    install_crds(k8s_api)


@pytest.fixture(scope="module")
def upstreams(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[CertificateAuthority, dict[str, Upstream]]]:
    directory = tmp_path_factory.mktemp("upstreams")
    ca = CertificateAuthority(directory, "upstream-test-ca")
    ups = {name: start_upstream(ca, name) for name in ("pypi.test", "model.test")}
    yield ca, ups
    for upstream in ups.values():
        assert upstream.server is not None
        upstream.server.shutdown()


@pytest.fixture
def gateway(
    tmp_path: Path,
    kubeconfig: str,
    namespace: str,
    upstreams: tuple[CertificateAuthority, dict[str, Upstream]],
) -> Iterator[Gateway]:
    ca, ups = upstreams
    resolve = {name: "127.0.0.1" for name in ups}
    yield from start_gateway(tmp_path, ca.pair.cert, resolve, None, key_secret=f"{namespace}/egress-key")


def curl(gateway: Gateway, token: str, trust: Path, url: str, method: str = "GET") -> str:
    """ "status CONNECT-status" of a request through the gateway."""
    return subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-X", method, "--proxy", gateway.proxy(token), "--cacert", str(trust),
         "-w", "%{http_code} %{http_connect}", url],
        capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip


def test_the_gateway_applies_the_template_narrowed_by_the_claim_and_follows_changes(
    k8s_api: client.ApiClient,
    namespace: str,
    gateway: Gateway,
    upstreams: tuple[CertificateAuthority, dict[str, Upstream]],
    tmp_path: Path,
) -> None:
    ca, ups = upstreams
    objs, core = Objects(k8s_api, namespace), client.CoreV1Api(k8s_api)
    pypi, model = ups["pypi.test"].port, ups["model.test"].port
    rules: list[dict[str, Any]] = [
        {"host": "pypi.test", "ports": [pypi], "methods": ["GET"], "paths": ["/simple/"]},
        {
            "host": "model.test",
            "ports": [model],
            "credential": {
                "secretName": "model-key",
                "key": "token",
                "header": "Authorization",
                "prefix": "Bearer ",
            },
        },
    ]
    objs.create(
        TEMPLATE,
        {
            "metadata": {"name": "tpl"},
            "spec": {
                "podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
                "egress": {"rules": rules},
            },
        },
    )
    narrow = {"host": "pypi.test", "ports": [pypi], "methods": ["GET"], "paths": ["/simple/numpy/"]}
    claim = objs.create(
        CLAIM,
        {
            "metadata": {"name": "sb"},
            "spec": {
                "warmPoolRef": {"name": "p"},
                "egress": {"rules": [narrow, {"host": "model.test", "ports": [model]}]},
            },
        },
    )
    core.create_namespaced_secret(
        namespace,
        {
            "metadata": {"name": "model-key", "labels": {"shadow.dev/egress-credential": "true"}},
            "stringData": {"token": SECRET},
        },
    )
    labels = {c.LABEL_TEMPLATE_REF_HASH: naming.name_hash("tpl"), c.LABEL_CLAIM_UID: claim["metadata"]["uid"]}
    # A node that does not exist: no kubelet (nor kwok) rewrites the Pod's status, so its address is ours to say.
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "sb", "labels": labels},
            "spec": {"nodeName": "no-such-node", "containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    core.patch_namespaced_pod_status(
        "sb", namespace, {"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
    )

    wait_for(lambda: gateway_ca(gateway, namespace), timeout=10, what="the gateway to learn the sandbox")
    trust = tmp_path / "trust.pem"
    trust.write_text(gateway.ca_pem(namespace) + ca.pair.cert.read_text())
    # The gateway made the key (the operator reads the same Secret).
    key = base64.b64decode(core.read_namespaced_secret("egress-key", namespace).data["key"])
    assert len(key) >= 48
    token = proxy_token(key, namespace, "sb")
    # The namespace's CA certificate, published for its workspaces to mount; its key stays in the gateway.
    published = wait_for(
        lambda: core.read_namespaced_config_map("shadow-egress-ca", namespace).data,
        timeout=5,
        what="the CA ConfigMap",
    )
    assert published["ca.crt"] == gateway.ca_pem(namespace)
    assert (
        published["bundle.crt"].endswith(published["ca.crt"])
        and published["bundle.crt"].count("BEGIN CERTIFICATE") > 10
    )
    assert "PRIVATE KEY" not in published["ca.crt"] + published["bundle.crt"]
    assert curl(gateway, token, trust, f"https://pypi.test:{pypi}/simple/numpy/") == "200 200"
    # The claim narrowed /simple/ to /simple/numpy/.
    assert curl(gateway, token, trust, f"https://pypi.test:{pypi}/simple/flask/") == "403 200"
    # The template's credential applies to the claim's narrower rule.
    assert curl(gateway, token, trust, f"https://model.test:{model}/v1/chat", "POST") == "200 200"
    assert ups["model.test"].received[-1]["headers"]["Authorization"] == f"Bearer {SECRET}"
    # Another sandbox's credential, or none, names nothing.
    assert (
        curl(gateway, proxy_token(key, namespace, "other"), trust, f"https://pypi.test:{pypi}/simple/numpy/")
        == "000 407"
    )

    # The decision log opens with the sandbox's runtime token (who may use the sandbox may read it), no other.
    log_url = f"{gateway.admin}/v1/log/{namespace}/sb"
    assert httpx.get(log_url, headers={"Authorization": "Bearer guess"}).status_code == 403
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "sb-runtime-token"}, "stringData": {"token": "rt-123"}}
    )
    log = httpx.get(log_url, headers={"Authorization": "Bearer rt-123"}).json()
    refused = [d for d in log["decisions"] if not d["allowed"]]
    assert (
        refused[0]["path"] == "/simple/flask/"
        and "add a path prefix covering /simple/flask/ to" in refused[0]["reason"]
    )
    objs.patch(CLAIM, "sb", {"spec": {"egress": {"rules": [{**narrow, "paths": ["/simple/"]}]}}})
    wait_for(
        lambda: curl(gateway, token, trust, f"https://pypi.test:{pypi}/simple/flask/") == "200 200",
        timeout=2,
        what="the claim's change",
    )
    series = f'namespace="{namespace}",rule_host="pypi.test",sandbox="sb"'
    assert series in httpx.get(f"{gateway.admin}/metrics").text
    core.delete_namespaced_pod("sb", namespace, grace_period_seconds=0)
    wait_for(
        lambda: curl(gateway, token, trust, f"https://pypi.test:{pypi}/simple/numpy/") == "000 407",
        timeout=2,
        what="the Pod's deletion",
    )

    # A sandbox gone takes its series and its log along: disposable sandboxes must not grow the gateway.
    wait_for(
        lambda: series not in httpx.get(f"{gateway.admin}/metrics").text, timeout=2, what="the series to go"
    )


def gateway_ca(gateway: Gateway, namespace: str) -> bool:
    return httpx.get(f"{gateway.admin}/v1/ca/{namespace}").status_code == 200
