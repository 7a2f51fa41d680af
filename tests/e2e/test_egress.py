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
    # DNS rebinding's stand-in: an allowed name whose answer is the node's own address (the kubelet's), a private
    # address outside the ranges the gateway may reach (a headless Service with a hand-made EndpointSlice).
    node_ip = next(
        a.address
        for n in cluster.core.list_node().items
        for a in n.status.addresses
        if a.type == "InternalIP"
    )
    cluster.core.create_namespaced_service(ns, client.V1Service(
        metadata=client.V1ObjectMeta(name="rebind"),
        spec=client.V1ServiceSpec(cluster_ip="None", ports=[client.V1ServicePort(port=443)]),
    ))  # fmt: skip
    client.DiscoveryV1Api(cluster.api).create_namespaced_endpoint_slice(ns, client.V1EndpointSlice(
        metadata=client.V1ObjectMeta(name="rebind", labels={"kubernetes.io/service-name": "rebind"}),
        address_type="IPv4",
        endpoints=[client.V1Endpoint(addresses=[node_ip])],
        ports=[client.DiscoveryV1EndpointPort(port=443)],
    ))  # fmt: skip

    def running() -> bool | None:
        pod = cluster.core.read_namespaced_pod("upstream", ns)
        return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ()) or None

    eventually(running, "the upstream servers", 180)
    try:
        yield {
            "index": index,
            "model": model,
            "rebind": f"rebind.{ns}.svc.cluster.local",
            "node": node_ip,
            "ca": ca.pair.cert.read_text(),
        }
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
            {"host": upstreams["rebind"]},
            # As a platform might allow its in-cluster services: it also covers the gateway's own Service.
            {"host": "*.svc.cluster.local", "ports": [3128, 9091]},
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


def run_python(sandbox: Sandbox, program: str, *args: str) -> str:
    """A Python program run in the workspace, its output (the program its own argument, never shell-quoted)."""
    result = sandbox.commands.run(["python3", "-c", program, *args], timeout=60)
    assert not result.stderr.strip(), result.stderr[-2000:]
    return result.stdout.strip()


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
    # The program goes as an argument of its own: through `sh -c "..."` its newlines arrived as backslash-n, it
    # did not even compile, and an empty output passed these cells.
    probe = lambda *args: run_python(sandbox, PROBE, *args)  # noqa: E731
    cells = {
        "raw TCP to the internet": probe("tcp", "1.1.1.1", "443"),
        "UDP to a public resolver": probe("udp", "8.8.8.8", "53"),
        "the allowed index, without the proxy": probe("tcp", index, "443"),
    }
    for cell, outcome in cells.items():
        assert outcome and outcome not in ("open", "answered"), (
            f"{cell}: got through ({outcome or 'no output'})"
        )
    unset = sh(
        sandbox,
        f"env -u HTTPS_PROXY -u https_proxy curl -sS -m 5 --cacert /tmp/upstream-ca.pem https://{index}/ 2>&1 || true",
    )
    assert "upstream" not in unset and not unset.startswith("GET"), unset
    ip = sh(sandbox, "curl -sS --noproxy '' -o /dev/null -w '%{http_connect}' https://1.1.1.1/ || true")
    assert ip == "403", ip


# A hostile workspace talks to the gateway itself (its address from HTTPS_PROXY, with its own proxy credential):
# prints one line per try, the gateway's answer (status line and reason) or why the connection ended.
HOSTILE = """
import base64, os, socket, ssl, sys, urllib.parse
index, model, rebind = sys.argv[1:4]
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
auth = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
def connect(host, port):
    sock = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\nProxy-Authorization: Basic {auth}\\r\\n\\r\\n".encode())
    return sock
def answer(sock):
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError as exc:
        data += f" ({type(exc).__name__})".encode()
    return data.decode(errors="replace")
def plain(headers):
    sock = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
    sock.sendall((f"POST http://{model}/v1/chat HTTP/1.1\\r\\nProxy-Authorization: Basic {auth}\\r\\n"
                  f"Content-Length: 0\\r\\nConnection: close\\r\\n{headers}\\r\\n").encode())
    return answer(sock)
def line(name, text):
    text = " ".join(text.split())
    print(f"{name}: {text[:400]}")
# SNI that is not the CONNECT host (domain fronting through a tunnel).
host, _, port = index.partition(":")
sock = connect(host, int(port or 443))
head = b""
while b"\\r\\n\\r\\n" not in head and (byte := sock.recv(1)):
    head += byte
if not head.startswith(b"HTTP/1.1 200"):
    line("sni", "CONNECT refused: " + head.decode(errors="replace") + answer(sock))
else:
    try:
        context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
        tls = context.wrap_socket(sock, server_hostname="evil.example")
        tls.sendall(f"GET / HTTP/1.1\\r\\nHost: {host}\\r\\nConnection: close\\r\\n\\r\\n".encode())
        line("sni", answer(tls))
    except (OSError, ssl.SSLError) as exc:
        line("sni", f"{type(exc).__name__}: {exc}")
# A Host header that is not the URL's (fronting in clear HTTP), and protocol upgrades.
line("host", plain("Host: evil.example\\r\\n"))
line("h2c", plain(f"Host: {model}\\r\\nUpgrade: h2c\\r\\nConnection: Upgrade, HTTP2-Settings\\r\\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\\r\\n"))
line("websocket", plain(f"Host: {model}\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\\r\\nSec-WebSocket-Version: 13\\r\\n"))
# The gateway's own admin port, by the name of its Service (which a rule covers), and an allowed name whose DNS
# answer is a private address.
line("admin", answer(connect(proxy.hostname, 9091)))
line("rebind", answer(connect(rebind, 443)))
"""


def test_what_a_hostile_workspace_tries_at_the_gateway_is_refused(
    sandbox: Sandbox, upstreams: dict[str, str]
) -> None:
    """Issue 29's attacks on kind, each answered by the gateway with a 403 that says why: domain fronting by TLS
    server name and by Host header, h2c and WebSocket upgrades, the gateway's own admin port reached by its
    Service's name, and an allowed name that resolves to a private address (the node's)."""
    out = run_python(sandbox, HOSTILE, upstreams["index"], upstreams["model"], upstreams["rebind"])
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    expected = {
        "sni": "the TLS server name (evil.example) differs from the CONNECT host",
        "host": "the request's Host (evil.example) differs from its URL's",
        "h2c": "protocol upgrades (h2c) are not allowed",
        "websocket": "as a WebSocket is not allowed",
        "admin": "that is the gateway itself",
        "rebind": f"it resolves to {upstreams['node']}, which is not a public address",
    }
    for cell, reason in expected.items():
        got = lines.get(cell, "")
        assert got.startswith("HTTP/1.1 403") and reason in got, f"{cell}: {got or out}"
