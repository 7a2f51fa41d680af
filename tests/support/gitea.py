"""A real Gitea on a loopback port, for tests: the pinned binary started through the image's entrypoint.

    with GiteaServer(tmp_path / "gitea") as gitea:
        gitea.api("GET", "/user")                       # as the admin (basic auth)
        token = gitea.create_token("push", ["write:repository"])
        subprocess.run(["git", "push", gitea.clone_url("org/repo", token=token), "main"], check=True)

The binary is ${SHADOW_CACHE}/bin/gitea and its templates/options/public are
${SHADOW_CACHE}/share/gitea-<GITEA_VERSION>, both from `hack/build-tools.sh gitea`. The server runs
images/gitea/gitea-start.sh, so tests exercise the same configuration, migration and admin bootstrap as the
image. Everything Gitea stores lives in `data_dir`; starting again on the same directory is a restart.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support.controlplane import DEFAULT_BIN_DIR, DEFAULT_CACHE, free_port, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
START_SCRIPT = REPO_ROOT / "images" / "gitea" / "gitea-start.sh"
BUILD_HINT = "build it with `hack/build-tools.sh gitea` (or `make tools`)"


def pinned_version() -> str:
    """GITEA_VERSION from hack/versions.env (e.g. "v1.27.3")."""
    for line in (REPO_ROOT / "hack" / "versions.env").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "GITEA_VERSION":
            return value.strip()
    raise GiteaError("GITEA_VERSION is not pinned in hack/versions.env")


def default_binary() -> Path:
    return DEFAULT_BIN_DIR / "gitea"


def default_static_root() -> Path:
    return DEFAULT_CACHE / "share" / f"gitea-{pinned_version()}"


def missing_tools() -> str | None:
    """Why the pinned Gitea cannot be started here, or None when it can."""
    binary, share = default_binary(), default_static_root()
    if not os.access(binary, os.X_OK):
        return f"{binary} is missing: {BUILD_HINT}"
    if not (share / "templates").is_dir():
        return f"{share} is missing: {BUILD_HINT}"
    return None


class _Admin:
    def __repr__(self) -> str:
        return "AS_ADMIN"


AS_ADMIN = _Admin()
# (user, password) for basic auth, a token string, None for anonymous, or AS_ADMIN.
Auth = tuple[str, str] | str | None | _Admin


class GiteaError(RuntimeError):
    """Gitea could not be started or answered unexpectedly; messages carry the tail of its log."""


@dataclass
class GiteaServer:
    """One Gitea process. `start()`/`stop()` (or `with`) may be repeated: the data directory persists."""

    data_dir: Path
    admin_username: str = "shadow-admin"
    admin_password: str = field(default_factory=lambda: secrets.token_urlsafe(18), repr=False)
    admin_email: str | None = None
    # 0 picks a free loopback port at the first start; restarts keep it unless it is changed.
    port: int = 0
    binary: Path = field(default_factory=default_binary)
    static_root: Path = field(default_factory=default_static_root)
    start_timeout: float = 60.0
    # Extra environment for gitea-start.sh (e.g. GITEA__section__KEY settings).
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @classmethod
    def standing_in(cls, data_dir: Path, admin: Mapping[str, str], port: int) -> GiteaServer:
        """The Gitea an environment's reconciler expects on `port`, with the admin credentials it wrote into
        the environment's `<name>-gitea-admin` Secret (`admin`: that Secret's data)."""
        return cls(data_dir, admin_username=admin["username"], admin_password=admin["password"], port=port)

    # ---- addresses ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """Base URL with a trailing slash, e.g. http://127.0.0.1:41234/."""
        return f"http://127.0.0.1:{self.port}/"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "gitea.log"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "conf" / "app.ini"

    def clone_url(self, repo: str, *, username: str | None = None, token: str | None = None) -> str:
        """HTTP clone URL of "owner/name"; with a token, authenticated as `username` (default: the admin)."""
        if token is None:
            return f"{self.url}{repo}.git"
        user = urllib.parse.quote(username or self.admin_username, safe="")
        return f"http://{user}:{urllib.parse.quote(token, safe='')}@127.0.0.1:{self.port}/{repo}.git"

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> GiteaServer:
        if self.running:
            return self
        for path, what in (
            (self.binary, "gitea binary"),
            (self.static_root / "templates", "gitea share dir"),
        ):
            if not path.exists():
                raise GiteaError(f"{what} {path} is missing: {BUILD_HINT}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        env = {
            **os.environ,
            **self.env,
            "GITEA_BIN": str(self.binary),
            "GITEA_DATA": str(self.data_dir),
            "GITEA_STATIC_ROOT": str(self.static_root),
            "GITEA_HTTP_ADDR": "127.0.0.1",
            "GITEA_HTTP_PORT": str(self.port),
            "GITEA_ROOT_URL": self.url,
            "GITEA_ADMIN_USERNAME": self.admin_username,
            "GITEA_ADMIN_PASSWORD": self.admin_password,
            "GITEA_ADMIN_EMAIL": self.admin_email or f"{self.admin_username}@shadow.local",
        }
        with self.log_path.open("ab") as log:
            # Own session: stop() signals Gitea and the git processes it runs. The kernel kills the server
            # if the test process dies without stopping it.
            self.process = subprocess.Popen(
                ["/bin/sh", str(START_SCRIPT)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.data_dir,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to the process group, then SIGKILL after `timeout` seconds."""
        proc, self.process = self.process, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        # Leftover children of the group (git) go too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def restart(self) -> GiteaServer:
        self.stop()
        return self.start()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> GiteaServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            assert self.process is not None
            code = self.process.poll()
            if code is not None:
                raise GiteaError(
                    f"gitea exited with {code} during start-up; {self.log_path}:\n{self.log_tail()}"
                )
            try:
                status, _ = self.request("GET", "api/healthz", auth=None, timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise GiteaError(
                    f"gitea not healthy after {self.start_timeout:.0f}s; {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    # ---- HTTP --------------------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        auth: Auth = AS_ADMIN,
        timeout: float = 30,
    ) -> tuple[int, Any]:
        """(status, decoded JSON or text or None) for `path` under `url`, as the admin by default."""
        headers = {"Accept": "application/json"}
        if isinstance(auth, _Admin):
            auth = (self.admin_username, self.admin_password)
        if isinstance(auth, tuple):
            raw = f"{auth[0]}:{auth[1]}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(raw).decode()
        elif isinstance(auth, str):
            headers["Authorization"] = f"token {auth}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path.lstrip("/"), data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, _decode(resp.read(), resp.headers.get_content_type())
        except urllib.error.HTTPError as err:
            return err.code, _decode(err.read(), err.headers.get_content_type())

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        auth: Auth = AS_ADMIN,
        expect: int | tuple[int, ...] = (200, 201, 204),
    ) -> Any:
        """Call /api/v1/<path> (as the admin by default) and return the decoded body; raise on another status."""
        status, result = self.request(method, "api/v1/" + path.lstrip("/"), body=body, auth=auth)
        allowed = (expect,) if isinstance(expect, int) else expect
        if status not in allowed:
            raise GiteaError(f"{method} /api/v1/{path.lstrip('/')} -> {status}: {result}")
        return result

    def wait_pushed(self, repo: str, timeout: float = 90.0) -> None:
        """Wait until Gitea has processed the first push to the empty repository "owner/name".

        Pushes are indexed asynchronously: until then the repository reads as empty and Gitea 1.27.3 answers
        GET /repos/{owner}/{repo}/branches/{branch} with a 500 (nil git repository).
        """
        wait_for(
            lambda: not self.api("GET", f"repos/{repo}")["empty"],
            timeout=timeout,
            what=f"gitea to process the push to {repo}",
        )

    def create_token(self, name: str, scopes: list[str], *, username: str | None = None) -> str:
        """A new access token for the admin (or `username`, with the admin's rights to do so)."""
        user = username or self.admin_username
        token = self.api("POST", f"users/{user}/tokens", {"name": name, "scopes": scopes})
        return str(token["sha1"])


def _decode(raw: bytes, content_type: str) -> Any:
    if not raw:
        return None
    if content_type == "application/json":
        return json.loads(raw)
    return raw.decode(errors="replace")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process dies (survives exec into gitea)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
