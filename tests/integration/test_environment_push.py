"""Hostile tenants and Gitea: copy-in, `promote --to-branch` and publish push without the token ever entering
the workspace, on the local control plane with a real Gitea binary and a real sandbox-runtime on loopback.

kwok plays the kubelet: the operator reaches "the workspace" at SHADOW_RUNTIME_API_URL (one real runtime,
whose root the test fills as the tenant would) and "its Gitea" at SHADOW_GITEA_API_URL (the pinned Gitea
started with the credentials the operator generated). The tenant's repository carries canaries
(tests/support/hostile_repo.py): hooks, fsmonitor, a clean filter, credential helpers, `include.path`,
`http.proxy` and an `insteadOf` that sends Gitea's URL to a canary server. None may ever see the token, and
every push must land in the real Gitea. A git-lfs repository, uploaded the way `shadowctl create --local`
streams it, copies in with its large file.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from shadow_operator.api import constants as c
from shadow_operator.sdk import ShadowGateway
from shadow_operator.sdk.upload import stream_worktree

from tests.runtime.conftest import Server
from tests.support.controlplane import free_port, wait_for
from tests.support.gitea import GiteaServer
from tests.support.githttp import CanaryServer
from tests.support.hostile_repo import canary_text, git, lfs_repository, one_commit, plant_canaries
from tests.support.sandbox_operator import (
    ENVIRONMENT,
    TEMPLATE,
    Objects,
    gitea_operator,
    template_body,
)
from tests.support.volumes import bind_volumes

pytestmark = pytest.mark.integration
V = "v1alpha1"
GITEA_PORT = free_port()
GITEA_URL = f"http://127.0.0.1:{GITEA_PORT}"


@pytest.fixture(scope="module")
def operator(k8s_api: client.ApiClient, runtime: Server) -> Iterator[Any]:
    with gitea_operator(k8s_api, GITEA_URL, SHADOW_RUNTIME_API_URL=runtime.url) as runner:
        yield runner


def raw(path: str) -> bytes:
    """A file of a public repository, read anonymously from Gitea's web route."""
    with urllib.request.urlopen(f"{GITEA_URL}/{path}", timeout=30) as resp:
        return bytes(resp.read())


