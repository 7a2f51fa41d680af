"""Issue 18, M1-M3 and M5: one hostile answer each, from a real HTTP server on loopback (or a real runtime),
against the client's promote, cp and upload. tests/runtime/test_client_fuzz.py runs the grammar of them."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from shadow_operator.cli.copying import copy
from shadow_operator.sdk import confine, kube, promote, runtime
from shadow_operator.sdk.errors import ShadowError
from shadow_operator.sdk.runtime import RuntimeEndpoint
from shadow_operator.sdk.upload import stream_worktree

from tests.runtime.conftest import Server, free_port, wait_until
from tests.support import hostile

pytestmark = pytest.mark.unit

DOTGITS = [
    ".GIT/hooks/pre-commit",
    ".Git/config",
    ".g\u200cit/config",
    ".git./hooks/post-checkout",
    "GIT~1/config",
]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def repository(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "app.py").write_text("v1\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return path


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(root)): (
            p.lstat().st_mode,
            p.read_bytes() if p.is_file() and not p.is_symlink() else b"",
        )
        for p in sorted(root.rglob("*"))
    }


def file_answers(files: dict[str, bytes], mode: str = "0755") -> dict[str, bytes | dict[str, object]]:
    answers: dict[str, bytes | dict[str, object]] = {}
    for path, data in files.items():
        answers[f"/v1/stat/{path}"] = {"type": "file", "size": len(data), "mode": mode}
        answers[f"/v1/files/{path}"] = data
    return answers


def archive(members: list[tuple[str, bytes, int]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_promote_writes_no_spelling_of_dotgit(tmp_path: Path) -> None:
    """M1: on macOS and Windows disks `.GIT/hooks/pre-commit` is `.git/hooks/pre-commit`: a hook, run by the
    user's next commit. Every spelling is refused (case, ignorables, trailing dots, short names)."""
    local = repository(tmp_path / "core")
    git_before = tree(local / ".git")
    changed = {f"src/{p}": b"#!/bin/sh\ntouch /tmp/pwned\n" for p in DOTGITS} | {"src/ok.py": b"fine\n"}
    diff = {"added": sorted(changed), "modified": [], "deleted": ["src/.GIT/index", "src/.git\u200d/HEAD"]}
    with hostile.serving({"/v1/diff": diff, **file_answers(changed)}) as url, httpx.Client() as http:
        ep = RuntimeEndpoint(url, {})
        plan = promote.plan_promote(kube.run(http, runtime.diff(ep)), "core", "src", local)
        kube.run(http, promote.apply(ep, plan))
    assert tree(local / ".git") == git_before
    assert [p.name for p in local.iterdir() if confine.is_dotgit(p.name)] == [".git"]
    assert (local / "ok.py").read_bytes() == b"fine\n"
    assert sorted(plan.refused) == sorted([*DOTGITS, ".GIT/index", ".git\u200d/HEAD"])


def test_promote_does_not_follow_a_symlinked_directory(tmp_path: Path) -> None:
    """M2: `link -> ../outside` in the local directory, and a new file under `link/new/`: the parent does not
    exist yet, so checking it was not enough; the walk refuses the link itself."""
    outside = tmp_path / "outside"
    outside.mkdir()
    local = repository(tmp_path / "core")
    (local / "link").symlink_to("../outside")
    changed = {"src/link/new/evil.sh": b"#!/bin/sh\n"}
    diff = {"added": sorted(changed), "modified": [], "deleted": ["src/link/keep.txt"]}
    (outside / "keep.txt").write_text("outside\n")
    with hostile.serving({"/v1/diff": diff, **file_answers(changed)}) as url, httpx.Client() as http:
        ep = RuntimeEndpoint(url, {})
        plan = promote.plan_promote(kube.run(http, runtime.diff(ep)), "core", "src", local)
        with pytest.raises(ShadowError, match="symbolic link"):
            kube.run(http, promote.apply(ep, plan))
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


