"""The egress gateway as a real process on loopback, between real clients and real HTTPS servers.

Every hostile trick of issue 29 that a loopback setup can reproduce is tried here: the NetworkPolicy half (raw
TCP/UDP, unset proxy variables) needs a cluster and is in tests/e2e.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import socketserver
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.controlplane import wait_for
from tests.support.egress import EGRESS_PYTHON, ROOT, Gateway, Upstream, start_gateway, start_upstream
from tests.support.pki import CertificateAuthority

pytestmark = pytest.mark.unit

TOKEN_A, TOKEN_B, LOG_TOKEN = "a" * 64, "b" * 64, "log-token-of-agent"
SECRET, GIT_SECRET = "sk-live-0123456789abcdef", "ghp-real-git-token-42"
PLACEHOLDER = "SHADOW-PLACEHOLDER-GIT"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("egress")
    ca = CertificateAuthority(directory, "upstream-test-ca")
    ups = {
        name: start_upstream(ca, name)
        for name in ("pypi.test", "files.test", "mirror.test", "model.test", "git.test", "other.test")
    }
    ups["plain.test"] = start_upstream(None, "plain.test")
    resolve = {name: "127.0.0.1" for name in ups} | {"rebind.test": "10.1.2.3", "gw.test": "127.0.0.1"}
    # svc.test stands for the gateway's Service: another address that leads to it (see the forward below).
    resolve |= {"svc.test": SERVICE_ADDRESS, "internal.test": SERVICE_ADDRESS}
    gen = start_gateway(directory, ca.pair.cert, resolve, {"sandboxes": []}, extra=("--own-name", "svc.test"))
    gateway = next(gen)
    world = {"gateway": gateway, "ups": ups, "ca": ca, "dir": directory}
    gateway.write_policy(policy(world))
    wait_for(
        lambda: httpx.get(f"{gateway.admin}/v1/ca/team-a").status_code == 200, timeout=5, what="the policy"
    )
    bundle = directory / "trust.pem"
    bundle.write_text(gateway.ca_pem("team-a") + ca.pair.cert.read_text())
    world["trust"] = bundle
    yield world
    for upstream in ups.values():
        assert upstream.server is not None
        upstream.server.shutdown()
    next(gen, None)


def policy(
    world: dict[str, Any], pypi_methods: tuple[str, ...] = ("GET", "HEAD"), without: tuple[str, ...] = ()
) -> dict[str, Any]:
    ups: dict[str, Upstream] = world["ups"]
    gateway: Gateway = world["gateway"]

    def port(name: str) -> list[int]:
        return [ups[name].port]

    def model_api(host: str) -> dict[str, Any]:
        """A model API: POST under /v1/, with the key the gateway adds."""
        credential = {"secretName": "model", "key": "token", "header": "Authorization", "prefix": "Bearer "}
        return {
            "host": host,
            "ports": port(host),
            "methods": ["POST"],
            "paths": ["/v1/"],
            "credential": credential,
        }

    rules = [
        {
            "host": "pypi.test",
            "ports": port("pypi.test"),
            "methods": list(pypi_methods),
            "paths": ["/simple/"],
        },
        {"host": "files.test", "ports": port("files.test")},
        {"host": "mirror.test", "ports": port("mirror.test")},
        model_api("model.test"),
        {
            "host": "git.test",
            "ports": port("git.test"),
            "credential": {"secretName": "git", "key": "token", "placeholder": PLACEHOLDER},
        },
        {"host": "rebind.test", "ports": [443]},
        model_api("plain.test"),
        {"host": "gw.test", "ports": [gateway.admin_port, gateway.port]},
        {"host": "internal.test", "ports": [gateway.admin_port, gateway.port]},
        {"host": "svc.test", "ports": [gateway.admin_port, gateway.port]},
    ]
    rules = [rule for rule in rules if rule["host"] not in without]
    return {
        "sandboxes": [
            {"namespace": "team-a", "name": "agent", "token": TOKEN_A, "addresses": ["127.0.0.1"],
             "template": {"rules": rules}, "logToken": LOG_TOKEN},
            {"namespace": "team-b", "name": "other", "token": TOKEN_B, "addresses": ["127.0.0.2"],
             "template": {"rules": [{"host": "other.test", "ports": port("other.test")}]}},
        ],
        "secrets": {"team-a/model": {"token": SECRET}, "team-a/git": {"token": GIT_SECRET}},
    }  # fmt: skip


def client(world: dict[str, Any], token: str = TOKEN_A, **kwargs: Any) -> httpx.Client:
    return httpx.Client(
        proxy=world["gateway"].proxy(token),
        verify=ssl.create_default_context(cafile=world["trust"]),
        timeout=10,
        **kwargs,
    )


def url(world: dict[str, Any], host: str, path: str) -> str:
    return f"https://{host}:{world['ups'][host].port}{path}"


def tunnel(world: dict[str, Any], host: str, port: int, token: str = TOKEN_A) -> tuple[socket.socket, str]:
    """A raw CONNECT through the gateway: (the socket, the status line and headers of its answer)."""
    gateway: Gateway = world["gateway"]
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
    auth = base64.b64encode(f"sandbox:{token}".encode()).decode()
    sock.sendall(
        f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        if not chunk:
            break
        answer += chunk
    if not answer.startswith(b"HTTP/1.1 200"):
        # A refusal: its body (the reason) follows, then the gateway closes.
        while chunk := sock.recv(4096):
            answer += chunk
    return sock, answer.decode(errors="replace")


def over_tls(world: dict[str, Any], sock: socket.socket, sni: str, request: str) -> str:
    context = ssl.create_default_context(cafile=world["trust"])
    with context.wrap_socket(sock, server_hostname=sni) as tls:
        tls.sendall(request.encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    return data.decode(errors="replace")


def test_allowed_method_and_path_pass_and_everything_else_is_refused_with_the_missing_rule(
    world: dict[str, Any],
) -> None:
    with client(world) as http:
        ok = http.get(url(world, "pypi.test", "/simple/numpy/"))
        assert ok.status_code == 200 and ok.text == "upstream says hi\n"
        post = http.post(url(world, "pypi.test", "/simple/numpy/"), content=b"x")
        assert post.status_code == 403
        assert post.text.startswith(
            "egress to pypi.test POST /simple/numpy/ is not allowed for sandbox team-a/agent: the rules for this "
            "host allow only pypi.test"
        )
        assert http.get(url(world, "pypi.test", "/admin/")).status_code == 403
        # Nor any path that could be another one upstream.
        assert http.get(url(world, "pypi.test", "/simple/%2e%2e/admin")).status_code == 403
    assert [r["path"] for r in world["ups"]["pypi.test"].received] == ["/simple/numpy/"]


def test_a_host_without_a_rule_is_refused_at_connect(world: dict[str, Any]) -> None:
    with client(world) as http, pytest.raises(httpx.ProxyError, match="403"):
        http.get(url(world, "other.test", "/"))
    sock, answer = tunnel(world, "other.test", world["ups"]["other.test"].port)
    sock.close()
    assert answer.startswith("HTTP/1.1 403")
    assert (
        "egress to other.test:" in answer
        and "is not allowed for sandbox team-a/agent: add host other.test" in answer
    )


def test_a_host_only_rule_is_a_tunnel_the_gateway_does_not_open(world: dict[str, Any]) -> None:
    sock, answer = tunnel(world, "files.test", world["ups"]["files.test"].port)
    assert answer.startswith("HTTP/1.1 200")
    context = ssl.create_default_context(cafile=world["ca"].pair.cert)  # the upstream's CA only
    with context.wrap_socket(sock, server_hostname="files.test") as tls:
        issuer = dict(x[0] for x in tls.getpeercert()["issuer"])  # type: ignore[index,misc]
        assert issuer["commonName"] == "upstream-test-ca"


def test_the_credential_arrives_upstream_and_never_came_from_the_workspace(world: dict[str, Any]) -> None:
    with client(world) as http:
        answer = http.post(
            url(world, "model.test", "/v1/chat"), headers={"Authorization": "Bearer fake"}, json={}
        )
        assert answer.status_code == 200
        git = http.get(
            url(world, "git.test", "/repo.git/info/refs"), headers={"Authorization": f"token {PLACEHOLDER}"}
        )
        assert git.status_code == 200
    assert world["ups"]["model.test"].received[-1]["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert world["ups"]["git.test"].received[-1]["headers"]["Authorization"] == f"token {GIT_SECRET}"
    # The proxy credential stays with the gateway.
    assert not any("Proxy-Authorization" in r["headers"] for u in world["ups"].values() for r in u.received)


def test_domain_fronting_by_sni_or_host_header_is_refused(world: dict[str, Any]) -> None:
    port = world["ups"]["files.test"].port
    sock, answer = tunnel(world, "files.test", port)
    assert answer.startswith("HTTP/1.1 200")
    reply = over_tls(
        world, sock, "other.test", f"GET / HTTP/1.1\r\nHost: files.test:{port}\r\nConnection: close\r\n\r\n"
    )
    assert reply.startswith("HTTP/1.1 403")
    assert "the TLS server name (other.test) differs from the CONNECT host (files.test)" in reply
    port = world["ups"]["pypi.test"].port
    sock, _ = tunnel(world, "pypi.test", port)
    reply = over_tls(
        world, sock, "pypi.test", "GET /simple/ HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n"
    )
    assert reply.startswith("HTTP/1.1 403")
    assert "the request's Host (other.test) differs from the host connected to (pypi.test)" in reply
    assert world["ups"]["other.test"].received == []


@pytest.mark.parametrize(
    ("host", "port", "message"),
    [
        ("127.0.0.1", 443, "egress to the IP address 127.0.0.1 is not allowed"),
        ("[::1]", 443, "egress to the IP address ::1 is not allowed"),
        ("rebind.test", 443, "it resolves to 10.1.2.3, which is not a public address"),
        ("gw.test", None, "that is the gateway itself"),
    ],
)
def test_ip_addresses_private_answers_and_the_gateway_itself_are_refused(
    world: dict[str, Any], host: str, port: int | None, message: str
) -> None:
    sock, answer = tunnel(world, host, port or world["gateway"].admin_port)
    sock.close()
    assert answer.startswith("HTTP/1.1 403") and message in answer


def test_a_namespace_with_the_longest_name_gets_its_ca() -> None:
    """A namespace's name may have 63 characters; the CA's common name holds it, and X.509 caps that at 64.
    Before, a gateway following a cluster made no CA for such a namespace (its admin port answered 500), and so
    no egress through TLS-terminating rules. Run by the gateway's own interpreter (mitmproxy is there)."""
    script = (
        "import json, sys; from cryptography import x509; from shadow_operator.egress.addon import make_ca\n"
        "names = []\n"
        "for ns in sys.argv[1:]:\n"
        "    cert = x509.load_pem_x509_certificate(make_ca(ns)[1])\n"
        "    names.append(cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value)\n"
        "print(json.dumps(names))\n"
    )
    out = subprocess.run(
        [str(EGRESS_PYTHON), "-c", script, "n" * 63, "n" * 62 + "m", "team-a"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    long_one, other_long_one, short = json.loads(out.stdout)
    assert len(long_one) <= 64 and len(other_long_one) <= 64 and long_one != other_long_one
    assert long_one.startswith("shadow-egress nnnn") and short == "shadow-egress team-a"


SERVICE_ADDRESS = "127.0.0.5"


@contextlib.contextmanager
def service(address: str, port: int, target: tuple[str, int]) -> Iterator[None]:
    """What kube-proxy does for a Service: connections to address:port are carried to `target`."""

    class Pipe(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            with socket.create_connection(target, timeout=10) as upstream:

                def pump(src: socket.socket, dst: socket.socket) -> None:
                    with contextlib.suppress(OSError):
                        while data := src.recv(65536):
                            dst.sendall(data)
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)

                back = threading.Thread(target=pump, args=(upstream, self.request), daemon=True)
                back.start()
                pump(self.request, upstream)
                back.join(10)

    server = socketserver.ThreadingTCPServer((address, port), Pipe)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("host", ["svc.test", "internal.test"])
def test_the_gateways_service_is_the_gateway_itself(world: dict[str, Any], host: str) -> None:
    """A sandbox allowed a private range that holds the gateway's Service address (an internal mirror's range),
    or a name that resolves there, must not reach the gateway's own ports through the Service: its admin port
    serves the metrics, which name every tenant's sandboxes and hosts. Before, only the Pod's own address was
    refused, and the tunnel opened onto the metrics."""
    gateway: Gateway = world["gateway"]
    with service(SERVICE_ADDRESS, gateway.admin_port, ("127.0.0.1", gateway.admin_port)):
        # The stand-in Service does lead to the admin port.
        assert httpx.get(f"http://{SERVICE_ADDRESS}:{gateway.admin_port}/healthz").status_code == 200
        sock, answer = tunnel(world, host, gateway.admin_port)
        with sock:
            if answer.startswith("HTTP/1.1 200"):
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answer += sock.recv(4096).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 403") and "that is the gateway itself" in answer, answer[:300]


def curl(
    world: dict[str, Any], host: str, path: str, method: str = "GET", token: str = TOKEN_A, *options: str
) -> tuple[str, str]:
    """("HTTP-version status CONNECT-status", body) of a request by curl through the gateway."""
    out = subprocess.run(
        ["curl", "-sS", "-X", method, "--proxy", world["gateway"].proxy(token), "--cacert", str(world["trust"]),
         "-w", "\\n%{http_version} %{http_code} %{http_connect}", *options, url(world, host, path)],
        capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    body, _, status = out.rpartition("\n")
    return status, body


def test_http2_requests_are_checked_one_by_one(world: dict[str, Any]) -> None:
    # httpx offers HTTP/1.1 first in its ALPN, so curl is the HTTP/2 client here.
    assert curl(world, "pypi.test", "/simple/", "GET", TOKEN_A, "--http2") == (
        "2 200 200",
        "upstream says hi\n",
    )
    status, body = curl(world, "pypi.test", "/simple/", "DELETE", TOKEN_A, "--http2")
    assert status == "2 403 200" and "DELETE /simple/ is not allowed" in body


@pytest.mark.parametrize(
    ("upgrade", "message"),
    [("websocket", "as a WebSocket is not allowed"), ("h2c", "protocol upgrades (h2c) are not allowed")],
)
def test_protocol_upgrades_are_refused(world: dict[str, Any], upgrade: str, message: str) -> None:
    headers = {
        "Upgrade": upgrade,
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
        "HTTP2-Settings": "AAMAAABkAARAAAAAAAIAAAAA",
    }
    with client(world) as http:
        answer = http.get(url(world, "pypi.test", "/simple/"), headers=headers)
    assert answer.status_code == 403 and message in answer.text


def test_connections_are_attributed_by_credential_and_address_together(world: dict[str, Any]) -> None:
    # No credential, and team-b's credential from team-a's address: neither names a sandbox.
    for token in ("", TOKEN_B):
        sock, answer = tunnel(world, "other.test", world["ups"]["other.test"].port, token=token)
        sock.close()
        assert answer.startswith("HTTP/1.1 407")
    # From team-b's address (httpx cannot bind the source address of a proxied connection; curl can).
    assert curl(world, "other.test", "/", "GET", TOKEN_B, "--interface", "127.0.0.2")[0] == "1.1 200 200"
    # team-a's rules never apply to team-b's sandbox.
    assert curl(world, "files.test", "/", "GET", TOKEN_B, "--interface", "127.0.0.2")[0] == "0 000 403"
    assert curl(world, "other.test", "/", "GET", TOKEN_A, "--interface", "127.0.0.2")[0] == "0 000 407"


def test_a_policy_change_applies_within_two_seconds(world: dict[str, Any]) -> None:
    gateway: Gateway = world["gateway"]
    with client(world) as http:
        assert http.put(url(world, "pypi.test", "/simple/x"), content=b"").status_code == 403
        gateway.write_policy(policy(world, pypi_methods=("GET", "PUT")))
        start = time.monotonic()
        try:
            wait_for(
                lambda: http.put(url(world, "pypi.test", "/simple/x"), content=b"").status_code == 200,
                timeout=2,
                what="PUT allowed",
            )
            assert time.monotonic() - start < 2
        finally:
            gateway.write_policy(policy(world))
            wait_for(
                lambda: http.put(url(world, "pypi.test", "/simple/x"), content=b"").status_code == 403,
                timeout=2,
                what="PUT refused again",
            )


def streaming(world: dict[str, Any], host: str, path: str, trust: Any) -> ssl.SSLSocket:
    """A CONNECT tunnel carrying a response that does not end by itself, its first line read."""
    sock, answer = tunnel(world, host, world["ups"][host].port)
    assert answer.startswith("HTTP/1.1 200")
    tls = ssl.create_default_context(cafile=trust).wrap_socket(sock, server_hostname=host)
    tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{world['ups'][host].port}\r\n\r\n".encode())
    received = b""
    while b"tick" not in received:
        chunk = tls.recv(65536)
        assert chunk, f"the stream through {host} ended before it began: {received!r}"
        received += chunk
    return tls


def closed(tls: ssl.SSLSocket) -> bool:
    """Whether the gateway closed the connection (non-blocking; what arrived before is read and dropped)."""
    try:
        while tls.recv(65536):
            pass
    except (ssl.SSLWantReadError, BlockingIOError):
        return False  # open, nothing more yet
    except OSError:
        return True  # reset
    return True  # end of stream


def test_open_connections_that_a_policy_change_no_longer_allows_are_closed_within_two_seconds(
    world: dict[str, Any],
) -> None:
    gateway: Gateway = world["gateway"]
    upstream_ca = world["ca"].pair.cert
    # Passed through (a host-only rule): the gateway never sees a request on these, only the tunnel.
    gone = streaming(world, "files.test", "/stream/", upstream_ca)
    kept = streaming(world, "mirror.test", "/stream/", upstream_ca)
    # Terminated (methods and paths): a GET in flight that the new rules refuse.
    refused = streaming(world, "pypi.test", "/simple/stream/", world["trust"])
    for tls in (gone, kept, refused):
        tls.setblocking(False)
    try:
        gateway.write_policy(policy(world, pypi_methods=("HEAD",), without=("files.test",)))
        start = time.monotonic()
        wait_for(lambda: closed(gone), timeout=2, what="the tunnel whose rule went to close")
        wait_for(lambda: closed(refused), timeout=2, what="the request the rules now refuse to end")
        assert time.monotonic() - start < 2
        # Still allowed: it stays open and keeps streaming after the others were closed.
        assert not closed(kept)
        kept.settimeout(2)
        assert b"tick" in kept.recv(65536)
    finally:
        for tls in (gone, kept, refused):
            tls.close()
        gateway.write_policy(policy(world))
        wait_for(
            lambda: tunnel(world, "files.test", world["ups"]["files.test"].port)[1].startswith(
                "HTTP/1.1 200"
            ),
            timeout=2,
            what="the rules back",
        )


def test_decisions_are_logged_for_the_sandbox_and_counted(world: dict[str, Any]) -> None:
    gateway: Gateway = world["gateway"]
    with client(world) as http:
        http.post(url(world, "pypi.test", "/simple/audit/"), content=b"")
    denied = httpx.get(f"{gateway.admin}/v1/log/team-a/agent", headers={"Authorization": "Bearer wrong"})
    assert denied.status_code == 403
    log = httpx.get(
        f"{gateway.admin}/v1/log/team-a/agent", headers={"Authorization": f"Bearer {LOG_TOKEN}"}
    ).json()
    last = log["decisions"][-1]
    assert (last["host"], last["method"], last["path"], last["allowed"]) == (
        "pypi.test",
        "POST",
        "/simple/audit/",
        False,
    )
    assert "add method POST" in last["reason"]
    metrics = httpx.get(f"{gateway.admin}/metrics").text
    assert (
        'shadow_egress_decisions_total{decision="refused",method="POST",namespace="team-a",rule_host="-",sandbox="agent"}'
        in metrics
    )
    assert (
        'decision="allowed",method="GET",namespace="team-a",rule_host="pypi.test",sandbox="agent"' in metrics
    )


def test_clear_http_is_checked_per_request_and_gets_the_credential(world: dict[str, Any]) -> None:
    """Absolute-form requests (HTTP_PROXY), as curl sends them for http:// URLs."""
    port = world["ups"]["plain.test"].port
    base = f"http://plain.test:{port}"

    def run(*args: str, proxy: str = world["gateway"].proxy(TOKEN_A)) -> str:
        return subprocess.run(
            ["curl", "-sS", "--proxy", proxy, "-w", "\\n%{http_code}", *args],
            capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip

    assert run("-X", "POST", "-H", "Authorization: Bearer mine", "-d", "x", f"{base}/v1/chat").endswith(
        "\n200"
    )
    received = world["ups"]["plain.test"].received[-1]
    assert received["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert "Proxy-Authorization" not in received["headers"]
    refused = run(f"{base}/v1/chat")
    assert refused.endswith("\n403") and "egress to plain.test GET /v1/chat is not allowed" in refused
    assert "add method GET to the template" in refused
    fronted = run("-X", "POST", "-H", "Host: other.test", f"{base}/v1/chat")
    assert fronted.endswith("\n403") and "the request's Host (other.test) differs from its URL's" in fronted
    literal = run("-X", "POST", f"http://127.0.0.1:{port}/v1/chat")
    assert literal.endswith("\n403") and "egress to the IP address 127.0.0.1 is not allowed" in literal
    # Without the proxy credential: nobody's request.
    assert run(f"{base}/v1/chat", proxy=f"http://127.0.0.1:{world['gateway'].port}").endswith("\n407")
