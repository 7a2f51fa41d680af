"""Archive import through the real endpoint, on the venv's Python and on Debian's python3 (the workspace
image's, 3.11.2, without tarfile extraction filters): nothing escapes the destination, excludes hold for
every spelling of a name, a refused archive changes nothing, and every upload path is bounded."""

from __future__ import annotations

import io
import os
import tarfile
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import DEBIAN_PYTHON, Server, debian_python_runs_this_venv, start_server

pytestmark = pytest.mark.unit

Member = tuple[
    str, ...
]  # ("file", name, data) | ("dir", name) | ("sym", name, target) | ("hard", name, target)


def tar_of(*members: Member, gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w", format=tarfile.PAX_FORMAT) as t:
        for kind, name, *rest in members:
            info = tarfile.TarInfo(name)
            data = b""
            if kind == "file":
                data = rest[0].encode()
                info.size = len(data)
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            else:
                info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                info.linkname = rest[0]
            t.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def snapshot(top: Path) -> dict[str, Any]:
    """Every entry under `top` but the runtime's state, with its type, mode and content or link target."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        if dirpath == str(top) and ".sandbox-runtime" in dirnames:
            dirnames.remove(".sandbox-runtime")
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            if p.is_symlink():
                out[str(p.relative_to(top))] = ("link", os.readlink(p))
            elif p.is_dir():
                out[str(p.relative_to(top))] = ("dir", st.st_mode)
            else:
                out[str(p.relative_to(top))] = ("file", st.st_mode, st.st_ino, p.read_bytes())
    return out


@pytest.fixture(params=["venv", "debian"])
def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """A runtime whose root sits inside a sentinel tree (`tmp_path`), on either interpreter."""
    python = None
    if request.param == "debian":
        if not debian_python_runs_this_venv():
            pytest.skip(f"{DEBIAN_PYTHON} is not this venv's Python version: the fuzz covers it in-process")
        python = DEBIAN_PYTHON
    (tmp_path / "secret.txt").write_text("outside\n")
    root = tmp_path / "ws"
    root.mkdir()
    srv = start_server(root, log=tmp_path / "runtime.log", **({"python": python} if python else {}))
    yield srv
    srv.stop()


def outside(srv: Server) -> dict[str, Any]:
    snap = snapshot(srv.root.parent)
    return {k: v for k, v in snap.items() if not k.startswith("ws") and k != "runtime.log"}


def test_dot_prefixed_symlink_chain_cannot_write_outside(runtime: Server) -> None:
    before, c = outside(runtime), runtime.client()
    chain = (("sym", "./.a", "."), ("sym", "./.a/.b", ".."))
    for members in [
        (*chain, ("file", "./.a/.b/escaped.txt", "pwned")),
        (("sym", "./.a", "."), ("sym", "./.b", ".a/..")),  # leads out only once .a exists
        (("sym", "./.b", ".a/.."), ("sym", "./.a", ".")),  # the same, link order reversed
    ]:
        r = c.post("/v1/archive/", content=tar_of(*members))
        assert r.status_code == 400, r.text
        assert "refused archive member" in r.json()["message"]
    assert outside(runtime) == before
    assert snapshot(runtime.root) == {}


def test_hard_links_cannot_expose_an_outside_file(runtime: Server) -> None:
    c = runtime.client()
    chain = (("sym", "./.a", "."), ("sym", "./.a/.b", ".."))
    for members in [
        (*chain, ("hard", "./h", ".a/.b/secret.txt")),
        (("hard", "h", "../secret.txt"),),
        (("hard", "h", str(runtime.root.parent / "secret.txt")),),
        (("sym", "s", "."), ("hard", "h", "s/../secret.txt")),
    ]:
        assert c.post("/v1/archive/", content=tar_of(*members)).status_code == 400
    assert snapshot(runtime.root) == {}
    # A hard link to a file earlier in the same archive is fine.
    r = c.post("/v1/archive/", content=tar_of(("file", "a.txt", "x"), ("hard", "./b.txt", "a.txt")))
    assert r.status_code == 200, r.text
    assert os.path.samefile(runtime.root / "a.txt", runtime.root / "b.txt")


@pytest.mark.parametrize(
    "member",
    [
        ("file", ".git/config", "[core]"),
        ("file", "./.git/config", "[core]"),
        ("file", ".//.git/hooks/pre-commit", "#!/bin/sh"),
        ("file", ".git/./hooks/./post-checkout", "#!/bin/sh"),
        ("file", "./.git", "gitdir: /elsewhere"),
        ("sym", ".git", "elsewhere"),
        ("dir", "./.git/"),
    ],
    ids=lambda m: f"{m[0]}:{m[1]}",
)
def test_directory_excludes_hold_for_every_spelling(runtime: Server, member: Member) -> None:
    r = runtime.client().post(
        "/v1/archive/", params={"exclude": [".git/"]}, content=tar_of(member, ("file", "kept.txt", "k"))
    )
    assert r.status_code == 200, r.text
    assert list(snapshot(runtime.root)) == ["kept.txt"]


def test_a_refused_archive_changes_nothing(runtime: Server) -> None:
    root, c = runtime.root, runtime.client()
    (root / "src").mkdir()
    (root / "src/old.txt").write_text("old")
    (root / "keep.txt").write_text("keep")
    before = snapshot(root)
    for members in [
        (("file", "src/old.txt", "new"), ("file", "new.txt", "n"), ("file", "../evil.txt", "x")),
        (("file", "src/old.txt", "new"), ("dir", "d"), ("sym", "d/l", "../../..")),
        (("file", "a", "x"), ("file", "dev", "x"), ("sym", "abs", "/etc/passwd")),
        (("file", "src/new.txt", "n"), ("file", "keep.txt/inner", "x")),  # would replace a file by a dir
    ]:
        r = c.post("/v1/archive/", content=tar_of(*members))
        assert 400 <= r.status_code < 500, r.text
        assert snapshot(root) == before, members
    assert not [p for p in root.parent.rglob("*") if p.name.startswith(".sandbox-runtime-import-")]


def test_import_replaces_files_and_merges_directories(runtime: Server) -> None:
    root, c = runtime.root, runtime.client()
    (root / "app/src").mkdir(parents=True)
    (root / "app/src/a.py").write_text("old a")
    (root / "app/src/b.py").write_text("untouched")
    (root / "app/link").symlink_to("src")
    r = c.post(
        "/v1/archive/app",
        content=tar_of(("file", "src/a.py", "new a"), ("file", "src/c.py", "c"), ("sym", "link", "src/c.py")),
    )
    assert r.status_code == 200 and r.json() == {"path": "app", "files": 2, "bytes": 6}
    assert (root / "app/src/a.py").read_text() == "new a"
    assert (root / "app/src/b.py").read_text() == "untouched"
    assert os.readlink(root / "app/link") == "src/c.py"
    # An archive directory where a file (or symlink) is, or the reverse: 409, nothing changed.
    before = snapshot(root)
    r = c.post("/v1/archive/app", content=tar_of(("file", "new.py", "n"), ("file", "src", "file now")))
    assert r.status_code == 409 and "would replace a directory" in r.json()["message"]
    assert snapshot(root) == before


def gzip_bomb(expanded: int) -> bytes:
    """A tar.gz of one member of `expanded` zero bytes (about 1/1000 of that compressed)."""
    info = tarfile.TarInfo("zeros")
    info.size = expanded
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [z.compress(info.tobuf(format=tarfile.PAX_FORMAT))]
    block = bytes(1 << 20)
    for _ in range(expanded >> 20):
        parts.append(z.compress(block))
    parts.append(z.compress(bytes(1024)) + z.flush())
    return b"".join(parts)


def test_archive_imports_are_bounded(launch: Callable[..., Server]) -> None:
    srv = launch("--max-upload", "400000", "--max-archive-members", "20", "--max-archive-bytes", "5000000")
    c = srv.client()
    cases = {
        "--max-upload": tar_of(*[("file", f"f{i}", "x" * 50000) for i in range(10)]),
        "--max-archive-members": tar_of(*[("file", f"f{i}", "x") for i in range(21)]),
        "--max-archive-bytes": gzip_bomb(64 << 20),
    }
    for flag, body in cases.items():
        t0 = time.monotonic()
        r = c.post("/v1/archive/in", content=body)
        assert r.status_code == 413, (flag, r.text)
        assert r.json()["code"] == "RESOURCE_EXHAUSTED" and flag in r.json()["message"]
        assert time.monotonic() - t0 < 10
    # A member whose header declares more than the limit is refused before its data is read.
    huge = tarfile.TarInfo("sparse-looking")
    huge.size = 1 << 40
    r = c.post("/v1/archive/in", content=huge.tobuf(format=tarfile.PAX_FORMAT) + bytes(4096))
    assert r.status_code == 413
    # A pax header (read whole by tarfile) of 1 GiB is refused before it is read.
    pax = tarfile.TarInfo("PaxHeader")
    pax.type, pax.size = tarfile.XHDTYPE, 1 << 30
    r = c.post("/v1/archive/in", content=pax.tobuf(format=tarfile.USTAR_FORMAT) + bytes(100_000))
    assert r.status_code == 400 and "too large" in r.json()["message"], r.text
    assert not (srv.root / "in").exists()
    assert c.post("/v1/archive/in", content=tar_of(("file", "ok.txt", "fine"))).status_code == 200


def multipart(*files: tuple[str, bytes], field: str = "file") -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x", files=[(field, (name, data)) for name, data in files])
    return request.read(), request.headers["content-type"]


def test_every_upload_path_honours_max_upload(launch: Callable[..., Server]) -> None:
    srv = launch("--max-upload", "100000")
    c = srv.client()
    body, ctype = multipart(("a.txt", b"a" * 60000), ("b.txt", b"b" * 60000))
    r = c.post("/upload", content=body, headers={"content-type": ctype})
    assert r.status_code == 413 and "--max-upload" in r.json()["message"], r.text
    body, ctype = multipart(("c.txt", b"c" * 150000))
    assert c.put("/v1/files/c.txt", content=body, headers={"content-type": ctype}).status_code == 413
    assert c.put("/v1/files/d.txt", content=b"d" * 150000).status_code == 413
    r = c.post("/write_b64", json={"path": "e.txt", "content_b64": "ZWVl" * 40000})
    assert r.status_code == 413
    assert sorted(os.listdir(srv.root)) == [".sandbox-runtime"]
    body, ctype = multipart(("a.txt", b"a" * 40000), ("b.txt", b"b" * 40000))
    assert c.post("/upload", content=body, headers={"content-type": ctype}).status_code == 200
    assert (srv.root / "b.txt").stat().st_size == 40000


def test_staging_left_by_a_killed_runtime_is_removed_on_start(
    launch: Callable[..., Server], tmp_path: Path
) -> None:
    root = tmp_path / "restarted"
    stale = root / ".sandbox-runtime" / ".sandbox-runtime-import-abc123"
    (stale / "half").mkdir(parents=True)
    (stale / "half/file").write_text("from an interrupted import")
    launch(root=root)
    assert not stale.exists()
