"""A real sandbox-runtime on loopback: `python -m sandbox_runtime` as a subprocess with a temp root."""

from __future__ import annotations

import os
import signal
import site
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

RUNTIME_SRC = Path(__file__).resolve().parents[2] / "sandbox-runtime"
# The workspace image runs the runtime on Debian bookworm's python3 (3.11.2, no tarfile extraction
# filters); tests run it there too, with this venv's packages when the ABI (major.minor) is the same.
DEBIAN_PYTHON = "/usr/bin/python3"


def debian_python_version() -> tuple[int, int, int]:
    out = subprocess.run(
        [DEBIAN_PYTHON, "-c", "import sys; print(*sys.version_info[:3])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    major, minor, micro = (int(x) for x in out.split())
    return major, minor, micro


def debian_python_runs_this_venv() -> bool:
    return os.path.exists(DEBIAN_PYTHON) and debian_python_version()[:2] == sys.version_info[:2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Server:
    root: Path
    url: str
    proc: subprocess.Popen[bytes]
    token: str | None = None
    log: Path | None = None
    clients: list[httpx.Client] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def client(self, **kw: object) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        kw.setdefault("timeout", 60)
        c = httpx.Client(base_url=self.url, headers=headers, **kw)  # type: ignore[arg-type]
        self.clients.append(c)
        return c

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(
    root: Path,
    *args: str,
    env: dict[str, str] | None = None,
    token: str | None = None,
    log: Path | None = None,
    prefix: tuple[str, ...] = (),
    python: str = sys.executable,
    host: str = "127.0.0.1",
    port: int | None = None,
) -> Server:
    port = port or free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_RUNTIME_")}
    if python != sys.executable:  # another interpreter runs the runtime with this venv's packages
        full_env["PYTHONPATH"] = os.pathsep.join([str(RUNTIME_SRC), *site.getsitepackages()])
    full_env.update(env or {})
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [
            *prefix,
            python,
            "-m",
            "sandbox_runtime",
            "--root",
            str(root),
            "--host",
            host,
            "--port",
            str(port),
            *args,
        ],
        env=full_env,
        stdout=out,
        stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
    )
    srv = Server(root=root, url=f"http://{host}:{port}", proc=proc, token=token, log=log)

    def healthy() -> bool:
        if proc.poll() is not None:
            detail = log.read_text() if log else ""
            raise AssertionError(f"sandbox-runtime exited with {proc.returncode}: {detail}")
        try:
            return httpx.get(f"{srv.url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(healthy, 20, "sandbox-runtime /healthz")
    return srv


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("workspace")
    log = tmp_path_factory.mktemp("log") / "runtime.log"
    srv = start_server(root, log=log)
    yield srv
    srv.stop()


@pytest.fixture
def client(server: Server) -> httpx.Client:
    return server.client()


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Start extra servers with custom flags; each stops at the end of the test."""
    started: list[Server] = []

    def go(*args: str, root: Path | None = None, **kw: object) -> Server:
        r = root or (tmp_path / f"ws{len(started)}")
        r.mkdir(exist_ok=True)
        srv = start_server(r, *args, log=tmp_path / f"runtime{len(started)}.log", **kw)  # type: ignore[arg-type]
        started.append(srv)
        return srv

    yield go
    for s in started:
        s.stop()
