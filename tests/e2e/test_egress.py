"""Egress allowlists on kind (issue 29), with real packets: a sandbox of a template with spec.egress reaches
in-cluster stand-ins for a package index (HTTPS, a host-only rule: a tunnel) and a model API (a method/path
rule with a credential) through the egress gateway, and nothing else, whatever it tries."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from shadow_operator.sdk import Sandbox, SandboxClient

from tests.e2e.cluster import Cluster, eventually
from tests.support.pki import CertificateAuthority
from tests.support.shadowctl import run

pytestmark = pytest.mark.e2e

SECRET = f"sk-e2e-{uuid.uuid4().hex}"
# The stand-ins: HTTPS on 8443 (the index) and HTTP on 8080 (the model API), answering with the request's
# method and path and the SHA-256 of its Authorization header (never the header: the answer reaches the
# workspace).
SERVER = """
import hashlib, http.server, ssl, threading
class H(http.server.BaseHTTPRequestHandler):
    def answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        auth = hashlib.sha256((self.headers.get("Authorization") or "").encode()).hexdigest()
        body = f"{self.command} {self.path} {auth}\\n".encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = answer
plain = http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H)
threading.Thread(target=plain.serve_forever, daemon=True).start()
tls = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), H)
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain("/certs/tls.crt", "/certs/tls.key")
tls.socket = context.wrap_socket(tls.socket, server_side=True)
tls.serve_forever()
"""
# Prints "open" or why the connection failed; UDP: "answered" or why not.
PROBE = """
import socket, sys
kind, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    if kind == "tcp":
        socket.create_connection((host, port), timeout=4).close(); print("open")
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(4)
        s.sendto(b"\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x07example\\x03com\\x00\\x00\\x01\\x00\\x01", (host, port))
        s.recv(512); print("answered")
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.fixture(scope="module")
def upstreams(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    ns = f"e2e-egress-up-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    index, model = f"index.{ns}.svc.cluster.local", f"model.{ns}.svc.cluster.local"
    directory = tmp_path_factory.mktemp("egress-ca")
    ca = CertificateAuthority(directory, "e2e-egress-upstream-ca")
    pair = ca.issue("index", index, dns_names=(index,), server=True)
    cluster.core.create_namespaced_secret(ns, client.V1Secret(
        metadata=client.V1ObjectMeta(name="certs"), type="kubernetes.io/tls",
        string_data={"tls.crt": pair.cert.read_text(), "tls.key": pair.key.read_text()},
    ))  # fmt: skip
    template = cluster.get("sandbox-platform", "sandboxtemplates", "workspace") or {}
    image = template["spec"]["podTemplate"]["spec"]["containers"][0]["image"]
    labels = {"app": "upstream"}
    cluster.core.create_namespaced_pod(ns, client.V1Pod(
        metadata=client.V1ObjectMeta(name="upstream", labels=labels),
        spec=client.V1PodSpec(
            containers=[client.V1Container(
                name="server", image=image, command=["python3", "-c", SERVER],
                volume_mounts=[client.V1VolumeMount(name="certs", mount_path="/certs", read_only=True)],
                resources=client.V1ResourceRequirements(requests={"cpu": "10m", "memory": "32Mi"}),
            )],
            volumes=[client.V1Volume(name="certs", secret=client.V1SecretVolumeSource(secret_name="certs"))],
        ),
    ))  # fmt: skip
    for name, port, target in (("index", 443, 8443), ("model", 80, 8080)):
        cluster.core.create_namespaced_service(ns, client.V1Service(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1ServiceSpec(selector=labels, ports=[client.V1ServicePort(port=port, target_port=target)]),
        ))  # fmt: skip

    def running() -> bool | None:
        pod = cluster.core.read_namespaced_pod("upstream", ns)
        return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ()) or None

    eventually(running, "the upstream servers", 180)
    try:
        yield {"index": index, "model": model, "ca": ca.pair.cert.read_text()}
    finally:
        cluster.core.delete_namespace(ns)


