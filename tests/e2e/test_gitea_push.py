"""Hostile tenants and their Gitea on kind (issue 18, rows H2, L5, R1), through the CLI as a user runs it.

A tenant plants canaries in its repository from inside its workspace (hooks, fsmonitor, a clean filter,
credential helpers, `include.path`, `http.proxy`, an `insteadOf` sending its Gitea's URL to a dead address);
the environment is forked and both are promoted to a branch. No canary may ever see either environment's
Gitea token and every push must land in the environment's own Gitea. A git-lfs repository uploaded with
`shadowctl create --local` copies in with its large file, which a clone from Gitea in the workspace gets too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import uuid
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, git
from tests.e2e.test_cli_sdk import REQUESTS, TIMEOUT, ctl, ok

pytestmark = pytest.mark.e2e

# Run in the workspace root by the tenant: every canary appends what its process holds to canaries/*.log.
PLANT = r"""
set -eu
mkdir -p canaries
canary() { printf '#!/bin/sh\n{ echo "== $0 $*"; env; } >> %s/canaries/%s.log\ncat >/dev/null 2>&1 || true\n' "$PWD" "$1" > "$2"; chmod +x "$2"; }
for hook in pre-push reference-transaction post-commit pre-commit; do canary "hook-$hook" "core/.git/hooks/$hook"; done
canary fsmonitor core/.git/fsmonitor.sh
canary credential core/.git/credential.sh
canary included core/.git/included.sh
printf '#!/bin/sh\n{ echo "== filter"; env; } >> %s/canaries/filter.log\ncat\n' "$PWD" > core/.git/clean.sh
chmod +x core/.git/clean.sh
printf '[credential]\n\thelper = %s/core/.git/included.sh\n' "$PWD" > core/.git/extra.config
cd core
git config core.fsmonitor "$PWD/.git/fsmonitor.sh"
git config credential.helper "$PWD/.git/credential.sh"
git config include.path "$PWD/.git/extra.config"
git config http.proxy http://127.0.0.1:9
git config "url.http://127.0.0.1:9/.insteadOf" "$SHADOW_GITEA_URL/"
git config filter.canary.clean "$PWD/.git/clean.sh"
echo '* filter=canary' > .gitattributes
echo 'print("promoted")' > app.py
"""


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def create(cluster: Cluster, ns: str, name: str, repo: Path) -> dict[str, object]:
    status = json.loads(
        ok(
            ctl(
                cluster, "create", name, "-n", ns, "--local", str(repo), "--cpu", REQUESTS["cpu"],
                "--memory", REQUESTS["memory"], "--timeout", TIMEOUT, "-o", "json",
            )
        )
    )  # fmt: skip
    assert status["sourcesReady"] == "1/1", status
    return dict(status)


def token(cluster: Cluster, ns: str, env: str) -> str:
    secret = cluster.core.read_namespaced_secret(f"{env}-gitea-admin", ns)
    return base64.b64decode(secret.data["token"]).decode()


def sh(cluster: Cluster, ns: str, env: str, script: str) -> str:
    return ok(ctl(cluster, "exec", env, "-n", ns, "--", "sh", "-c", script))


def test_canaries_never_see_the_token_and_pushes_land_in_the_own_gitea(
    cluster: Cluster, e2e_namespace: str, tmp_path: Path
) -> None:
    ns = e2e_namespace
    source = unique("hostile")
    repo = tmp_path / "core"
    repo.mkdir()
    (repo / "app.py").write_text('print("v1")\n')
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "v1")
    create(cluster, ns, source, repo)
    sh(cluster, ns, source, PLANT)

    fork = f"{source}-fork"
    ok(ctl(cluster, "fork", source, fork, "-n", ns, "--no-verify", "--timeout", TIMEOUT, "-o", "json"))
    for env in (source, fork):
        pushed = json.loads(
            ok(
                ctl(
                    cluster,
                    "promote",
                    env,
                    "-n",
                    ns,
                    "--source",
                    "core",
                    "--to-branch",
                    "review/x",
                    "-o",
                    "json",
                )
            )
        )
        # The push reached this environment's own Gitea (not the dead address the tenant's insteadOf names).
        status = json.loads(ok(ctl(cluster, "status", env, "-n", ns, "-o", "json")))
        url = status["sources"][0]["cloneURL"]
        listed = sh(cluster, ns, env, f"cd / && git ls-remote {url} refs/heads/review/x")
        assert listed.split()[0] == pushed["commit"], listed
        shown = sh(
            cluster, ns, env, f"cd /tmp && rm -rf c && git clone -q -b review/x {url} c && cat c/app.py"
        )
        assert shown.strip() == 'print("promoted")'

    seen = sh(cluster, ns, fork, "cat canaries/*.log 2>/dev/null || true")
    seen += sh(cluster, ns, source, "cat canaries/*.log 2>/dev/null || true")
    assert "== filter" in seen  # the tenant's own filter ran, in its workspace, where no token is
    for env in (source, fork):
        assert token(cluster, ns, env) not in seen
    for env in (fork, source):
        ok(ctl(cluster, "destroy", env, "-n", ns))


def test_lfs_repository_copies_in_with_its_large_file(
    cluster: Cluster, e2e_namespace: str, tmp_path: Path
) -> None:
    ns = e2e_namespace
    name = unique("lfs")
    repo = tmp_path / "art"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "lfs", "install", "--local")
    git(repo, "lfs", "track", "*.bin")
    weights = os.urandom(5 << 20)
    (repo / "model.bin").write_bytes(weights)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "weights")
    status = create(cluster, ns, name, repo)
    digest = hashlib.sha256(weights).hexdigest()
    assert sh(cluster, ns, name, "sha256sum art/model.bin").split()[0] == digest
    url = status["sources"][0]["cloneURL"]  # type: ignore[index]
    cloned = sh(cluster, ns, name, f"cd /tmp && rm -rf a && git clone -q {url} a && sha256sum a/model.bin")
    assert cloned.split()[0] == digest
    ok(ctl(cluster, "destroy", name, "-n", ns))
