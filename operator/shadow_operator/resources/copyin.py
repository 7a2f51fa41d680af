"""Shell programs the operator runs in the workspace through the runtime's exec API.

They take their inputs from environment variables (never interpolated into the script, so no quoting bugs and
no secret in a command line) and print one `SHADOW_RESULT ...` line that the operator parses.
"""

from __future__ import annotations

from collections.abc import Iterable

from shadow_operator.api import constants as c
from shadow_operator.common.sources import SourcePlan
from shadow_operator.resources.environment import SNAPSHOT_AUTHOR

RESULT_MARKER = "SHADOW_RESULT"

# Git as the snapshot scripts run it in the workspace: the repository's own hooks and fsmonitor never run, and
# git-lfs filters are off, so large files are committed as plain blobs (the workspace holds their content,
# uploaded smudged; Gitea needs no LFS server and a clone from it needs no git-lfs). No credential is ever in
# the workspace: the operator fetches the bundle these scripts write and pushes it itself (clients/gitpush.py).
SAFE_GIT = (
    "git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c filter.lfs.process= -c filter.lfs.clean= "
    "-c filter.lfs.smudge= -c filter.lfs.required=false"
)
SNAPSHOT_REF = c.GIT_SNAPSHOT_REF

# Clone (git sources), then snapshot the working tree (uncommitted and untracked-but-not-ignored files
# included) into a commit without touching the copy's own index or HEAD, and write a bundle of that commit
# (as SNAPSHOT_REF) with the repository's branches, origin's branches and tags to $SHADOW_BUNDLE, so that
# commits pinned in lockfiles resolve in Gitea too. With SHADOW_MESSAGE, the snapshot is a new commit on top
# of HEAD with that message and the bundle carries only it (a promote to a branch).
SNAPSHOT = rf"""
set -eu
g() {{ {SAFE_GIT} "$@"; }}
bundle=${{SHADOW_BUNDLE:+$PWD/$SHADOW_BUNDLE}}
if [ "$SHADOW_MODE" = git ] && [ ! -e "$SHADOW_PATH/.git" ]; then
  rm -rf "$SHADOW_PATH.partial"
  mkdir -p "$(dirname "$SHADOW_PATH")"
  git clone --quiet "$SHADOW_URL" "$SHADOW_PATH.partial"
  if [ -n "${{SHADOW_REF:-}}" ]; then git -C "$SHADOW_PATH.partial" checkout --quiet "$SHADOW_REF"; fi
  rm -rf "$SHADOW_PATH"
  mv "$SHADOW_PATH.partial" "$SHADOW_PATH"
fi
[ -d "$SHADOW_PATH" ] || {{ echo "source directory $SHADOW_PATH is missing (was it uploaded?)" >&2; exit 3; }}
cd "$SHADOW_PATH"
[ -e .git ] || g init --quiet --initial-branch=main
branch=$(g symbolic-ref --quiet --short HEAD || echo main)
index=$(mktemp)
if [ -f .git/index ]; then cp .git/index "$index"; else rm -f "$index"; fi
GIT_INDEX_FILE="$index" g add --all
tree=$(GIT_INDEX_FILE="$index" g write-tree)
rm -f "$index"
parent=$(g rev-parse --quiet --verify 'HEAD^{{commit}}' || true)
if [ -n "${{SHADOW_MESSAGE:-}}" ]; then
  commit=$(g commit-tree "$tree" ${{parent:+-p "$parent"}} -m "$SHADOW_MESSAGE")
else
  # Dated like its parent, the snapshot of the same tree is the same commit every time (a retried copy-in
  # pushes what the first attempt pushed).
  stamp=$( [ -n "$parent" ] && g log -1 --format=%cI "$parent" || echo 1970-01-01T00:00:00Z)
  export GIT_AUTHOR_DATE="$stamp" GIT_COMMITTER_DATE="$stamp"
  if [ -n "$parent" ] && [ "$(g rev-parse "$parent^{{tree}}")" = "$tree" ]; then
    commit=$parent
  elif [ -n "$parent" ]; then
    commit=$(g commit-tree "$tree" -p "$parent" -m "shadow snapshot: uncommitted work")
  else
    commit=$(g commit-tree "$tree" -m "shadow snapshot")
  fi
fi
if [ -n "$bundle" ]; then
  mkdir -p "$(dirname "$bundle")"
  g update-ref {SNAPSHOT_REF} "$commit"
  if [ -n "${{SHADOW_MESSAGE:-}}" ]; then
    g bundle create --quiet "$bundle" {SNAPSHOT_REF}
  else
    g bundle create --quiet "$bundle" {SNAPSHOT_REF} --branches --tags --remotes=origin
  fi
  g update-ref -d {SNAPSHOT_REF}
fi
echo "SHADOW_RESULT $commit $branch"
"""

