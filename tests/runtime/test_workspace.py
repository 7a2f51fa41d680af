"""Baseline & diff, tar.gz export/import, the command journal and HANDOFF.md, PTY, metrics, file ops."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from tests.runtime.conftest import Server, wait_until

pytestmark = pytest.mark.unit


def test_baseline_and_diff(launch: Callable[..., Server]) -> None:
    srv = launch()
    c = srv.client()
    root = srv.root
    (root / "src").mkdir()
    (root / "src/keep.py").write_text("same\n")
    (root / "src/edit.py").write_text("line1\nline2\n")
    (root / "src/gone.txt").write_text("bye\n")
    (root / "img.bin").write_bytes(b"\x00\x01\x02")
    (root / "node_modules/x").mkdir(parents=True)
    (root / "node_modules/x/i.js").write_text("1")
    assert c.get("/v1/diff").status_code == 404
    info = c.post("/v1/baseline", json={}).json()
    assert info["files"] == 4 and info["exclude"] == ["node_modules/", ".git/"]

    assert c.get("/v1/diff").json()["files"] == []
    (root / "src/edit.py").write_text("line1\nline2 changed\n")
    (root / "src/gone.txt").unlink()
    (root / "src/new.py").write_text("print('new')\n")
    (root / "img.bin").write_bytes(b"\x00\x01\x03")
    (root / "node_modules/x/i.js").write_text("2")  # excluded
    # Same content rewritten (new mtime) is not a modification.
    (root / "src/keep.py").write_text("same\n")

    d = c.get("/v1/diff").json()
    assert d["added"] == ["src/new.py"]
    assert d["modified"] == ["img.bin", "src/edit.py"]
    assert d["deleted"] == ["src/gone.txt"]
    binary = {f["path"]: f["binary"] for f in d["files"]}
    assert binary == {"src/new.py": False, "img.bin": True, "src/edit.py": False, "src/gone.txt": False}
    patch = d["patch"]
    assert "--- a/src/edit.py\n+++ b/src/edit.py\n" in patch and "-line2\n+line2 changed\n" in patch
    assert "Binary files a/img.bin and b/img.bin differ" in patch
    assert "--- /dev/null\n+++ b/src/new.py\n" in patch and "+++ /dev/null" in patch
    only = c.get("/v1/diff", params={"paths_only": True}).json()
    assert only.get("patch") is None and only["modified"] == ["img.bin", "src/edit.py"]
    # The text part of the patch is a real unified diff: `git apply -R` restores the baseline.
    text_patch = "".join("diff --git " + p for p in patch.split("diff --git ") if p and "Binary" not in p)
    (root / "p.diff").write_text(text_patch)
    res = c.post("/v1/exec", json={"argv": ["git", "apply", "-R", "--unsafe-paths", "p.diff"]}).json()
    assert res["exit_code"] == 0, res
    assert (root / "src/edit.py").read_text() == "line1\nline2\n"
    assert (root / "src/gone.txt").read_text() == "bye\n" and not (root / "src/new.py").exists()


def test_archive_export_excludes_and_import_roundtrip(launch: Callable[..., Server], tmp_path: Path) -> None:
    src = launch()
    dst = launch()
    root = src.root
    (root / "app/src").mkdir(parents=True)
    (root / "app/src/main.ts").write_text("console.log(1)\n")
    (root / "app/run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "app/run.sh", 0o755)
    (root / "app/node_modules/dep").mkdir(parents=True)
    (root / "app/node_modules/dep/big.js").write_text("x" * 1000)
    (root / "app/debug.log").write_text("noise")
    os.symlink("src/main.ts", root / "app/link.ts")
    (root / "app/empty").mkdir()

    with src.client().stream("GET", "/v1/archive/app", params={"exclude": ["node_modules/", "*.log"]}) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/gzip"
        data = b"".join(r.iter_bytes())
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        names = tf.getnames()
    assert sorted(names) == ["empty", "link.ts", "run.sh", "src", "src/main.ts"]

    r = dst.client().post("/v1/archive/copy", content=data)
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "copy", "files": 2, "bytes": len("console.log(1)\n") + len("#!/bin/sh\n")}
    assert (dst.root / "copy/src/main.ts").read_text() == "console.log(1)\n"
    assert os.readlink(dst.root / "copy/link.ts") == "src/main.ts"
    assert os.stat(dst.root / "copy/run.sh").st_mode & 0o777 == 0o755
    assert (dst.root / "copy/empty").is_dir()

    # Import-side excludes, and a plain (not gzip'd) tar.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name in ("keep.txt", "node_modules/a.js"):
            info = tarfile.TarInfo(name)
            info.size = 2
            t.addfile(info, io.BytesIO(b"ok"))
    r = dst.client().post("/v1/archive/", content=buf.getvalue(), params={"exclude": ["node_modules/"]})
    assert r.json()["files"] == 1 and not (dst.root / "node_modules").exists()
    assert dst.client().post("/v1/archive/", content=b"definitely not a tar").status_code == 400


def test_journal_records_persists_and_maintains_handoff(
    launch: Callable[..., Server], tmp_path: Path
) -> None:
    root = tmp_path / "journal-ws"
    root.mkdir()
    srv = launch("--handoff", "--heartbeat", "0.2", root=root)
    c = srv.client()
    c.post("/execute", json={"command": "ls"})
    c.post("/exec", json={"command": "sh -c 'echo boom >&2; exit 2'"})
    c.post("/v1/exec", json={"command": "git commit -m 'x' 2>/dev/null || true"})
    c.post("/v1/exec", json={"command": "echo build ok  # npm run build"})
    c.post("/v1/journal/decisions", json={"text": "Use Vite instead of webpack", "author": "agent"})

    entries = c.get("/v1/journal").json()["entries"]
    assert [e["kind"] for e in entries] == ["command", "error", "success", "success", "decision"]
    err = entries[1]
    assert err["command"] == "echo boom >&2; exit 2" and err["exit_code"] == 2 and err["stderr"] == "boom\n"
    assert "nonzero-exit" in err["reasons"] and err["cwd"] == "."
    assert "git-commit" in entries[2]["reasons"]
    sig = c.get("/v1/journal", params={"significant": True}).json()["entries"]
    assert [e["seq"] for e in sig] == [2, 3, 4, 5]

    def handoff() -> str:
        p = root / "HANDOFF.md"
        return p.read_text() if p.exists() else ""

    wait_until(lambda: "Last heartbeat" in handoff(), 10, "heartbeat in HANDOFF.md")
    text = handoff()
    errors = text.split("## Debugging History")[1].split("\n## ")[0]
    assert "Command failed with exit code 2" in errors and "boom" in errors
    done = text.split("## Completed This Session")[1].split("\n## ")[0]
    assert "git commit" in done
    assert "Use Vite instead of webpack" in text.split("## Decision Log")[1]
    assert text.count("<!-- heartbeat -->") == 1

    # A follower sees new entries as they happen.
    seen: list[dict[str, object]] = []

    def follow() -> None:
        with (
            httpx.Client(base_url=srv.url, timeout=20) as fc,
            fc.stream("GET", "/v1/journal", params={"follow": True, "since": 5}) as r,
        ):
            for line in r.iter_lines():
                seen.append(json.loads(line))
                return

    t = threading.Thread(target=follow)
    t.start()
    c.post("/v1/exec", json={"argv": ["sh", "-c", "exit 4"]})
    t.join(20)
    assert seen and seen[0]["seq"] == 6 and seen[0]["exit_code"] == 4

    # Restart: nothing is lost and numbering continues.
    srv.stop()
    again = launch(root=root)
    c2 = again.client()
    assert [e["seq"] for e in c2.get("/v1/journal").json()["entries"]] == [1, 2, 3, 4, 5, 6]
    c2.post("/execute", json={"command": "true"})
    assert c2.get("/v1/journal").json()["last_seq"] == 7


def test_pty_over_websocket_with_resize(server: Server) -> None:
    url = server.url.replace("http://", "ws://") + "/v1/pty?cols=100&rows=30&shell=/bin/sh"
    with connect(url, open_timeout=10) as ws:
        ws.send(b"stty size; echo mark-$((6*7))\n")
        out = b""
        while b"mark-42" not in out or b"30 100" not in out:
            out += ws.recv(timeout=10)  # type: ignore[operator]
        ws.send(json.dumps({"type": "resize", "cols": 132, "rows": 50}))
        ws.send(b"stty size\n")
        while b"50 132" not in out:
            out += ws.recv(timeout=10)  # type: ignore[operator]
        ws.send(b"exit 3\n")
        final = None
        while final is None:
            msg = ws.recv(timeout=10)
            if isinstance(msg, str):
                final = json.loads(msg)
    assert final == {"type": "exit", "exit_code": 3}


def test_pty_requires_token_when_set(launch: Callable[..., Server]) -> None:
    srv = launch(env={"SANDBOX_RUNTIME_TOKEN": "tok"}, token="tok")
    url = srv.url.replace("http://", "ws://") + "/v1/pty"
    with pytest.raises(Exception), connect(url, open_timeout=5) as ws:  # noqa: B017 - refused handshake
        ws.recv(timeout=5)
    with connect(url, open_timeout=5, additional_headers={"Authorization": "Bearer tok"}) as ws:
        ws.send(b"echo authed\n")
        out = b""
        while b"authed\r\n" not in out:
            out += ws.recv(timeout=10)  # type: ignore[operator]
    # Browsers cannot set headers on a WebSocket: the token may come as a subprotocol.
    with connect(url, open_timeout=5, subprotocols=["bearer.tok"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "bearer.tok"
        ws.send(b"echo viaproto\n")
        out = b""
        while b"viaproto\r\n" not in out:
            out += ws.recv(timeout=10)  # type: ignore[operator]


@pytest.mark.skipif(shutil.which("bash") is None, reason="the shell journal hooks bash")
def test_commands_typed_in_the_terminal_are_journaled_one_by_one(
    launch: Callable[..., Server], tmp_path: Path
) -> None:
    root = tmp_path / "typed"
    root.mkdir()
    srv = launch("--handoff", root=root)
    url = srv.url.replace("http://", "ws://") + "/v1/pty?shell=" + str(shutil.which("bash"))
    with connect(url, open_timeout=10) as ws:
        for line in (b"mkdir sub && cd sub", b"", b"ls /nonexistent-dir", b"echo done-$((6*7))"):
            ws.send(line + b"\n")
        out = b""
        while b"done-42" not in out:
            out += ws.recv(timeout=10)  # type: ignore[operator]

        def typed() -> list[dict[str, object]]:
            entries = srv.client().get("/v1/journal").json()["entries"]
            return [e for e in entries if e.get("api") == "pty"]

        wait_until(lambda: len(typed()) == 3, 10, "three typed commands journaled")
        ws.send(b"exit\n")
    first, failed, last = typed()
    assert (first["command"], first["exit_code"], first["cwd"]) == ("mkdir sub && cd sub", 0, "sub")
    assert (failed["command"], failed["exit_code"], failed["kind"]) == ("ls /nonexistent-dir", 2, "error")
    assert last["command"] == "echo done-$((6*7))" and last["exit_code"] == 0  # the empty line is no command
    assert "ls /nonexistent-dir" in (root / "HANDOFF.md").read_text()  # significant: into HANDOFF.md


def test_the_shell_journal_reads_only_well_formed_bounded_records() -> None:
    from sandbox_runtime.shell_journal import MAX_RECORD, ShellJournal

    recorded: list[dict[str, object]] = []

    class Journal:
        def record_command(self, **entry: object) -> None:
            recorded.append(entry)

    sink = ShellJournal(Journal(), "/bin/bash")  # type: ignore[arg-type]
    assert sink.feed(b"0\t/w\tmake\0x\tbad\0-1\t/w\tneg\0" + b"1\t/w\tpart") == 1
    assert sink.feed(b"ial\0") == 1 and [e["argv"] for e in recorded] == [
        ["/bin/bash", "-c", c] for c in ("make", "partial")
    ]
    assert sink.feed(b"0\t/w\t" + b"y" * (MAX_RECORD + 1)) == 0 and sink.pending == b""  # never ends: dropped
    assert sink.feed(b"\0" + b"0\t/w\tok\0") == 1


def test_metrics_exposed(client: httpx.Client) -> None:
    client.post("/execute", json={"command": "true"})
    client.get("/download/does-not-exist")
    text = client.get("/metrics").text
    assert 'sandbox_runtime_exec_total{api="execute",outcome="ok"}' in text
    assert (
        'sandbox_runtime_request_duration_seconds_count{method="POST",route="/execute",status="200"}' in text
    )
    assert 'route="/download/{path:path}",status="404"' in text
    assert (
        "sandbox_runtime_exec_duration_seconds_bucket" in text
        and "sandbox_runtime_bytes_received_total" in text
    )


def test_native_file_ops(client: httpx.Client, server: Server) -> None:
    assert client.post("/v1/mkdir", json={"path": "ops/a/b"}).json() == {"path": "ops/a/b"}
    client.put("/v1/files/ops/a/b/f.txt", content=b"12345")
    client.put("/v1/files/ops/.hidden", content=b"h")
    st = client.get("/v1/stat/ops/a/b/f.txt").json()
    assert st["type"] == "file" and st["size"] == 5 and st["path"] == "ops/a/b/f.txt"
    tree = client.get("/v1/tree/ops", params={"depth": 0}).json()["entries"]
    assert [e["path"] for e in tree] == ["ops/.hidden", "ops/a", "ops/a/b", "ops/a/b/f.txt"]
    shallow = client.get("/v1/tree/ops", params={"depth": 1, "hidden": False}).json()["entries"]
    assert [e["path"] for e in shallow] == ["ops/a"]
    globbed = client.get("/v1/tree/ops", params={"depth": 0, "glob": "*.txt"}).json()["entries"]
    assert [e["path"] for e in globbed] == ["ops/a/b/f.txt"]
    r = client.post("/v1/move", json={"src": "ops/a/b/f.txt", "dst": "ops/moved.txt"})
    assert r.json() == {"src": "ops/a/b/f.txt", "dst": "ops/moved.txt"}
    client.put("/v1/files/ops/other.txt", content=b"o")
    r = client.post("/v1/move", json={"src": "ops/other.txt", "dst": "ops/moved.txt"})
    assert r.status_code == 409
    assert client.post(
        "/v1/move", json={"src": "ops/other.txt", "dst": "ops/moved.txt", "overwrite": True}
    ).is_success
    assert (server.root / "ops/moved.txt").read_bytes() == b"o"
    assert client.post("/v1/move", json={"src": "ops/a", "dst": "ops/a/inside"}).status_code == 400
    assert client.post("/v1/mkdir", json={"path": "ops/a", "parents": False}).status_code == 409