def test_pushes_never_hand_the_token_to_the_workspace_and_lfs_copies_in(
    objs: Objects, runtime: Server, tmp_path: Path
) -> None:
    objs.create(TEMPLATE, template_body("workspace"))
    volumes = bind_volumes(objs, ["workspace-hostile"], tmp_path)
    canaries = tmp_path / "canaries"
    try:
        objs.create(
            ENVIRONMENT,
            {
                "metadata": {"name": "hostile"},
                "spec": {
                    "sources": [
                        {"name": "core", "repo": "shadow/core", "upload": {}},
                        {"name": "art", "repo": "shadow/art", "upload": {}},
                    ],
                    "workspace": {"size": "1Gi"},
                    "verify": {"enabled": False},
                },
            },
            version=V,
        )
        wait_for(lambda: objs.secret_exists("hostile-gitea-admin"), timeout=30, what="Gitea admin Secret")
        creds = objs.secret_data("hostile-gitea-admin")
        with (
            GiteaServer.standing_in(tmp_path / "gitea", creds, GITEA_PORT) as gitea,
            CanaryServer() as canary,
        ):
            objs.wait_condition(
                ENVIRONMENT,
                "hostile",
                "False",
                "WaitingForUpload",
                type_="SourcesReady",
                timeout=120,
                version=V,
            )
            token = objs.secret_data("hostile-gitea-admin")["token"]

            # The tenant's repository, planted in the workspace; an lfs repository uploaded as the CLI does.
            core = runtime.root / "core"
            plant_canaries(core, canaries, canary_url=canary.url, redirect=f"{GITEA_URL}/")
            head = git(core, "rev-parse", "HEAD")
            local = tmp_path / "local" / "art"
            weights = lfs_repository(local)
            resp = httpx.post(
                f"{runtime.url}/v1/archive/art", content=b"".join(stream_worktree(local)), timeout=120
            )
            assert resp.status_code < 300, resp.text
            objs.annotate(
                ENVIRONMENT,
                "hostile",
                {
                    c.ANNOTATION_UPLOAD_PREFIX + "core": "sha256:a",
                    c.ANNOTATION_UPLOAD_PREFIX + "art": "sha256:b",
                },
                V,
            )
            env = objs.wait_condition(ENVIRONMENT, "hostile", type_="SourcesReady", timeout=120, version=V)

            # Copy-in reached the real Gitea: the snapshot (uncommitted work included) is its main branch.
            sources = {s["name"]: s for s in env["status"]["sources"]}
            gitea.wait_pushed("shadow/core")
            assert (
                gitea.api("GET", "repos/shadow/core/branches/main")["commit"]["id"]
                == sources["core"]["commit"]
            )
            assert raw("shadow/core/raw/branch/main/app.py") == b"print('v2, uncommitted')\n"
            # The lfs source copied in; its large file is in the workspace and, as a plain blob, in Gitea.
            assert (runtime.root / "art" / "model.bin").read_bytes() == weights
            gitea.wait_pushed("shadow/art")
            assert raw("shadow/art/raw/branch/main/model.bin") == weights

            # Promote to a branch through the SDK: the operator pushes; the client never reads the token.
            with ShadowGateway("hostile", namespace=objs.namespace) as gw:
                promoted = gw.promote(
                    source="core", to_branch="review/one", message="promote from the shadow"
                )
            assert promoted["branch"] == "review/one" and promoted["repo"] == "shadow/core"
            branch = gitea.api("GET", "repos/shadow/core/branches/review%2Fone")
            assert branch["commit"]["id"] == promoted["commit"]
            assert branch["commit"]["message"].strip() == "promote from the shadow"
            assert git(core, "rev-parse", "HEAD") == head  # the workspace's checkout is untouched

            # Publish: a directory the client uploaded into the workspace becomes a new repository.
            published = runtime.root / ".sandbox-runtime" / "publish" / "p1"
            published.mkdir(parents=True)
            (published / "setup.py").write_text("from setuptools import setup\nsetup(name='tool')\n")
            request = {"id": "pub1", "path": ".sandbox-runtime/publish/p1", "repo": "team/tool"}
            objs.annotate(ENVIRONMENT, "hostile", {c.ANNOTATION_PUSH_REQUEST: json.dumps(request)}, V)
            env = objs.wait(
                ENVIRONMENT,
                "hostile",
                lambda o: ((o.get("status") or {}).get("lastPush") or {}).get("id") == "pub1",
                timeout=120,
                version=V,
            )
            last = env["status"]["lastPush"]
            assert "error" not in last, last
            gitea.wait_pushed("team/tool")
            assert (
                gitea.api("GET", f"repos/team/tool/branches/{last['branch']}")["commit"]["id"]
                == last["commit"]
            )

            # A request the operator cannot carry out is answered, with the reason.
            bad = {"id": "bad1", "source": "core", "branch": "no..dots"}
            objs.annotate(ENVIRONMENT, "hostile", {c.ANNOTATION_PUSH_REQUEST: json.dumps(bad)}, V)
            env = objs.wait(
                ENVIRONMENT,
                "hostile",
                lambda o: ((o.get("status") or {}).get("lastPush") or {}).get("id") == "bad1",
                timeout=120,
                version=V,
            )
            assert "not a valid branch name" in env["status"]["lastPush"]["error"]

            # Nothing the tenant planted ever saw the token, and no push was redirected.
            assert canary.requests == []
            seen = canary_text(canaries)
            assert "== filter" in seen  # the tenant's own filter ran in its workspace, without the token
            assert token not in seen and creds["password"] not in seen
            text = json.dumps(objs.get(ENVIRONMENT, "hostile", V))
            assert token not in text and creds["password"] not in text
    finally:
        for name in volumes:
            with contextlib.suppress(ApiException):
                objs.core.delete_persistent_volume(name)


