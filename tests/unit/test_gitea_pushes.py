"""Pure pieces of the operator's Gitea pushes: network policies, push requests, refspecs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.environment import PushRequest, PushStatus
from shadow_operator.clients.gitpush import PUSH_CONFIG, PushFailed, _Git, push_refspecs
from shadow_operator.controllers.environment.pushes import pending_request
from shadow_operator.resources import gitea_policy

pytestmark = pytest.mark.unit


def environment(name: str = "demo") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team"}, "spec": {}}


# ------------------------------------------------------------------------------------ network policies
def test_gitea_admits_only_its_own_workspace_and_the_operator_and_calls_nobody() -> None:
    gitea, workspace = gitea_policy.build_gitea_network_policies(environment(), "shadow-system")
    spec = gitea["spec"]
    assert spec["podSelector"]["matchLabels"] == {c.LABEL_ENVIRONMENT: "demo", c.LABEL_COMPONENT: "gitea"}
    assert spec["policyTypes"] == ["Ingress", "Egress"] and "egress" not in spec  # no egress, not even DNS
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 3000}]
    own_workspace = {c.LABEL_SANDBOX_NAME_HASH: naming.name_hash("demo"), c.LABEL_ENVIRONMENT: "demo"}
    assert rule["from"] == [
        {"podSelector": {"matchLabels": own_workspace}},
        {
            # The operator's Pods only, not its whole namespace (the preview router lives there too).
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "shadow-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}},
        },
    ]
    assert workspace["spec"]["podSelector"]["matchLabels"] == own_workspace
    assert workspace["spec"]["policyTypes"] == ["Egress"]
    assert workspace["spec"]["egress"] == [
        {
            "to": [
                {"podSelector": {"matchLabels": {c.LABEL_ENVIRONMENT: "demo", c.LABEL_COMPONENT: "gitea"}}}
            ],
            "ports": [{"protocol": "TCP", "port": 3000}],
        }
    ]


def test_two_environments_policies_do_not_overlap() -> None:
    a_gitea, a_ws = gitea_policy.build_gitea_network_policies(environment("a"), "ops")
    b_gitea, b_ws = gitea_policy.build_gitea_network_policies(environment("b"), "ops")
    # Workspace a may reach Gitea a only; Gitea b admits workspace b only.
    assert a_ws["spec"]["egress"][0]["to"][0]["podSelector"] == {
        "matchLabels": a_gitea["spec"]["podSelector"]["matchLabels"]
    }
    assert b_gitea["spec"]["ingress"][0]["from"][0]["podSelector"] == b_ws["spec"]["podSelector"]
    assert a_ws["spec"]["podSelector"] != b_ws["spec"]["podSelector"]
    assert {p["metadata"]["name"] for p in (a_gitea, a_ws, b_gitea, b_ws)} == {
        "a-gitea",
        "a-workspace-to-gitea",
        "b-gitea",
        "b-workspace-to-gitea",
    }


# --------------------------------------------------------------------------------------- push requests
def annotations(request: Any) -> dict[str, str]:
    return {c.ANNOTATION_PUSH_REQUEST: request if isinstance(request, str) else json.dumps(request)}


def test_push_requests_are_parsed_once_and_answered_once() -> None:
    promote = {"id": "a1", "source": "core", "branch": "feature/x", "message": "wip"}
    request = pending_request(annotations(promote), None)
    assert isinstance(request, PushRequest)
    assert (request.source, request.branch, request.message, request.path) == (
        "core",
        "feature/x",
        "wip",
        None,
    )
    assert pending_request(annotations(promote), PushStatus(id="a1", commit="abc")) is None  # answered
    assert pending_request({}, None) is None
    publish = {"id": "b2", "path": ".sandbox-runtime/publish/0a1b", "repo": "team/tool"}
    request = pending_request(annotations(publish), PushStatus(id="a1"))
    assert isinstance(request, PushRequest) and request.repo == "team/tool"


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ("not json", "invalid shadow.dev/push-request annotation"),
        ({"id": "x1", "source": "core"}, "needs the branch"),
        ({"id": "x2", "source": "core", "branch": "b", "path": "p", "repo": "o/r"}, "either a source"),
        ({"id": "x3", "path": "../etc", "repo": "o/r"}, "path"),
        ({"id": "x4", "path": "/abs", "repo": "o/r"}, "path"),
        ({"id": "x5", "path": "p", "repo": "o/../r"}, "repo"),
        ({"id": "x6", "path": "p", "repo": "o/r.git"}, "not a repository"),
        ({"id": "../x", "source": "core", "branch": "b"}, "id"),
    ],
)
def test_bad_push_requests_get_an_answer_that_says_why(request_: Any, message: str) -> None:
    answer = pending_request(annotations(request_), None)
    assert isinstance(answer, PushStatus), answer
    assert answer.error is not None and message in answer.error
    assert answer.id == (request_["id"] if isinstance(request_, dict) else "")
    # Answered: the same bad request is not answered again.
    assert pending_request(annotations(request_), answer) is None


def test_push_request_model_refuses_what_the_sdk_must_not_send() -> None:
    with pytest.raises(ValidationError):
        PushRequest(id="i", source="Core!", branch="b")
    with pytest.raises(ValidationError):
        PushRequest(id="i", path="a", repo="no-org")


# ------------------------------------------------------------------------------------------- refspecs
def test_refspecs_push_the_snapshot_to_its_branch_and_the_rest_alongside() -> None:
    refs = [
        c.GIT_SNAPSHOT_REF,
        "refs/heads/main",
        "refs/heads/feature",
        "refs/remotes/origin/HEAD",
        "refs/remotes/origin/main",
        "refs/remotes/origin/release",
        "refs/remotes/origin/feature",
        "refs/tags/v1",
    ]
    assert push_refspecs(refs, "main", everything=True) == [
        f"+{c.GIT_SNAPSHOT_REF}:refs/heads/main",
        "+refs/heads/feature:refs/heads/feature",
        "+refs/remotes/origin/release:refs/heads/release",
        "+refs/tags/*:refs/tags/*",
    ]
    # A promote pushes the snapshot alone.
    assert push_refspecs(refs, "wip", everything=False) == [f"+{c.GIT_SNAPSHOT_REF}:refs/heads/wip"]
    assert push_refspecs([c.GIT_SNAPSHOT_REF], "main", everything=True) == [
        f"+{c.GIT_SNAPSHOT_REF}:refs/heads/main"
    ]


# ---------------------------------------------------------------------------------------------- git runs
def test_operator_git_is_bounded_and_never_prints_the_token(tmp_path: Path) -> None:
    src = tmp_path / "src"
    subprocess.run(["git", "init", "-q", "-b", "main", str(src)], check=True)
    (src / "noise").write_bytes(os.urandom(256 * 1024))  # incompressible: the pack is as large
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a"}
    env["GIT_COMMITTER_EMAIL"] = "a@b"
    subprocess.run(["git", "-C", str(src), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(src), "commit", "-qm", "x"], check=True, env=env)
    bundle = tmp_path / "b.bundle"
    subprocess.run(["git", "-C", str(src), "bundle", "create", "-q", str(bundle), "main"], check=True)
    home = tmp_path / "home"
    home.mkdir()

    async def fetch(file_limit: int) -> None:
        git = _Git(home, timeout=60, file_limit=file_limit, secrets=["tok3n"])
        repo = tmp_path / f"repo-{file_limit}.git"
        await git.run("init", "-q", "--bare", "--template=", str(repo))
        await git.run("fetch", "-q", str(bundle), "+refs/heads/*:refs/heads/*", cwd=repo)

    asyncio.run(fetch(1 << 20))
    with pytest.raises(PushFailed, match="git fetch failed"):
        asyncio.run(fetch(64 * 1024))  # the pack it writes may not grow past the limit

    async def push_to_nowhere() -> None:
        git = _Git(home, timeout=60, file_limit=1 << 20, secrets=["tok3n"])
        await git.run("ls-remote", "http://127.0.0.1:9/tok3n.git", config=list(PUSH_CONFIG))

    with pytest.raises(PushFailed) as failed:
        asyncio.run(push_to_nowhere())
    assert "tok3n" not in str(failed.value) and "***" in str(failed.value)