# Installation health: install the source from its public git URL, which the workspace's git rewrites send
# to the environment's Gitea (pip runs git). Offline-capable: no build isolation, no dependencies. The venv
# borrows the system's pip when there is one (installing pip into it takes about 2 s of the verdict).
INSTALL_PYTHON = r"""
set -eu
venv=$(mktemp -d)/venv
python3 -m venv --without-pip --system-site-packages "$venv"
if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$venv"
  python3 -m venv --system-site-packages "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
  "git+$SHADOW_URL@$SHADOW_BRANCH"
echo "SHADOW_RESULT installed"
"""

INSTALL_NODE = r"""
set -eu
dir=$(mktemp -d)
cd "$dir"
npm install --no-save --ignore-scripts --no-audit --no-fund --loglevel=error "git+$SHADOW_URL#$SHADOW_BRANCH"
echo "SHADOW_RESULT installed"
"""

# Source verification, inside the workspace: the snapshot commit is there and its tree is the files'.
VERIFY_SOURCE = r"""
set -eu
cd "$SHADOW_PATH"
git cat-file -e "$SHADOW_COMMIT^{commit}"
echo "SHADOW_RESULT present"
"""

# What kind of project a source is, for the installation check.
DETECT_PROJECT = r"""
set -eu
cd "$SHADOW_PATH"
if [ -f pyproject.toml ] || [ -f setup.py ]; then echo "SHADOW_RESULT python"
elif [ -f package.json ]; then echo "SHADOW_RESULT node"
else echo "SHADOW_RESULT other"; fi
"""


def author_env() -> dict[str, str]:
    name, email = SNAPSHOT_AUTHOR
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_TERMINAL_PROMPT": "0",
    }


def snapshot_env(
    plan: SourcePlan, *, bundle: str | None, path: str | None = None, message: str | None = None
) -> dict[str, str]:
    """Inputs of SNAPSHOT: the source (or `path`, e.g. a published directory) and where the bundle goes
    (relative to the workspace root; None: nowhere, there is no Gitea to push to)."""
    env = {
        **author_env(),
        # The clone of the source itself must not be redirected by the environment's own rewrites.
        "GIT_CONFIG_COUNT": "0",
        "SHADOW_MODE": "upload" if plan.upload or path else "git",
        "SHADOW_PATH": path or plan.path,
        "SHADOW_BUNDLE": bundle or "",
    }
    if message:
        env["SHADOW_MESSAGE"] = message
    if plan.git_url and not path:
        env["SHADOW_URL"] = plan.git_url
    if plan.git_ref and not path:
        env["SHADOW_REF"] = plan.git_ref
    return env


def parse_result(stdout: str) -> list[str] | None:
    """The fields of the last `SHADOW_RESULT` line, or None when the program printed none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARKER + " "):
            return line.split()[1:]
    return None


def tail(text: str, limit: int = 600) -> str:
    """The end of a command's output, for evidence and messages (whole lines when possible)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    return "…" + cut[cut.find("\n") + 1 :] if "\n" in cut else "…" + cut


def redact(text: str, secrets: Iterable[str]) -> str:
    """Remove secret values from text that goes into status, events or logs."""
    for value in secrets:
        if value:
            text = text.replace(value, "***")
    return text
