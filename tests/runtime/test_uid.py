"""The image runs the runtime as an arbitrary non-root uid (OpenShift-style, no passwd entry)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.runtime.conftest import start_server

pytestmark = pytest.mark.unit

UID = 23456  # deliberately not in /etc/passwd


@pytest.fixture
def scratch() -> Iterator[Path]:
    # pytest's tmp dirs are private to root (0700); the foreign uid needs a path it can traverse.
    d = Path(tempfile.mkdtemp(prefix="rt-uid-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="switching uid needs root and setpriv"
)
AS_UID = ("setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups")


@needs_root
def test_runs_as_arbitrary_uid(scratch: Path) -> None:
    root = scratch / "ws"
    root.mkdir()
    os.chown(root, UID, UID)
    srv = start_server(root, prefix=AS_UID, env={"HOME": "/nonexistent"})
    try:
        with httpx.Client(base_url=srv.url) as c:
            assert c.post("/execute", json={"command": "id -u"}).json()["stdout"] == f"{UID}\n"
            assert c.put("/v1/files/a/b.txt", content=b"x").status_code == 204
            assert (root / "a/b.txt").stat().st_uid == UID
            c.post("/v1/exec", json={"argv": ["false"]})
            assert c.get("/v1/journal").json()["last_seq"] == 2
            assert (root / ".sandbox-runtime/journal.jsonl").exists()
    finally:
        srv.stop()


@needs_root
def test_read_only_root_still_serves(scratch: Path) -> None:
    root = scratch / "ro"
    root.mkdir()
    (root / "file.txt").write_text("readable")
    root.chmod(0o755)  # owned by root: the foreign uid can read but not write
    log = scratch / "log"
    srv = start_server(root, prefix=AS_UID, log=log)
    try:
        with httpx.Client(base_url=srv.url) as c:
            assert c.get("/download/file.txt").content == b"readable"
            r = c.put("/v1/files/new.txt", content=b"x")
            assert r.status_code == 403 and r.json()["code"] == "PERMISSION_DENIED"
            assert c.post("/execute", json={"command": "true"}).json()["exit_code"] == 0
    finally:
        srv.stop()
    assert "not writable" in log.read_text()