@pytest.fixture(scope="module")
def sandbox(cluster: Cluster, e2e_namespace: str, upstreams: dict[str, str]) -> Iterator[Sandbox]:
    base = cluster.get(e2e_namespace, "sandboxtemplates", "workspace")
    assert base is not None
    spec: dict[str, Any] = json.loads(json.dumps(base["spec"]))
    spec.pop("networkPolicy", None)
    spec["egress"] = {
        "rules": [
            {"host": upstreams["index"]},
            {
                "host": upstreams["model"],
                "ports": [80],
                "methods": ["POST"],
                "paths": ["/v1/"],
                "credential": {
                    "secretName": "model-key",
                    "key": "token",
                    "header": "Authorization",
                    "prefix": "Bearer ",
                },
            },
        ]
    }
    cluster.create(
        e2e_namespace,
        "sandboxtemplates",
        {"kind": "SandboxTemplate", "metadata": {"name": "egress"}, "spec": spec},
    )
    cluster.core.create_namespaced_secret(e2e_namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name="model-key", labels={"shadow.dev/egress-credential": "true"}),
        string_data={"token": SECRET},
    ))  # fmt: skip
    mp = pytest.MonkeyPatch()
    mp.setenv("KUBECONFIG", cluster.kubeconfig)
    with SandboxClient(namespace=e2e_namespace, client=None) as sdk:
        made = sdk.create_sandbox("egress", sandbox_ready_timeout=300)
        # The upstream's CA, for the index's tunnel (the client, not the gateway, checks that certificate).
        made.commands.run(
            ["sh", "-c", f"cat > /tmp/upstream-ca.pem <<'EOF'\n{upstreams['ca']}EOF"], timeout=30
        )
        # The gateway publishes the namespace's CA before the Pod needs it only if it knew the Pod: wait for it.
        eventually(
            lambda: (
                made.commands.run(["test", "-s", "/etc/shadow-egress/bundle.crt"], timeout=30).exit_code == 0
                or None
            ),
            "the egress CA in the workspace",
            120,
        )
        yield made
    mp.undo()


def sh(sandbox: Sandbox, command: str) -> str:
    result = sandbox.commands.run(["sh", "-c", command], timeout=60)
    return result.stdout.strip()


def test_allowed_traffic_passes_and_the_credential_arrives_unseen(
    cluster: Cluster, sandbox: Sandbox, upstreams: dict[str, str]
) -> None:
    index, model = upstreams["index"], upstreams["model"]
    # In-cluster names are in NO_PROXY (the NetworkPolicy decides): these stand-ins are reached through the proxy.
    tunnel = sh(sandbox, f"curl -sS --noproxy '' --cacert /tmp/upstream-ca.pem https://{index}/simple/numpy/")
    assert tunnel.startswith("GET /simple/numpy/ "), tunnel
    answer = sh(
        sandbox, f"curl -sS --noproxy '' -X POST -H 'Authorization: Bearer mine' -d x http://{model}/v1/chat"
    )
    assert answer == f"POST /v1/chat {hashlib.sha256(f'Bearer {SECRET}'.encode()).hexdigest()}", answer
    refused = sh(sandbox, f"curl -sS --noproxy '' http://{model}/v1/chat")
    assert (
        f"egress to {model} GET /v1/chat is not allowed for sandbox" in refused
        and "add method GET" in refused
    )
    other = sh(sandbox, "curl -sS --noproxy '' -o /dev/null -w '%{http_connect}' https://pypi.org/ || true")
    assert other == "403", other
    # The tenant reads the refusal, and the rule that would allow it, from the gateway's Events on the Sandbox.

    def logged() -> dict[str, Any] | None:
        shown = run(
            cluster.kubeconfig, "egress", "log", sandbox.claim_name, "--sandbox", "-n", sandbox.namespace,
            "--refused", "-o", "json",
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        return next((d for d in json.loads(shown.stdout) if (d["method"], d["host"]) == ("GET", model)), None)

    decision = eventually(logged, "the refusal in shadowctl egress log", 30)
    assert decision["path"] == "/v1/chat" and decision["hint"] == f"GET {model}:80/v1/", decision
    # Nothing the workspace can read holds the key.
    seen = sh(
        sandbox,
        "env; ps auxeww; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; cat /workspace/HANDOFF.md 2>/dev/null; "
        # Split in two, so that this command line (which ps shows) does not hold the key itself.
        f"grep -rl '{SECRET[:7]}''{SECRET[7:]}' /workspace /tmp /etc /home /root 2>/dev/null; true",
    )
    assert "HTTPS_PROXY=http://sandbox:" in seen and SECRET not in seen


def test_what_ignores_or_abuses_the_proxy_is_refused(sandbox: Sandbox, upstreams: dict[str, str]) -> None:
    index = upstreams["index"]
    probe = lambda *args: sh(sandbox, "python3 -c " + json.dumps(PROBE) + " " + " ".join(args))  # noqa: E731
    cells = {
        "raw TCP to the internet": probe("tcp", "1.1.1.1", "443"),
        "UDP to a public resolver": probe("udp", "8.8.8.8", "53"),
        "the allowed index, without the proxy": probe("tcp", index, "443"),
    }
    for cell, outcome in cells.items():
        assert outcome not in ("open", "answered"), f"{cell}: got through ({outcome})"
    unset = sh(
        sandbox,
        f"env -u HTTPS_PROXY -u https_proxy curl -sS -m 5 --cacert /tmp/upstream-ca.pem https://{index}/ 2>&1 || true",
    )
    assert "upstream" not in unset and not unset.startswith("GET"), unset
    ip = sh(sandbox, "curl -sS --noproxy '' -o /dev/null -w '%{http_connect}' https://1.1.1.1/ || true")
    assert ip == "403", ip
