"""Copy-in and promote pushes as the operator makes them: the snapshot commit and its bundle made by git in a
real sandbox-runtime, the bundle fetched, verified and pushed by the operator's side (clients/gitpush.py) to a
real smart-HTTP git server. The workspace's repository is hostile (tests/support/hostile_repo.py): none of its
hooks, filters, helpers, proxies or rewrites may ever see the token, and the push must reach the real server.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from shadow_operator.clients import gitpush
from shadow_operator.clients.runtime import Runtime
from shadow_operator.common.sources import SourcePlan
from shadow_operator.controllers.environment import pushes
from shadow_operator.sdk.upload import stream_worktree

from tests.runtime.conftest import Server, start_server
from tests.support.githttp import CanaryServer, GitHttpServer
from tests.support.hostile_repo import canary_text, git, lfs_repository, plant_canaries

pytestmark = pytest.mark.unit
TOKEN = "s3cret-gitea-token-0123456789"


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path / "workspace")
    yield srv
    srv.stop()


def plan(name: str) -> SourcePlan:
    return SourcePlan(name, name, "shadow", name, None, None, upload=True)


def push(
    srv: Server,
    source: SourcePlan,
    url: str,
    settings: gitpush.PushSettings | None = None,
    **kw: str,
) -> tuple[str, str]:
    async def go() -> tuple[str, str]:
        async with Runtime(srv.url, srv.token) as rt:
            target = pushes.Target(url, url, TOKEN, "team")
            return await pushes.snapshot_and_push(
                rt, source, target, settings or gitpush.PushSettings(), **kw
            )

    return asyncio.run(go())


def test_hostile_repository_never_sees_the_token_and_the_push_is_not_redirected(
    runtime: Server, tmp_path: Path
) -> None:
    canaries = tmp_path / "canaries"
    with GitHttpServer(tmp_path / "repos") as gitea, CanaryServer() as canary:
        url = gitea.repo_url("shadow/core")
        repo = runtime.root / "core"
        plant_canaries(repo, canaries, canary_url=canary.url, redirect=gitea.url)
        head = git(repo, "rev-parse", "HEAD")

        commit, branch = push(runtime, plan("core"), url)
        promoted, feature = push(runtime, plan("core"), url, message="promote", branch="feature/x")

        bare = tmp_path / "repos" / "shadow" / "core.git"
        assert (branch, feature) == ("main", "feature/x")
        assert git(bare, "rev-parse", "refs/heads/main") == commit
        assert git(bare, "show", f"{commit}:app.py") == "print('v2, uncommitted')"
        assert git(bare, "rev-parse", "refs/heads/feature/x") == promoted
        assert git(bare, "rev-parse", f"{promoted}^") == head
        assert git(bare, "log", "-1", "--format=%s", promoted) == "promote"
        # The token reached the real server, and nothing else.
        assert f"token {TOKEN}" in gitea.authorizations
        assert canary.requests == []
        seen = canary_text(canaries)
        assert TOKEN not in seen
        # The workspace's own git ran (its clean filter is the tenant's business), its hooks and fsmonitor
        # did not, and it never had the token to lose.
        assert "== filter" in seen
        assert not list(canaries.glob("hook-*.log")) and not (canaries / "fsmonitor.log").exists()
        # The copy is the user's checkout as it was: same HEAD, no leftover ref, no bundle left behind.
        assert git(repo, "rev-parse", "HEAD") == head
        assert "shadow" not in git(repo, "for-each-ref")
        assert not list((runtime.root / ".sandbox-runtime" / "push").iterdir())


def test_lfs_repository_copies_in_with_its_large_file(runtime: Server, tmp_path: Path) -> None:
    local = tmp_path / "local" / "art"
    content = lfs_repository(local)
    # The upload path as `shadowctl create --local` streams it: the smudged working tree and .git.
    body = b"".join(stream_worktree(local))
    resp = httpx.post(f"{runtime.url}/v1/archive/art", content=body, timeout=60)
    assert resp.status_code < 300, resp.text
    assert (runtime.root / "art" / "model.bin").read_bytes() == content

    with GitHttpServer(tmp_path / "repos") as gitea:
        commit, branch = push(runtime, plan("art"), gitea.repo_url("shadow/art"))

    bare = tmp_path / "repos" / "shadow" / "art.git"
    assert git(bare, "rev-parse", f"refs/heads/{branch}") == commit
    blob = subprocess.run(
        ["git", "-C", str(bare), "cat-file", "blob", f"{commit}:model.bin"], capture_output=True, check=True
    ).stdout
    assert blob == content  # a plain blob: Gitea needs no LFS server, a clone from it no git-lfs
    assert (runtime.root / "art" / "model.bin").read_bytes() == content


def test_oversized_bundle_and_bad_branch_are_refused_with_clear_errors(
    runtime: Server, tmp_path: Path
) -> None:
    repo = runtime.root / "big"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "blob").write_bytes(bytes(range(256)) * 4096)
    with GitHttpServer(tmp_path / "repos") as gitea:
        url = gitea.repo_url("shadow/big")
        with pytest.raises(gitpush.PushFailed, match="larger than 1000 bytes"):
            push(runtime, plan("big"), url, gitpush.PushSettings(max_bundle_bytes=1000))
        with pytest.raises(gitpush.PushFailed, match="not a valid branch name"):
            push(runtime, plan("big"), url, message="m", branch="bad..name")
    assert not list((runtime.root / ".sandbox-runtime" / "push").iterdir())
