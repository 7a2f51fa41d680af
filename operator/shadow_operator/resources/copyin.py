"""Shell programs the operator runs in the workspace through the runtime's exec API.

They take their inputs from environment variables (never interpolated into the script, so no quoting bugs and
no secret in a command line) and print one `SHADOW_RESULT ...` line that the operator parses.
"""

from __future__ import annotations

from collections.abc import Iterable

from shadow_operator.resources.environment import SNAPSHOT_AUTHOR, SourcePlan

RESULT_MARKER = "SHADOW_RESULT"

# Clone (git sources), then snapshot the working tree (uncommitted and untracked-but-not-ignored files
# included) into a commit without touching the copy's own index or HEAD, and push it with the repository's
# branches and tags to Gitea, so that commits pinned in lockfiles resolve there too.
COPY_IN = r"""
set -eu
if [ "$SHADOW_MODE" = git ] && [ ! -e "$SHADOW_PATH/.git" ]; then
  rm -rf "$SHADOW_PATH.partial"
  mkdir -p "$(dirname "$SHADOW_PATH")"
  git clone --quiet "$SHADOW_URL" "$SHADOW_PATH.partial"
  if [ -n "${SHADOW_REF:-}" ]; then git -C "$SHADOW_PATH.partial" checkout --quiet "$SHADOW_REF"; fi
  rm -rf "$SHADOW_PATH"
  mv "$SHADOW_PATH.partial" "$SHADOW_PATH"
fi
[ -d "$SHADOW_PATH" ] || { echo "source directory $SHADOW_PATH is missing (was it uploaded?)" >&2; exit 3; }
cd "$SHADOW_PATH"
[ -e .git ] || git init --quiet --initial-branch=main
branch=$(git symbolic-ref --quiet --short HEAD || echo main)
index=$(mktemp)
if [ -f .git/index ]; then cp .git/index "$index"; else rm -f "$index"; fi
GIT_INDEX_FILE="$index" git add --all
tree=$(GIT_INDEX_FILE="$index" git write-tree)
rm -f "$index"
parent=$(git rev-parse --quiet --verify 'HEAD^{commit}' || true)
# Dated like its parent, the snapshot of the same tree is the same commit every time (a retried copy-in
# pushes what the first attempt pushed).
stamp=$( [ -n "$parent" ] && git log -1 --format=%cI "$parent" || echo 1970-01-01T00:00:00Z)
export GIT_AUTHOR_DATE="$stamp" GIT_COMMITTER_DATE="$stamp"
if [ -n "$parent" ] && [ "$(git rev-parse "$parent^{tree}")" = "$tree" ]; then
  commit=$parent
elif [ -n "$parent" ]; then
  commit=$(git commit-tree "$tree" -p "$parent" -m "shadow snapshot: uncommitted work")
else
  commit=$(git commit-tree "$tree" -m "shadow snapshot")
fi
seen=" $branch "
refs="+$commit:refs/heads/$branch"
for ref in $(git for-each-ref --format='%(refname)' refs/heads refs/remotes/origin); do
  case $ref in
    refs/remotes/origin/HEAD) continue ;;
    refs/heads/*) b=${ref#refs/heads/} ;;
    *) b=${ref#refs/remotes/origin/} ;;
  esac
  case $seen in *" $b "*) continue ;; esac
  seen="$seen$b "
  refs="$refs +$ref:refs/heads/$b"
done
if [ -n "${SHADOW_PUSH_URL:-}" ]; then
  GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=http.extraHeader \
    GIT_CONFIG_VALUE_0="Authorization: token $SHADOW_PUSH_TOKEN" \
    git push --quiet --force "$SHADOW_PUSH_URL" $refs '+refs/tags/*:refs/tags/*'
fi
echo "SHADOW_RESULT $commit $branch"
"""

# Installation health: install the source from its public git URL, which the workspace's git rewrites send
# to the environment's Gitea (pip runs git). Offline-capable: no build isolation, no dependencies.
INSTALL_PYTHON = r"""
set -eu
venv=$(mktemp -d)/venv
python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation \
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


def copy_in_env(plan: SourcePlan, *, push_url: str | None, token: str | None) -> dict[str, str]:
    """Inputs of COPY_IN; without a push URL (no Gitea) the snapshot is made but not pushed."""
    env = {
        **author_env(),
        # The clone of the source itself must not be redirected by the environment's own rewrites.
        "GIT_CONFIG_COUNT": "0",
        "SHADOW_MODE": "upload" if plan.upload else "git",
        "SHADOW_PATH": plan.path,
        "SHADOW_PUSH_URL": push_url or "",
        "SHADOW_PUSH_TOKEN": token or "",
    }
    if plan.git_url:
        env["SHADOW_URL"] = plan.git_url
    if plan.git_ref:
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


# Promote to a branch: snapshot the working tree of a source (as COPY_IN does, HEAD and index untouched) and
# push that commit to one branch of its Gitea repository.
PUSH_BRANCH = r"""
set -eu
cd "$SHADOW_PATH"
index=$(mktemp)
if [ -f .git/index ]; then cp .git/index "$index"; else rm -f "$index"; fi
GIT_INDEX_FILE="$index" git add --all
tree=$(GIT_INDEX_FILE="$index" git write-tree)
rm -f "$index"
parent=$(git rev-parse --quiet --verify 'HEAD^{commit}' || true)
if [ -n "$parent" ]; then
  commit=$(git commit-tree "$tree" -p "$parent" -m "$SHADOW_MESSAGE")
else
  commit=$(git commit-tree "$tree" -m "$SHADOW_MESSAGE")
fi
GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=http.extraHeader GIT_CONFIG_VALUE_0="Authorization: $SHADOW_PUSH_AUTH" \
  git push --quiet --force "$SHADOW_PUSH_URL" "$commit:refs/heads/$SHADOW_BRANCH"
echo "SHADOW_RESULT $commit $SHADOW_BRANCH"
"""

# Publish: make sure an organization and a repository exist in the environment's Gitea (Gitea's REST API,
# from inside the workspace, which is the one place that reaches Gitea; python3 is there, the runtime is it).
ENSURE_REPO = r"""
import json, os, sys, urllib.error, urllib.request
api = os.environ["SHADOW_GITEA_API"].rstrip("/") + "/api/v1"
auth = os.environ["SHADOW_GITEA_AUTH"]
org, repo = os.environ["SHADOW_ORG"], os.environ["SHADOW_REPO"]

def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(api + path, data=data, method=method,
                                 headers={"Authorization": auth, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code

if call("GET", f"/orgs/{org}") == 404:
    status = call("POST", "/orgs", {"username": org, "visibility": "public"})
    if status not in (201, 422):
        sys.exit(f"creating organization {org} in Gitea failed: HTTP {status}")
if call("GET", f"/repos/{org}/{repo}") == 404:
    status = call("POST", f"/orgs/{org}/repos", {"name": repo, "private": False})
    if status not in (201, 409):
        sys.exit(f"creating repository {org}/{repo} in Gitea failed: HTTP {status}")
print(f"SHADOW_RESULT {org}/{repo}")
"""
