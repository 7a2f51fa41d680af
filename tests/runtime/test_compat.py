"""The exact request shapes of the clients that already exist: agent-sandbox's SDK (legacy runtime and
sandboxd modes) and Amicable's runtime backend."""

from __future__ import annotations

import base64
import urllib.parse
from datetime import datetime

import httpx
import pytest

from tests.runtime.conftest import Server

pytestmark = pytest.mark.unit


def q(path: str) -> str:
    # Both SDK modes quote the whole path with safe='' (slashes become %2F).
    return urllib.parse.quote(path, safe="")


class TestLegacyRuntime:
    def test_health(self, client: httpx.Client) -> None:
        r = client.get("/")
        assert r.status_code == 200 and r.json()["status"] == "ok"

    def test_execute_splits_without_shell(self, client: httpx.Client, server: Server) -> None:
        r = client.post("/execute", json={"command": "echo 'a  b' $HOME \"c;d\""})
        assert r.status_code == 200
        body = r.json()
        assert set(body) >= {"stdout", "stderr", "exit_code"}
        # No shell: quoting is honoured, $HOME and ; are not interpreted.
        assert body == {"stdout": "a  b $HOME c;d\n", "stderr": "", "exit_code": 0, "timed_out": False}

    def test_execute_runs_in_root_and_sh_c_works(self, client: httpx.Client, server: Server) -> None:
        r = client.post("/execute", json={"command": "sh -c 'pwd; echo err >&2; exit 7'"})
        body = r.json()
        assert body["stdout"].strip() == str(server.root.resolve())
        assert body["stderr"] == "err\n"
        assert body["exit_code"] == 7

    def test_execute_unknown_program(self, client: httpx.Client) -> None:
        body = client.post("/execute", json={"command": "no-such-program-xyz"}).json()
        assert body["exit_code"] == 127 and "no-such-program-xyz" in body["stderr"]

    def test_execute_timeout_seconds(self, client: httpx.Client) -> None:
        body = client.post("/execute", json={"command": "sleep 30", "timeout_seconds": 0.5}).json()
        assert body["timed_out"] is True and body["exit_code"] != 0

    def test_execute_bad_quoting_is_a_clear_400(self, client: httpx.Client) -> None:
        r = client.post("/execute", json={"command": "echo 'unterminated"})
        assert r.status_code == 400 and "split" in r.json()["message"]

    def test_upload_download_list_exists(self, client: httpx.Client, server: Server) -> None:
        # Exactly what Filesystem.write sends: files={'file': (path, content)}
        r = client.post("/upload", files={"file": ("docs/notes.txt", b"hello legacy")})
        assert r.status_code == 200, r.text
        assert r.json()["message"] == "File 'docs/notes.txt' uploaded successfully."
        assert (server.root / "docs/notes.txt").read_bytes() == b"hello legacy"

        r = client.get(f"/download/{q('docs/notes.txt')}")
        assert r.status_code == 200 and r.content == b"hello legacy"
        assert r.headers["content-type"] == "application/octet-stream"

        entries = client.get(f"/list/{q('docs')}").json()
        assert [e["name"] for e in entries] == ["notes.txt"]
        (e,) = entries
        assert e["size"] == 12 and e["type"] == "file"
        # The SDK reads mod_time as a float POSIX timestamp.
        assert abs(datetime.now().timestamp() - float(e["mod_time"])) < 3600

        assert client.get(f"/exists/{q('docs/notes.txt')}").json() == {"exists": True}
        assert client.get(f"/exists/{q('docs/missing.txt')}").json() == {"exists": False}
        # list(".") arrives as GET /list: HTTP clients drop the dot segment.
        listing = client.get(f"/list/{q('.')}").json()
        docs = next(x for x in listing if x["name"] == "docs")
        assert docs["type"] == "directory"

    def test_download_missing_is_404_json(self, client: httpx.Client) -> None:
        r = client.get("/download/nope.txt")
        assert r.status_code == 404 and r.json()["message"] == "File not found"