def test_cp_writes_nothing_into_dotgit_and_no_setuid(tmp_path: Path) -> None:
    """M3: `shadowctl cp ENV:DIR` received `.git/config` with an fsmonitor command and hooks with 0755; every
    spelling of .git is refused, and what is written loses setuid, setgid and group/other write."""
    local = repository(tmp_path / "core")
    git_before = tree(local / ".git")
    fsmonitor = b"[core]\n\tfsmonitor = touch /tmp/pwned\n"
    for name in [".git/config", ".GIT/hooks/pre-commit", "sub/.Git/config", "./.git/config"]:
        hostile_archive = archive([("ok.txt", b"ok\n", 0o644), (name, fsmonitor, 0o755)])
        answers = {"/v1/stat/src": {"type": "directory"}, "/v1/archive/src": hostile_archive}
        with (
            hostile.serving(answers) as url,
            httpx.Client() as http,
            pytest.raises(ShadowError, match="refusing"),
        ):
            copy(http, RuntimeEndpoint(url, {}), "env", "src", str(local))
    assert tree(local / ".git") == git_before
    assert [p.name for p in local.rglob("*") if confine.is_dotgit(p.name)] == [".git"]

    modes = archive([("tool.sh", b"#!/bin/sh\n", 0o6777), ("plain.txt", b"x\n", 0o666)])
    answers = {"/v1/stat/src": {"type": "directory"}, "/v1/archive/src": modes}
    with hostile.serving(answers) as url, httpx.Client() as http:
        copy(http, RuntimeEndpoint(url, {}), "env", "src", str(tmp_path / "copy"))
    assert stat.S_IMODE((tmp_path / "copy/tool.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "copy/plain.txt").stat().st_mode) == 0o644


# Peak RSS as VmHWM: ru_maxrss would carry the forking pytest process's size across exec.
CP_CLIENT = """
import re, sys, httpx
from shadow_operator.cli.copying import copy
from shadow_operator.sdk.errors import ShadowError
from shadow_operator.sdk.runtime import RuntimeEndpoint
url, target = sys.argv[1], sys.argv[2]
try:
    with httpx.Client(timeout=120) as http:
        copy(http, RuntimeEndpoint(url, {}), "env", "src", target)
    print("ok")
except ShadowError as exc:
    print(exc.code, exc.message)
with open("/proc/self/status") as status:
    print(int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1)) // 1024)
"""


@pytest.mark.parametrize(("served", "outcome"), [(str(256 << 20), "ok"), ("sparse4g", "TooLarge")])
def test_cp_streams_with_bounded_memory_and_size(tmp_path: Path, served: str, outcome: str) -> None:
    """M3: a 254 KiB archive that expands to a 256 MiB file took the client to +270 MiB (the whole archive in
    memory); a 4 GiB (sparse) member is refused by its declared size before anything is written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.hostile", "--port", str(port := free_port())],
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        _wait(f"http://127.0.0.1:{port}")
        done = subprocess.run(
            [sys.executable, "-c", CP_CLIENT, f"http://127.0.0.1:{port}/big/{served}", str(tmp_path / "d")],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        proc.terminate()
        proc.wait(10)
    result, peak = done.stdout.splitlines()
    print(f"\ncp of {served}: {result}; client peak RSS {peak} MiB")
    assert result.split()[0] == outcome, result
    assert int(peak) < 128, f"client peak RSS {peak} MiB"
    if outcome == "TooLarge":
        assert "huge.bin" in result
        assert not (tmp_path / "d" / "huge.bin").exists()


def _wait(url: str) -> None:
    def up() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 404
        except httpx.TransportError:
            return False

    wait_until(up, 20, "the hostile runtime")


def test_upload_carries_no_credentials_and_no_hooks(launch: Callable[..., Server], tmp_path: Path) -> None:
    """M5: upload shipped `.git/config` whole: credential URLs and `http.extraheader` reached the workspace,
    and so did hooks. A real repository with both, uploaded to a real runtime."""
    repo = repository(tmp_path / "core")
    git(repo, "remote", "add", "origin", "https://user:s3cret@host/x.git")
    git(repo, "config", "http.extraheader", "Authorization: Bearer s3cret")
    git(repo, "config", "core.fsmonitor", "touch /tmp/s3cret")
    git(repo, "config", "branch.main.remote", "origin")
    (repo / ".git/hooks/pre-commit").write_text("#!/bin/sh\necho s3cret\n")
    os.chmod(repo / ".git/hooks/pre-commit", 0o755)
    server = launch()
    with httpx.Client() as http:
        kube.run(http, runtime.import_archive(RuntimeEndpoint(server.url, {}), "src", stream_worktree(repo)))
    uploaded = server.root / "src"
    assert (uploaded / "app.py").read_text() == "v1\n"
    for path in uploaded.rglob("*"):
        assert not path.is_file() or b"s3cret" not in path.read_bytes(), path
    assert not (uploaded / ".git/hooks/pre-commit").exists()
    assert git(uploaded, "config", "remote.origin.url").strip() == "https://host/x.git"
    assert git(uploaded, "config", "branch.main.remote").strip() == "origin"
    assert git(uploaded, "log", "--format=%s").strip() == "init"  # the history travelled
