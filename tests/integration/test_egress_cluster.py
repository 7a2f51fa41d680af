"""The egress gateway following a real API server: templates, claims, sandbox Pods and credential Secrets become
its table, and a change reaches it within 2 s."""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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
def platform(k8s_api: client.ApiClient) -> Iterator[str]:
    """The gateway's own namespace (its key and the namespaces' CAs are kept there), apart from the tenant's."""
    core = client.CoreV1Api(k8s_api)
    name = f"t-egress-platform-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name, propagation_policy="Background")


def gateway_process(
    directory: Path, platform: str, upstreams: tuple[CertificateAuthority, dict[str, Upstream]]
) -> Iterator[Gateway]:
    """A gateway following the cluster, with `directory` its own (a Pod's emptyDir)."""
    ca, ups = upstreams
    directory.mkdir(parents=True, exist_ok=True)
    resolve = {name: "127.0.0.1" for name in ups}
    return start_gateway(directory, ca.pair.cert, resolve, None, key_secret=f"{platform}/egress-key")


@pytest.fixture
def gateway(
    tmp_path: Path,
    kubeconfig: str,
    platform: str,
    upstreams: tuple[CertificateAuthority, dict[str, Upstream]],
) -> Iterator[Gateway]:
    yield from gateway_process(tmp_path / "gateway", platform, upstreams)


