"""Loopback HTTP servers for git tests: a real smart-HTTP git server and a canary.

    with GitHttpServer(tmp_path / "repos") as server:      # `git http-backend`, push enabled
        url = server.repo_url("org/core")                  # an empty bare repository, created
        server.gate.clear()                                # requests wait (a slow upstream) ...
        server.gate.set()                                  # ... until now
        ...
        assert server.authorizations == ["token s3cret"]   # what each request carried

`CanaryServer` answers every request with 502 and records the request line and headers, so a test sees
whether a hostile configuration (`http.proxy`, `url.<x>.insteadOf`) sent git, or a secret, its way.
"""

from __future__ import annotations

import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any


class _Server:
    handler: type[BaseHTTPRequestHandler]

    def __init__(self) -> None:
        self.requests: list[str] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
        self._httpd.owner = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class _GitHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        owner: GitHttpServer = self.server.owner  # type: ignore[attr-defined]
        owner.requests.append(f"{self.command} {self.path}")
        owner.gate.wait(timeout=300)  # a slow upstream, as long as the test holds it
        owner.authorizations.append(self.headers.get("Authorization", ""))
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = self._read_chunked()
        env = {
            "GIT_PROJECT_ROOT": str(owner.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": "tester",
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "GIT_CONFIG_NOSYSTEM": "1",
            "HOME": str(owner.root),
            "PATH": "/usr/bin:/bin",
        }
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False)
        head, _, payload = out.stdout.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.decode().split("\r\n"):
            key, _, value = line.partition(": ")
            if key.lower() == "status":
                status = int(value.split()[0])
            elif key:
                headers.append((key, value))
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _read_chunked(self) -> bytes:
        data = b""
        while True:
            size = int(self.rfile.readline().strip(), 16)
            if size == 0:
                self.rfile.readline()
                return data
            data += self.rfile.read(size)
            self.rfile.readline()

    do_GET = _serve
    do_POST = _serve


class GitHttpServer(_Server):
    """`git http-backend` over HTTP on loopback, serving (and accepting pushes to) bare repositories."""

    handler = _GitHandler

    def __init__(self, root: Path) -> None:
        self.root = root
        self.authorizations: list[str] = []
        # Requests wait while the gate is closed (`gate.clear()`): a clone that takes as long as the test says.
        self.gate = threading.Event()
        self.gate.set()
        root.mkdir(parents=True, exist_ok=True)
        super().__init__()

    def repo_url(self, name: str) -> str:
        """URL of the bare repository `name` (created empty, pushes allowed)."""
        path = self.root / f"{name}.git"
        if not path.exists():
            subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
            subprocess.run(["git", "-C", str(path), "config", "http.receivepack", "true"], check=True)
        return f"{self.url}/{name}.git"


class _CanaryHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def _record(self) -> None:
        owner: CanaryServer = self.server.owner  # type: ignore[attr-defined]
        owner.requests.append(f"{self.command} {self.path}\n{self.headers}")
        self.send_response(502)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = _record
    do_POST = _record
    do_CONNECT = _record


class CanaryServer(_Server):
    """Records every request (line and headers) and answers 502."""

    handler = _CanaryHandler
