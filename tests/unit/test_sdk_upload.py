"""What an upload carries and how it is packed: a real git repository, a real tar stream read back."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from shadow_operator.sdk import UploadError, stream_worktree, worktree_files

pytestmark = pytest.mark.unit

AUTHOR = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    done = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        env={**env, **AUTHOR},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Committed, modified, untracked, ignored, deleted, nested, executable and symlinked files."""
    root = tmp_path / "repo"
    (root / "src" / "pkg").mkdir(parents=True)
    git(root, "init", "-q")
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    (root / "committed.txt").write_text("committed\n")
    (root / "modified.txt").write_text("before\n")
    (root / "deleted.txt").write_text("soon gone\n")
    (root / "src" / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    os.symlink("src/pkg/mod.py", root / "link.py")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "first")
    (root / "modified.txt").write_text("after, uncommitted\n")
    (root / "deleted.txt").unlink()
    (root / "untracked.txt").write_text("new, not added\n")
    (root / "src" / "pkg" / "new.py").write_text("Y = 2\n")
    (root / "debug.log").write_text("ignored\n")
    (root / "build").mkdir()
    (root / "build" / "out.bin").write_bytes(b"ignored too")
    return root


def read_back(chunks: list[bytes]) -> dict[str, tarfile.TarInfo | bytes]:
    """Every member of the archive: file contents as bytes, symlinks as their TarInfo."""
    out: dict[str, tarfile.TarInfo | bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:gz") as tar:
        for member in tar:
            if member.isfile():
                f = tar.extractfile(member)
                assert f is not None
                out[member.name] = f.read()
            else:
                out[member.name] = member
    return out


def test_worktree_files_of_a_repository(repo: Path) -> None:
    files = worktree_files(repo)
    work = [f for f in files if not f.startswith(".git/")]
    assert work == [
        ".gitignore",
        "committed.txt",
        "link.py",
        "modified.txt",
        "run.sh",
        "src/pkg/mod.py",
        "src/pkg/new.py",
        "untracked.txt",
    ]
    history = {f for f in files if f.startswith(".git/")}
    assert {".git/HEAD", ".git/config", ".git/index"} <= history
    assert any(f.startswith(".git/objects/") for f in history)
    assert files == sorted(files)


def test_the_stream_round_trips(repo: Path, tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    chunks = list(stream_worktree(repo, progress=lambda done, total: seen.append((done, total))))
    members = read_back(chunks)
    assert members["modified.txt"] == b"after, uncommitted\n"
    assert members["untracked.txt"] == b"new, not added\n"
    assert members["src/pkg/new.py"] == b"Y = 2\n"
    for absent in ("debug.log", "build/out.bin", "deleted.txt"):
        assert absent not in members
    link = members["link.py"]
    assert isinstance(link, tarfile.TarInfo) and link.issym() and link.linkname == "src/pkg/mod.py"
    assert ".git/HEAD" in members
    assert set(members) == set(worktree_files(repo))
    for name, content in members.items():
        if isinstance(content, bytes) and name != ".git/config":
            assert content == (repo / name).read_bytes(), name
    # The config travels rewritten (an allowlist); a plain repository's reads the same to git.
    sent = tmp_path / "sent-config"
    sent.write_bytes(members[".git/config"])  # type: ignore[arg-type]
    assert git(repo, "config", "--file", str(sent), "--list") == git(
        repo, "config", "--file", ".git/config", "--list"
    )
    total = seen[-1][1]
    assert seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)

    # Extracted, it is the same repository: history, the uncommitted change, the executable bit.
    dest = tmp_path / "extracted"
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")
    assert os.access(dest / "run.sh", os.X_OK)
    status = git(dest, "status", "--porcelain").splitlines()
    assert sorted(status) == sorted(
        [" M modified.txt", " D deleted.txt", "?? src/pkg/new.py", "?? untracked.txt"]
    )
    assert git(dest, "log", "--format=%s").split() == ["first"]


def test_large_files_stream_in_bounded_chunks(tmp_path: Path) -> None:
    tree = tmp_path / "plain"
    tree.mkdir()
    big = os.urandom(3 * 1024 * 1024)  # random: gzip cannot shrink it, so chunk sizes are real
    (tree / "big.bin").write_bytes(big)
    (tree / "small.txt").write_text("s")
    chunk = 64 * 1024
    chunks = list(stream_worktree(tree, chunk=chunk))
    assert len(chunks) > 40
    assert max(len(c) for c in chunks) < 2 * chunk + 1024
    members = read_back(chunks)
    assert members["big.bin"] == big and members["small.txt"] == b"s"


def test_plain_directory_carries_every_file(tmp_path: Path) -> None:
    tree = tmp_path / "plain"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "deep.txt").write_text("deep")
    (tree / "top.log").write_text("no .gitignore applies here")
    (tree / ".hidden").write_text("h")
    os.symlink("/etc", tree / "outside")  # kept as a link, never followed
    assert worktree_files(tree) == [".hidden", "a/b/deep.txt", "outside", "top.log"]


def test_long_and_unicode_names(tmp_path: Path) -> None:
    tree = tmp_path / "plain"
    name = "d/" + "x" * 150 + "/" + "é" * 60 + ".txt"  # beyond ustar's 100-byte names: a PAX header
    (tree / name).parent.mkdir(parents=True)
    (tree / name).write_text("long")
    assert read_back(list(stream_worktree(tree))) == {name: b"long"}


def test_gnu_tar_reads_the_stream(repo: Path, tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(b"".join(stream_worktree(repo)))
    listed = subprocess.run(["tar", "-tzf", str(archive)], capture_output=True, text=True, check=True)
    assert sorted(listed.stdout.split()) == worktree_files(repo)
    assert listed.stderr == ""


def test_submodules_and_nested_repositories(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    git(lib, "init", "-q")
    (lib / "lib.py").write_text("L = 1\n")
    git(lib, "add", "-A")
    git(lib, "commit", "-qm", "lib")
    root = tmp_path / "app"
    root.mkdir()
    git(root, "init", "-q")
    (root / "app.py").write_text("A = 1\n")
    git(root, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib")
    git(root, "commit", "-qm", "app")
    (root / "vendor" / "lib" / "lib.py").write_text("L = 2  # changed inside the submodule\n")
    nested = root / "scratch"
    nested.mkdir()
    git(nested, "init", "-q")
    (nested / "notes.md").write_text("n")
    files = worktree_files(root)
    assert {"app.py", ".gitmodules", "vendor/lib/lib.py", "vendor/lib/.git", "scratch/notes.md"} <= set(files)
    assert any(f.startswith(".git/modules/vendor/lib/") for f in files)
    assert any(f.startswith("scratch/.git/") for f in files)
    # The submodule's .git points into the parent's .git/modules: both travel, so it resolves once unpacked.
    dest = tmp_path / "extracted"
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream_worktree(root))), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")
    assert git(dest / "vendor" / "lib", "status", "--porcelain").split() == ["M", "lib.py"]


def test_linked_worktree_and_missing_directory_are_refused(repo: Path, tmp_path: Path) -> None:
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", str(linked))
    with pytest.raises(UploadError, match="linked worktree"):
        worktree_files(linked)
    with pytest.raises(UploadError, match="not a directory"):
        worktree_files(tmp_path / "nope")


def test_the_callers_git_environment_is_ignored(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    assert "modified.txt" in worktree_files(repo)


def test_importing_the_sdk_does_not_load_kopf() -> None:
    code = "import sys, shadow_operator.sdk; print('kopf' in sys.modules, 'aiohttp' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[2],
    )
    assert done.stdout.split() == ["False", "False"]
