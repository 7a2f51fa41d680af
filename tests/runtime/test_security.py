"""Path confinement and authentication, against a real server over raw HTTP (no client-side
normalisation of `..`)."""

from __future__ import annotations

import http.client
import io
import json
import os
import tarfile
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.runtime.conftest import Server

pytestmark = pytest.mark.unit


def raw(
    server: Server, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    u = urllib.parse.urlsplit(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


@pytest.fixture(scope="module")
def outside(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory outside the root with a secret, and symlinks into it from inside the root."""
    out = tmp_path_factory.mktemp("outside")
    (out / "secret.txt").write_text("top secret")
    os.symlink(out, server.root / "link_dir")
    os.symlink(out / "secret.txt", server.root / "link_file")
    os.symlink("../" * 12 + str(out).lstrip("/"), server.root / "relative_link")
    # One created by a command running in the sandbox, as an agent would.
    with httpx.Client(base_url=server.url) as c:
        r = c.post("/execute", json={"command": f"ln -s {out} cmd_link"})
        assert r.json()["exit_code"] == 0
    (server.root / "inside.txt").write_text("fine")
    return out


ESCAPES = [
    "../secret.txt",
    "a/../../secret.txt",
    "..",
    "%2e%2e/%2e%2e/etc/passwd",
    "%2Fetc%2Fpasswd",
    "/etc/passwd",
    "inside.txt%00.png",
    "link_dir/secret.txt",
    "link_file",
    "relative_link/secret.txt",
    "cmd_link/secret.txt",
    "cmd_link",
]


def _requests(p: str) -> list[tuple[str, str, bytes | None, dict[str, str]]]:
    """Every route that takes a path, with the hostile path in it (already URL-encoded where needed)."""
    plain = urllib.parse.unquote(p)
    js = {"content-type": "application/json"}
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as t:
        info = tarfile.TarInfo("ok.txt")
        t.addfile(info, io.BytesIO(b""))
    boundary = "XbX"
    multipart = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{plain}"\r\n\r\nx\r\n'
        f"--{boundary}--\r\n"
    ).encode()
    return [
        ("GET", f"/download/{p}", None, {}),
        ("GET", f"/list/{p}", None, {}),
        ("GET", f"/exists/{p}", None, {}),
        ("GET", f"/v1/files/{p}", None, {}),
        ("HEAD", f"/v1/files/{p}", None, {}),
        ("PUT", f"/v1/files/{p}", b"pwned", {}),
        ("GET", f"/v1/stat/{p}", None, {}),
        ("GET", f"/v1/tree/{p}", None, {}),
        ("GET", f"/list?dir={urllib.parse.quote(plain)}", None, {}),
        ("GET", f"/v1/archive/{p}", None, {}),
        ("POST", f"/v1/archive/{p}", tar.getvalue(), {}),
        (
            "POST",
            "/write_b64",
            json.dumps({"path": plain + "/x" if "link" in p else plain, "content_b64": "cHduZWQ="}).encode(),
            js,
        ),
        ("POST", "/upload", multipart, {"content-type": f"multipart/form-data; boundary={boundary}"}),
        ("POST", "/v1/mkdir", json.dumps({"path": plain + "/newdir"}).encode(), js),
        ("POST", "/v1/move", json.dumps({"src": "inside.txt", "dst": plain + "/moved"}).encode(), js),
        ("POST", "/v1/exec", json.dumps({"argv": ["true"], "cwd": plain}).encode(), js),
    ]


@pytest.mark.parametrize("hostile", ESCAPES)
def test_escape_corpus_refused(server: Server, outside: Path, hostile: str) -> None:
    for method, path, body, headers in _requests(hostile):
        status, data, resp_headers = raw(server, method, path, body, headers)
        where = f"{method} {path} -> {status} {data[:200]!r}"
        assert 400 <= status < 500, where
        if method != "HEAD":
            assert resp_headers["content-type"] == "application/json", where
            err = json.loads(data)
            assert err["message"] and err["code"], where
        assert b"top secret" not in data, where
    # Nothing was written or moved outside, and the secret is untouched.
    assert sorted(x.name for x in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret"
    assert (server.root / "inside.txt").read_text() == "fine"


def test_listing_does_not_follow_outside_links(client: httpx.Client, outside: Path) -> None:
    names = {e["name"]: e for e in client.get("/v1/files/").json()["entries"]}
    assert names["link_dir"]["type"] == "file"  # shown, never followed into
    files = client.get("/list", params={"dir": ""}).json()["files"]
    assert not any(f.startswith(("link_dir/", "cmd_link/")) for f in files)
    assert "secret" not in client.get("/v1/tree/", params={"depth": 0}).text


def test_deleting_an_outside_link_removes_only_the_link(
    client: httpx.Client, server: Server, outside: Path
) -> None:
    os.symlink(outside, server.root / "doomed_link")
    assert client.delete("/v1/files/doomed_link?recursive=true").status_code == 204
    assert not os.path.lexists(server.root / "doomed_link")
    assert (outside / "secret.txt").read_text() == "top secret"


def test_tar_import_refuses_escaping_members(client: httpx.Client, outside: Path) -> None:
    def tar_with(add: Callable[[tarfile.TarFile], None]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as t:
            add(t)
        return buf.getvalue()

    def member(name: str, data: bytes = b"pwned") -> Callable[[tarfile.TarFile], None]:
        def add(t: tarfile.TarFile) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))

        return add

    def link(name: str, target: str, sym: bool = True) -> Callable[[tarfile.TarFile], None]:
        def add(t: tarfile.TarFile) -> None:
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE if sym else tarfile.LNKTYPE
            info.linkname = target
            t.addfile(info)

        return add

    cases = [
        member("../escape.txt"),
        member(str(outside / "abs.txt")),
        member("cmd_link/through.txt"),
        link("evil", str(outside)),
        link("evil2", "../../../../../../etc/passwd"),
        link("hard", str(outside / "secret.txt"), sym=False),
    ]
    for add in cases:
        r = client.post("/v1/archive/", content=tar_with(add))
        assert 400 <= r.status_code < 500, r.text
        assert r.json()["message"]
    assert sorted(x.name for x in outside.iterdir()) == ["secret.txt"]


class TestAuth:
    @pytest.fixture
    def secured(self, launch: Callable[..., Server], tmp_path: Path) -> Server:
        token_file = tmp_path / "token"
        token_file.write_text("correct-horse-battery\n")
        return launch(env={"SANDBOX_RUNTIME_TOKEN_FILE": str(token_file)}, token="correct-horse-battery")

    def test_health_is_open_everything_else_needs_the_token(self, secured: Server) -> None:
        anon = httpx.Client(base_url=secured.url)
        for path in ("/", "/healthz", "/v1/health"):
            assert anon.get(path).status_code == 200
        for method, path in [
            ("GET", "/v1/files/"),
            ("POST", "/execute"),
            ("GET", "/openapi.json"),
            ("GET", "/metrics"),
            ("GET", "/list?dir="),
        ]:
            r = anon.request(method, path, json={"command": "true"})
            assert r.status_code == 401, (method, path)
            assert r.json()["code"] == "UNAUTHENTICATED" and r.headers["www-authenticate"] == "Bearer"
        wrong = anon.get("/v1/files/", headers={"Authorization": "Bearer correct-horse-batterY"})
        assert wrong.status_code == 401
        assert anon.get("/v1/files/", headers={"Authorization": "correct-horse-battery"}).status_code == 401
        ok = secured.client().post("/execute", json={"command": "echo ok"})
        assert ok.status_code == 200 and ok.json()["stdout"] == "ok\n"
        anon.close()

    def test_token_header_for_clients_behind_the_api_server_proxy(self, secured: Server) -> None:
        # The kube-apiserver's pod proxy strips Authorization, so the token also travels in its own header.
        anon = httpx.Client(base_url=secured.url)
        header = "X-Sandbox-Runtime-Token"
        assert anon.get("/v1/files/", headers={header: "correct-horse-battery"}).status_code == 200
        for wrong in ("correct-horse-batterY", "Bearer correct-horse-battery", ""):
            r = anon.get("/v1/files/", headers={header: wrong})
            assert r.status_code == 401 and r.json()["code"] == "UNAUTHENTICATED", wrong
        assert anon.get("/v1/files/").status_code == 401
        # Either credential is enough: a foreign Authorization (the API server's own) does not shadow it.
        both = {header: "correct-horse-battery", "Authorization": "Bearer something-else"}
        assert anon.get("/v1/files/", headers=both).status_code == 200
        anon.close()

    def test_flag_and_env_token_sources(self, launch: Callable[..., Server], tmp_path: Path) -> None:
        f = tmp_path / "flag-token"
        f.write_text("from-flag")
        by_flag = launch("--token-file", str(f), token="from-flag")
        assert httpx.get(f"{by_flag.url}/v1/files/").status_code == 401
        assert by_flag.client().get("/v1/files/").status_code == 200
        by_env = launch(env={"SANDBOX_RUNTIME_TOKEN": "from-env"}, token="from-env")
        assert (
            httpx.get(f"{by_env.url}/v1/files/", headers={"Authorization": "Bearer from-flag"}).status_code
            == 401
        )
        assert by_env.client().get("/v1/files/").status_code == 200


def test_oversized_json_body_is_413(client: httpx.Client) -> None:
    r = client.post(
        "/execute", content=b"x" * (65 * 1024 * 1024), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["code"] == "RESOURCE_EXHAUSTED"


def test_malformed_requests_get_json_errors(server: Server) -> None:
    for method, path, body in [
        ("POST", "/execute", b"{not json"),
        ("POST", "/v1/exec", b"[]"),
        ("POST", "/upload", b"junk"),
        ("GET", "/v1/tree/?depth=-1", None),
    ]:
        status, data, headers = raw(server, method, path, body, {"content-type": "application/json"})
        assert 400 <= status < 500 and headers["content-type"] == "application/json", (path, status, data)
        assert json.loads(data)["message"]


@pytest.mark.parametrize("content", [None, ""])
def test_unreadable_or_empty_token_file_fails_clearly(tmp_path: Path, content: str | None) -> None:
    import subprocess
    import sys

    token = tmp_path / "token"
    if content is not None:
        token.write_text(content)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_RUNTIME_")}
    env["SANDBOX_RUNTIME_TOKEN_FILE"] = str(token)
    r = subprocess.run(
        [sys.executable, "-m", "sandbox_runtime", "--root", str(tmp_path / "ws"), "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "token file" in r.stderr and "Traceback" not in r.stderr
