"""The SDK's upload into a real sandbox-runtime on loopback: the client half of an `upload: {}` source."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from shadow_operator.sdk import RuntimeRefused, RuntimeUnreachable, upload_to_runtime, worktree_files

from tests.runtime.conftest import Server, free_port

pytestmark = pytest.mark.unit

TOKEN = "upload-token-0123456789"


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com")
    env.update(GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")
    done = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.fixture
def secured(launch: Callable[..., Server]) -> Server:
    return launch(env={"SANDBOX_RUNTIME_TOKEN": TOKEN}, token=TOKEN)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "local"
    (root / "src").mkdir(parents=True)
    git(root, "init", "-q")
    (root / ".gitignore").write_text("*.log\n")
    (root / "src" / "app.py").write_text("print('committed')\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "first")
    (root / "src" / "app.py").write_text("print('uncommitted')\n")
    (root / "notes.md").write_text("untracked\n")
    (root / "debug.log").write_text("ignored\n")
    return root


def test_upload_lands_in_the_destination_with_uncommitted_work(secured: Server, repo: Path) -> None:
    seen: list[tuple[int, int]] = []
    result = upload_to_runtime(
        secured.url, TOKEN, "projects/app", repo, progress=lambda done, total: seen.append((done, total))
    )
    dest = secured.root / "projects" / "app"
    assert result["path"] == "projects/app"
    assert result["files"] == len(worktree_files(repo))
    assert len(result["sha256"]) == 64 and seen[-1][0] == seen[-1][1]
    assert (dest / "src" / "app.py").read_text() == "print('uncommitted')\n"
    assert (dest / "notes.md").read_text() == "untracked\n"
    assert not (dest / "debug.log").exists()
    # The history came along: the workspace copy knows what is committed and what is not.
    assert sorted(git(dest, "status", "--porcelain").splitlines()) == [" M src/app.py", "?? notes.md"]
    assert git(dest, "log", "--format=%s").split() == ["first"]


def test_token_header_alone_is_enough(secured: Server, repo: Path) -> None:
    # As behind the API server's pod proxy, which strips Authorization: only X-Sandbox-Runtime-Token arrives.
    result = upload_to_runtime(secured.url, TOKEN, "via-proxy", repo, headers={})
    assert result["files"] > 0
    assert (secured.root / "via-proxy" / "notes.md").read_text() == "untracked\n"


def test_wrong_token_is_refused(secured: Server, repo: Path) -> None:
    for headers in (None, {}):
        with pytest.raises(RuntimeRefused) as refused:
            upload_to_runtime(secured.url, "not-the-token", "nope", repo, headers=headers)
        assert refused.value.status == 401
        assert "invalid bearer token" in str(refused.value)
    assert not (secured.root / "nope").exists()


def test_wrong_token_is_refused_before_a_large_body_is_sent(secured: Server, tmp_path: Path) -> None:
    tree = tmp_path / "big"
    tree.mkdir()
    (tree / "blob.bin").write_bytes(os.urandom(32 * 1024 * 1024))
    with pytest.raises(RuntimeRefused) as refused:
        upload_to_runtime(secured.url, "not-the-token", "big", tree)
    assert refused.value.status == 401


def test_escaping_destination_and_unreachable_runtime(secured: Server, repo: Path) -> None:
    with pytest.raises(RuntimeRefused) as refused:
        upload_to_runtime(secured.url, TOKEN, "../outside", repo)
    assert 400 <= refused.value.status < 500
    with pytest.raises(RuntimeUnreachable, match="cannot reach"):
        upload_to_runtime(f"http://127.0.0.1:{free_port()}", TOKEN, "x", repo)
    with httpx.Client() as client:  # a caller's own client is used and left open
        upload_to_runtime(secured.url, TOKEN, "again", repo, client=client)
        assert not client.is_closed