def sandbox_pod(core: client.CoreV1Api, namespace: str, name: str, labels: dict[str, str]) -> None:
    """A sandbox's Pod on a node that does not exist: no kubelet (nor kwok) rewrites its status, so its address
    is ours to say (loopback, where the test's clients are)."""
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": "no-such-node", "containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    core.patch_namespaced_pod_status(
        name, namespace, {"status": {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
    )


def proxy_key(core: client.CoreV1Api, platform: str) -> bytes:
    return base64.b64decode(core.read_namespaced_secret("egress-key", platform).data["key"])


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
    platform: str,
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
    sandbox_pod(core, namespace, "sb", labels)

    wait_for(lambda: gateway_ca(gateway, namespace), timeout=10, what="the gateway to learn the sandbox")
    trust = tmp_path / "trust.pem"
    trust.write_text(gateway.ca_pem(namespace) + ca.pair.cert.read_text())
    # The gateway made the key in its own namespace (the operator reads the same Secret).
    key = proxy_key(core, platform)
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


@dataclass
class TlsSandbox:
    """Sandbox `sb` of a tenant namespace under a template whose one rule terminates TLS (a method and a path),
    and what its workspace would use: a URL the rule allows, its proxy token, a trust bundle."""

    core: client.CoreV1Api
    namespace: str
    platform: str
    upstream_ca: Path
    url: str

    def token(self) -> str:
        return proxy_token(proxy_key(self.core, self.platform), self.namespace, "sb")

    def trust(self, path: Path, ca_pem: str) -> Path:
        """A bundle as the workspace's: the namespace's egress CA (`ca_pem`) and the upstreams' CA."""
        path.write_text(ca_pem + self.upstream_ca.read_text())
        return path


@pytest.fixture
def tls_sandbox(
    k8s_api: client.ApiClient,
    namespace: str,
    platform: str,
    upstreams: tuple[CertificateAuthority, dict[str, Upstream]],
) -> TlsSandbox:
    ca, ups = upstreams
    pypi = ups["pypi.test"].port
    rule = {"host": "pypi.test", "ports": [pypi], "methods": ["GET"], "paths": ["/simple/"]}
    Objects(k8s_api, namespace).create(
        TEMPLATE,
        {
            "metadata": {"name": "tpl"},
            "spec": {
                "podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
                "egress": {"rules": [rule]},
            },
        },
    )
    core = client.CoreV1Api(k8s_api)
    sandbox_pod(core, namespace, "sb", {c.LABEL_TEMPLATE_REF_HASH: naming.name_hash("tpl")})
    return TlsSandbox(core, namespace, platform, ca.pair.cert, f"https://pypi.test:{pypi}/simple/numpy/")


def private_keys(core: client.CoreV1Api, namespace: str) -> list[str]:
    """Every private key in the namespace's Secrets and ConfigMaps."""
    values = [
        base64.b64decode(v).decode()
        for secret in core.list_namespaced_secret(namespace).items
        for v in (secret.data or {}).values()
    ] + [v for cm in core.list_namespaced_config_map(namespace).items for v in (cm.data or {}).values()]
    return [v for v in values if "PRIVATE KEY" in v]


def test_a_restarted_gateway_keeps_the_namespace_ca_which_stays_in_the_gateways_namespace(
    tls_sandbox: TlsSandbox, upstreams: tuple[CertificateAuthority, dict[str, Upstream]], tmp_path: Path
) -> None:
    sb, core = tls_sandbox, tls_sandbox.core
    first = gateway_process(tmp_path / "first", sb.platform, upstreams)
    gateway = next(first)
    wait_for(lambda: gateway_ca(gateway, sb.namespace), timeout=10, what="the gateway to learn the sandbox")
    # What a workspace trusts: the certificate it mounted before the restart.
    trusted = gateway.ca_pem(sb.namespace)
    trust, token = sb.trust(tmp_path / "trust.pem", trusted), sb.token()
    assert curl(gateway, token, trust, sb.url) == "200 200"
    next(first, None)

    # A new Pod: its own empty directory, the same CA from the cluster.
    second = gateway_process(tmp_path / "second", sb.platform, upstreams)
    gateway = next(second)
    try:
        wait_for(
            lambda: curl(gateway, token, trust, sb.url) == "200 200",
            timeout=10,
            what="the restarted gateway to serve the sandbox under the CA the workspace trusts",
        )
        assert gateway.ca_pem(sb.namespace) == trusted
    finally:
        next(second, None)
    kept = core.read_namespaced_secret(f"shadow-egress-ca-{sb.namespace}", sb.platform)
    assert kept.type == "kubernetes.io/tls"
    assert base64.b64decode(kept.data["tls.crt"]).decode() == trusted
    # The tenant's namespace holds the certificate (its ConfigMap), never a key.
    assert core.read_namespaced_config_map("shadow-egress-ca", sb.namespace).data["ca.crt"] == trusted
    assert private_keys(core, sb.namespace) == []


def test_two_gateways_starting_together_end_with_one_ca(
    tls_sandbox: TlsSandbox, upstreams: tuple[CertificateAuthority, dict[str, Upstream]], tmp_path: Path
) -> None:
    """Replicas: both learn the namespace at once and race to make its CA; the API server keeps one."""
    sb = tls_sandbox
    processes = [gateway_process(tmp_path / name, sb.platform, upstreams) for name in ("a", "b")]
    with ThreadPoolExecutor(2) as pool:
        gateways = list(pool.map(next, processes))
    try:
        wait_for(
            lambda: all(gateway_ca(gateway, sb.namespace) for gateway in gateways),
            timeout=10,
            what="both gateways to learn the sandbox",
        )
        assert gateways[0].ca_pem(sb.namespace) == gateways[1].ca_pem(sb.namespace)
        trust, token = sb.trust(tmp_path / "trust.pem", gateways[0].ca_pem(sb.namespace)), sb.token()
        for gateway in gateways:
            assert curl(gateway, token, trust, sb.url) == "200 200"
    finally:
        for process in processes:
            next(process, None)


def test_a_ca_a_tenant_plants_in_its_namespace_never_becomes_the_ca(
    tls_sandbox: TlsSandbox, upstreams: tuple[CertificateAuthority, dict[str, Upstream]], tmp_path: Path
) -> None:
    sb, core = tls_sandbox, tls_sandbox.core
    planted = CertificateAuthority(tmp_path, "planted-by-the-tenant")
    planted_pem = planted.pair.cert.read_text()
    # Where a careless gateway could look: a Secret named like the gateway's, and the CA ConfigMap itself.
    core.create_namespaced_secret(
        sb.namespace,
        {
            "metadata": {
                "name": f"shadow-egress-ca-{sb.namespace}",
                "labels": {"shadow.dev/egress-ca-for": sb.namespace},
            },
            "type": "kubernetes.io/tls",
            "stringData": {"tls.key": planted.pair.key.read_text(), "tls.crt": planted_pem},
        },
    )
    core.create_namespaced_config_map(
        sb.namespace,
        {
            "metadata": {"name": "shadow-egress-ca"},
            "data": {"ca.crt": planted_pem, "bundle.crt": planted_pem},
        },
    )
    process = gateway_process(tmp_path / "gateway", sb.platform, upstreams)
    gateway = next(process)
    try:
        wait_for(
            lambda: gateway_ca(gateway, sb.namespace), timeout=10, what="the gateway to learn the sandbox"
        )
        real = gateway.ca_pem(sb.namespace)
        assert real != planted_pem
        wait_for(
            lambda: core.read_namespaced_config_map("shadow-egress-ca", sb.namespace).data["ca.crt"] == real,
            timeout=5,
            what="the gateway's certificate to replace the planted one",
        )
        # The certificates the workspace is shown come from the gateway's CA, not the planted one.
        token = sb.token()
        assert curl(gateway, token, sb.trust(tmp_path / "planted.pem", planted_pem), sb.url) == "000 200"
        assert curl(gateway, token, sb.trust(tmp_path / "trust.pem", real), sb.url) == "200 200"
    finally:
        next(process, None)