class TestSandboxd:
    def test_health_and_metadata(self, client: httpx.Client, server: Server) -> None:
        assert client.get("/v1/health").json()["status"] == "ok"
        meta = client.get("/v1/metadata").json()
        assert isinstance(meta["env"], dict) and meta["root"] == str(server.root.resolve())

    def test_put_get_head_delete(self, client: httpx.Client, server: Server) -> None:
        path = "workspace/src/main.py"
        r = client.put(
            f"/v1/files/{q(path)}",
            content=b"print(1)\n",
            headers={"Content-Type": "application/octet-stream"},
            params={"mode": "0755"},
        )
        assert r.status_code == 204
        on_disk = server.root / path
        assert on_disk.read_bytes() == b"print(1)\n" and on_disk.stat().st_mode & 0o777 == 0o755
        assert client.get(f"/v1/files/{q(path)}").content == b"print(1)\n"
        assert client.head(f"/v1/files/{q(path)}").status_code == 200
        assert client.head(f"/v1/files/{q('workspace/none')}").status_code == 404

        listing = client.get(f"/v1/files/{q('workspace/src')}").json()
        (entry,) = listing["entries"]
        assert entry["name"] == "main.py" and entry["type"] == "file" and entry["size"] == 9
        assert entry["mode"] == "0755"
        datetime.fromisoformat(entry["modified_at"].replace("Z", "+00:00"))

        # Non-empty directory: 409 without recursive, 204 with it.
        r = client.delete(f"/v1/files/{q('workspace')}")
        assert r.status_code == 409 and r.json()["code"] == "CONFLICT"
        assert client.delete(f"/v1/files/{q('workspace')}?recursive=true").status_code == 204
        assert not (server.root / "workspace").exists()
        assert client.delete(f"/v1/files/{q('workspace')}").status_code == 404

    def test_put_is_atomic_overwrite_and_multipart(self, client: httpx.Client, server: Server) -> None:
        client.put("/v1/files/over.txt", content=b"first version, longer")
        client.put("/v1/files/over.txt", files={"file": ("ignored-name", b"second")})
        assert (server.root / "over.txt").read_bytes() == b"second"
        assert not [p for p in server.root.iterdir() if p.name.startswith(".sr-upload-")]

    def test_bad_mode_is_400(self, client: httpx.Client) -> None:
        r = client.put("/v1/files/m.txt", content=b"x", params={"mode": "999"})
        assert r.status_code == 400 and r.json()["code"] == "INVALID_ARGUMENT"

    def test_ranged_read(self, client: httpx.Client) -> None:
        client.put("/v1/files/range.bin", content=bytes(range(256)))
        r = client.get("/v1/files/range.bin", headers={"Range": "bytes=10-19"})
        assert r.status_code == 206 and r.content == bytes(range(10, 20))
        assert r.headers["content-range"] == "bytes 10-19/256"
        assert client.get("/v1/files/range.bin", params={"offset": 250}).content == bytes(range(250, 256))


class TestAmicable:
    def test_exec_and_execute_same_shape(self, client: httpx.Client) -> None:
        for endpoint in ("/exec", "/execute"):
            body = client.post(endpoint, json={"command": "sh -c 'echo $((1+2)) && echo oops >&2'"}).json()
            assert body["stdout"] == "3\n" and body["stderr"] == "oops\n" and body["exit_code"] == 0

    def test_write_b64_list_download(self, client: httpx.Client, server: Server) -> None:
        files = {
            "src/App.tsx": b"export default 1\n",
            "src/lib/util.ts": b"\x00\x01binary",
            "README.md": b"# r",
        }
        for path, data in files.items():
            r = client.post("/write_b64", json={"path": path, "content_b64": base64.b64encode(data).decode()})
            assert r.status_code == 200, r.text
        (server.root / "src/node_modules/pkg").mkdir(parents=True)
        (server.root / "src/node_modules/pkg/index.js").write_text("x")
        listed = client.get("/list", params={"dir": "src"}).json()
        assert listed == {"files": ["src/App.tsx", "src/lib/util.ts"]}
        for path, data in files.items():
            assert client.get(f"/download/{path}").content == data

    def test_write_b64_rejects_bad_base64(self, client: httpx.Client) -> None:
        r = client.post("/write_b64", json={"path": "x.txt", "content_b64": "not base64!!"})
        assert r.status_code == 400 and "base64" in r.json()["message"]

    def test_healthz(self, client: httpx.Client) -> None:
        assert client.get("/healthz").json() == {"status": "ok"}
