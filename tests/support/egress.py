"""A real egress gateway process on loopback, real HTTPS upstreams, and clients that go through it."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from tests.support.controlplane import wait_for
from tests.support.pki import CertificateAuthority

ROOT = Path(__file__).resolve().parents[2]
# How long a /stream/ response lasts unless its client goes first.
STREAM_SECONDS = 60
EGRESS_PYTHON = Path(os.environ.get("SHADOW_EGRESS_PYTHON") or ROOT / ".venv-egress" / "bin" / "python")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Upstream:
    """An HTTPS server for one name, recording what it received."""

    name: str
    port: int
    received: list[dict[str, Any]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None


def start_upstream(
    ca: CertificateAuthority | None, name: str, body: bytes = b"upstream says hi\n"
) -> Upstream:
    """HTTPS with a certificate from `ca`, or clear HTTP without one."""
    upstream = Upstream(name, free_port())

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            upstream.received.append(
                {"method": self.command, "path": self.path, "headers": dict(self.headers)}
            )
            if "/stream/" in self.path:
                self._stream()
                return
            payload = body if not self.path.startswith("/big/") else b"x" * int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _stream(self) -> None:
            """A response that never ends by itself (a long download, a model's token stream): a line every
            tenth of a second, chunked, until the connection goes."""
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for _ in range(STREAM_SECONDS * 10):
                    self.wfile.write(b"5\r\ntick\n\r\n")
                    self.wfile.flush()
                    time.sleep(0.1)  # the pace of the stream, not a wait for something
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                self.close_connection = True

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", upstream.port), Handler)
    if ca is not None:
        pair = ca.issue(name.replace(".", "-"), name, dns_names=(name,), server=True)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(pair.cert, pair.key)
        # The handshake happens in the request's thread, not the accept loop: one slow client blocks nobody.
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    upstream.server = server
    return upstream


@dataclass
class Gateway:
    port: int
    admin_port: int
    policy: Path
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def write_policy(self, data: dict[str, Any]) -> None:
        tmp = self.policy.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.policy)

    def proxy(self, token: str) -> str:
        return f"http://sandbox:{token}@127.0.0.1:{self.port}"

    def ca_pem(self, namespace: str) -> str:
        return httpx.get(f"{self.admin}/v1/ca/{namespace}").raise_for_status().text


def start_gateway(
    directory: Path,
    upstream_ca: Path,
    resolve: dict[str, str],
    policy: dict[str, Any] | None,
    key_secret: str | None = None,
    extra: tuple[str, ...] = (),
) -> Iterator[Gateway]:
    """The gateway with a policy file (`policy`) or following the cluster of $KUBECONFIG (`key_secret`:
    NAMESPACE/NAME of the Secret with the proxy credentials' key)."""
    if not EGRESS_PYTHON.exists():
        raise RuntimeError(
            f"{EGRESS_PYTHON} is missing: run `make dev` (it creates .venv-egress with mitmproxy)"
        )
    port, admin_port = free_port(), free_port()
    policy_path = directory / "policy.json"
    log = directory / "gateway.log"
    gateway = Gateway(port, admin_port, policy_path, None, log)  # type: ignore[arg-type]
    if policy is not None:
        gateway.write_policy(policy)
    args = [
        str(EGRESS_PYTHON), "-m", "shadow_operator.egress",
        "--listen", "127.0.0.1", "--port", str(port), "--admin-port", str(admin_port),
        "--ca-dir", str(directory / "ca"),
        *(["--policy-file", str(policy_path)] if policy is not None else ["--key-secret", str(key_secret)]),
        "--own-address", "127.0.0.1", "--allow-private", "127.0.0.0/8", "--upstream-ca", str(upstream_ca),
        *extra,
    ]  # fmt: skip
    for host, address in resolve.items():
        args += ["--resolve", f"{host}={address}"]
    with log.open("wb") as out:
        gateway.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)

    def up() -> bool:
        if gateway.process.poll() is not None:
            raise RuntimeError(f"the gateway exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return httpx.get(f"{gateway.admin}/healthz").status_code == 200
        except OSError:
            return False

    wait_for(up, timeout=30, what="the egress gateway to listen")
    try:
        yield gateway
    finally:
        gateway.process.terminate()
        gateway.process.wait(timeout=10)