def test_a_gitea_pod_that_lost_its_emptydir_gets_the_snapshots_again(
    objs: Objects, runtime: Server, tmp_path: Path
) -> None:
    """Gitea's data is on an emptyDir by default: when its Pod is replaced, the new one starts empty. The
    operator sets the new Gitea up and pushes the copied-in snapshot again (the same commit: the workspace's
    files did not change), and says so in an event."""
    objs.create(TEMPLATE, template_body("workspace"))
    volumes = bind_volumes(objs, ["workspace-amnesia"], tmp_path)
    source = runtime.root / "amnesia"
    source.mkdir(parents=True)
    git(source, "init", "-q", "--initial-branch=main")
    (source / "app.py").write_text("print('v1')\n")
    git(source, "add", "app.py")
    git(source, "commit", "-q", "-m", "v1")
    (source / "app.py").write_text("print('v2, uncommitted')\n")
    try:
        spec = {
            "sources": [{"name": "amnesia", "repo": "shadow/amnesia", "upload": {}}],
            "workspace": {"size": "1Gi"},
            "verify": {"enabled": False},
        }
        objs.create(ENVIRONMENT, {"metadata": {"name": "amnesia"}, "spec": spec}, version=V)
        wait_for(lambda: objs.secret_exists("amnesia-gitea-admin"), timeout=30, what="Gitea admin Secret")
        creds = objs.secret_data("amnesia-gitea-admin")
        login = {"admin_username": creds["username"], "admin_password": creds["password"], "port": GITEA_PORT}
        with GiteaServer(tmp_path / "gitea-1", **login) as gitea:
            objs.wait_condition(
                ENVIRONMENT,
                "amnesia",
                "False",
                "WaitingForUpload",
                type_="SourcesReady",
                timeout=120,
                version=V,
            )
            objs.annotate(ENVIRONMENT, "amnesia", {c.ANNOTATION_UPLOAD_PREFIX + "amnesia": "sha256:a"}, V)
            env = objs.wait_condition(ENVIRONMENT, "amnesia", timeout=120, version=V)
            [copied] = env["status"]["sources"]
            first_pod = env["status"]["giteaPodUID"]
            gitea.wait_pushed("shadow/amnesia")

        # The Pod is replaced (rescheduled, evicted) and its emptyDir with it: a Gitea that knows nothing.
        with GiteaServer(tmp_path / "gitea-2", **login) as fresh:
            objs.core.delete_namespaced_pod("amnesia-gitea-0", objs.namespace, grace_period_seconds=0)
            env = objs.wait(
                ENVIRONMENT,
                "amnesia",
                lambda o: (
                    (o.get("status") or {}).get("giteaPodUID") not in (None, first_pod)
                    and (o.get("status") or {}).get("sourcesReady") == "1/1"
                ),
                timeout=120,
                version=V,
            )
            assert env["status"]["sources"] == [copied]
            fresh.wait_pushed("shadow/amnesia")
            branch = fresh.api("GET", f"repos/shadow/amnesia/branches/{copied['branch']}")
            assert branch["commit"]["id"] == copied["commit"]
            assert raw("shadow/amnesia/raw/branch/main/app.py") == b"print('v2, uncommitted')\n"
            lost = [
                e
                for e in objs.core.list_namespaced_event(objs.namespace).items
                if e.reason == "GiteaDataLost" and e.involved_object.name == "amnesia"
            ]
            assert lost and "amnesia" in lost[0].message
            assert objs.secret_data("amnesia-gitea-admin")["token"]  # a token the new Gitea knows
    finally:
        for name in volumes:
            with contextlib.suppress(ApiException):
                objs.core.delete_persistent_volume(name)


def test_a_git_source_is_cloned_while_gitea_is_not_up_yet(
    objs: Objects, runtime: Server, tmp_path: Path
) -> None:
    """The workspace side of the copy-in does not wait for Gitea: the clone is in the workspace before any
    Gitea answers; the push follows once one does."""
    objs.create(TEMPLATE, template_body("workspace"))
    volumes = bind_volumes(objs, ["workspace-early"], tmp_path)
    upstream = tmp_path / "upstream"
    head = one_commit(upstream)
    try:
        spec = {
            "sources": [{"name": "early", "repo": "shadow/early", "git": {"url": f"file://{upstream}"}}],
            "workspace": {"size": "1Gi"},
            "verify": {"enabled": False},
        }
        objs.create(ENVIRONMENT, {"metadata": {"name": "early"}, "spec": spec}, version=V)
        wait_for(lambda: objs.secret_exists("early-gitea-admin"), timeout=30, what="Gitea admin Secret")
        wait_for(
            lambda: (runtime.root / "early" / ".git").is_dir(),
            timeout=30,
            what="the git source cloned into the workspace with no Gitea up",
        )
        env = objs.get(ENVIRONMENT, "early", V)
        assert env is not None and not (env.get("status") or {}).get("sources")
        gitea_ready = next(x for x in env["status"]["conditions"] if x["type"] == "GiteaReady")
        assert gitea_ready["status"] == "False"

        creds = objs.secret_data("early-gitea-admin")
        login = {"admin_username": creds["username"], "admin_password": creds["password"], "port": GITEA_PORT}
        with GiteaServer(tmp_path / "gitea", **login) as gitea:
            env = objs.wait_condition(ENVIRONMENT, "early", timeout=120, version=V)
            assert [(s["name"], s["commit"]) for s in env["status"]["sources"]] == [("early", head)]
            gitea.wait_pushed("shadow/early")
            assert gitea.api("GET", "repos/shadow/early/branches/main")["commit"]["id"] == head
    finally:
        for name in volumes:
            with contextlib.suppress(ApiException):
                objs.core.delete_persistent_volume(name)
