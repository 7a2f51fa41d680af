"""The handoff manifest (seed 001): built from an environment's status and diff, or from local directories in
fallback mode; every manifest produced validates against the JSON Schema checked in, which is current."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.sdk import hostonly
from shadow_operator.sdk import manifest as m
from shadow_operator.sdk.environment import LocalSource
from shadow_operator.sdk.runtime import Diff

pytestmark = pytest.mark.unit

SCHEMA = json.loads(m.SCHEMA_PATH.read_text())


def validate(data: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(data)


def environment(**status: Any) -> ShadowEnvironment:
    return ShadowEnvironment.from_body(
        {
            "apiVersion": "shadow.dev/v1alpha1",
            "kind": "ShadowEnvironment",
            "metadata": {
                "name": "my-change",
                "namespace": "ns",
                "annotations": {"local.shadow.dev/core": "/home/me/core"},
            },
            "spec": {"sources": [{"name": "core", "repo": "microsoft/core", "upload": {}}]},
            "status": status,
        }
    )


SOURCES = [
    {
        "name": "core",
        "repo": "microsoft/core",
        "path": "core",
        "commit": "a" * 40,
        "branch": "shadow/snapshot",
        "cloneURL": "http://gitea/microsoft/core.git",
        "publicURL": "https://github.com/microsoft/amplifier-core.git",
    },
    {
        "name": "tool",
        "repo": "shadow/tool",
        "path": "tool",
        "commit": "b" * 40,
        "branch": "main",
        "cloneURL": "http://gitea/shadow/tool.git",
    },
]
READY = [
    {
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
]
VERDICT = {"result": "PASS", "score": 90, "maxScore": 100, "passThreshold": 75, "mode": "shadow"}


def test_manifest_names_only_directories_this_machine_recorded() -> None:
    """The annotation is the cluster's word (a co-tenant may patch it to `~`): an agent acting on the manifest
    is sent only to the directory this machine recorded, and only while the two agree."""
    env = environment(conditions=READY, sources=SOURCES)

    def paths(recorded: dict[str, str]) -> list[str | None]:
        return [s["path"] for s in m.build_manifest(env, None, {}, recorded).dump()["local_sources"]]

    assert paths({"core": "/home/me/core"}) == ["/home/me/core", None]
    assert paths({}) == [None, None]
    assert paths({"core": "/home/me/elsewhere"}) == [None, None]


def test_manifest_from_status_and_diff() -> None:
    env = environment(conditions=READY, sources=SOURCES, verdict=VERDICT)
    diff = Diff(
        added=["core/src/core/new.py"],
        # HANDOFF.md is the runtime's, at the workspace root: no source's change.
        modified=["core/core/__init__.py", "tool/cmd/main.go", "HANDOFF.md"],
        deleted=["core/README.md"],
    )
    built = m.build_manifest(env, diff, {"core": "python", "tool": "go"}, {"core": "/home/me/core"})
    data = built.dump()
    validate(data)
    assert data["shadow_id"] == "my-change" and data["shadow_available"] is True
    assert data["local_sources"] == [
        {
            "name": "core",
            "path": "/home/me/core",
            "github_repo": "microsoft/amplifier-core",
            "snapshot_commit": "a" * 40,
            "project_type": "python",
        },
        {
            "name": "tool",
            "path": None,
            "github_repo": "shadow/tool",
            "snapshot_commit": "b" * 40,
            "project_type": "go",
        },
    ]
    assert data["test_context"] == {
        "changed_files": [
            "core/README.md",
            "core/core/__init__.py",
            "core/src/core/new.py",
            "tool/cmd/main.go",
        ],
        "affected_modules": ["core", "core.new", "cmd"],
        "project_type": "python",
    }
    assert (data["fallback_mode"], data["failure_reason"], data["mode"]) == (False, None, "shadow")
    assert data["verdict"]["maxScore"] == 100


def test_a_failed_environment_is_not_available_and_says_why() -> None:
    failed = environment(failure={"code": "TemplateNotFound", "message": "no template"})
    data = m.build_manifest(failed, None, {}, {}).dump()
    validate(data)
    assert data["shadow_available"] is False and data["failure_reason"] == "TemplateNotFound"
    assert data["local_sources"] == [] and data["test_context"]["changed_files"] == []


def verdict(result: str, failed: list[str], score: int) -> dict[str, Any]:
    checks = {
        "sourceVerification": [{"name": "copied", "passed": "sourceVerification" not in failed}],
        "codeExecution": [{"name": "pytest", "passed": "codeExecution" not in failed, "detail": "exit 1"}],
    }
    return {
        "result": result, "score": score, "maxScore": 100, "passThreshold": 75, "mode": "shadow",
        "evidence": {k: {"score": 0, "maxScore": 50, "checks": v} for k, v in checks.items()},
        "issues": [f"{k}: failed" for k in failed],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("result", "failed", "score", "state"),
    [
        ("PASS", [], 100, "pass"),
        ("PASS", ["codeExecution"], 80, "needs-work"),
        ("FAIL", ["codeExecution"], 60, "fail"),
    ],
)
def test_the_verdict_also_speaks_the_seeds_names(
    result: str, failed: list[str], score: int, state: str
) -> None:
    """Seed 001's response (issues_found, recommendations, snake_case evidence) and seed 000's three-way state
    beside today's verdict, so a smoke-test agent written against the seeds reads the manifest unchanged."""
    env = environment(conditions=READY, sources=SOURCES, verdict=verdict(result, failed, score))
    data = m.build_manifest(env, Diff(), {}, {}).dump()
    validate(data)
    seed = data["smoke_test"]
    assert (seed["verdict"], seed["state"], seed["score"], seed["max_score"]) == (result, state, score, 100)
    assert sorted(seed["evidence"]) == ["code_execution", "source_verification"]
    assert seed["issues_found"] == data["verdict"]["issues"]
    assert len(seed["recommendations"]) == len(failed)
    if failed:
        assert "shadowctl verify" in seed["recommendations"][0]
    assert data["seed_failure_reason"] is None


@pytest.mark.parametrize(
    ("ours", "seeds"),
    [("ClusterUnreachable", "docker_not_running"), ("OperatorNotRunning", "docker_not_installed"),
     ("ImagePullFailed", "image_not_found"), ("GiteaBootstrapFailed", "create_failed")],
)  # fmt: skip
def test_failure_reasons_map_to_the_seeds_codes(ours: str, seeds: str) -> None:
    """Ours come from the environment's status, or (fallback) from the client's error when there is none."""
    built = m.build_manifest(environment(), None, {}, {}).model_copy(update={"failure_reason": ours})
    data = built.dump()
    validate(data)
    assert (data["failure_reason"], data["seed_failure_reason"]) == (ours, seeds)


def test_schema_refuses_what_the_protocol_does_not_allow() -> None:
    good = m.build_manifest(environment(conditions=READY, sources=SOURCES), Diff(), {}, {}).dump()
    for broken in (
        {**good, "test_context": {**good["test_context"], "project_type": "cobol"}},
        {**good, "fallback_mode": "no"},
        {k: v for k, v in good.items() if k != "shadow_available"},
        {**good, "extra": 1},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate(broken)


def test_checked_in_schema_is_current(tmp_path: Path) -> None:
    assert m.SCHEMA_PATH.read_text() == m.render_schema(), "run: python -m shadow_operator.sdk.manifest"
    assert m.main(["--check"]) == 0
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize(
    ("url", "repo"),
    [
        ("https://github.com/org/name.git", "org/name"),
        ("https://github.com/org/name/", "org/name"),
        ("git@github.com:org/name.git", "org/name"),
        ("https://example.com/", None),
        (None, None),
    ],
)
def test_github_repo(url: str | None, repo: str | None) -> None:
    assert m.github_repo(url, None) == repo


def test_affected_modules_per_project_type() -> None:
    kinds: dict[str, hostonly.ProjectType | None] = {"py": "python", "rs": "rust", "js": "node", "go": "go"}
    files = [
        "py/pkg/a.py", "py/pkg/__init__.py", "py/src/lib/b.py", "py/.github/x.py", "py/docs/readme.md",
        "rs/src/lib.rs", "rs/src/net/mod.rs", "rs/src/net/tcp.rs", "js/src/app.ts", "js/index.js",
        "go/main.go", "go/pkg/x/y.go",
    ]  # fmt: skip
    assert m.affected_modules(files, kinds) == [
        "pkg.a", "pkg", "lib.b", "crate", "crate::net", "crate::net::tcp", "src", ".", "pkg/x",
    ]  # fmt: skip


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True, capture_output=True
    )


def test_fallback_manifest_from_local_directories(tmp_path: Path) -> None:
    repo = tmp_path / "lib"
    (repo / "lib").mkdir(parents=True)
    (repo / "package.json").write_text('{"name": "lib"}')
    (repo / "lib" / "a.js").write_text("1\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "remote", "add", "origin", "git@github.com:acme/lib.git")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "one")
    (repo / "lib" / "a.js").write_text("2\n")
    (repo / "lib" / "b.js").write_text("new\n")
    verdict = hostonly.score(
        {hostonly.CODE_EXECUTION: [hostonly.CheckResult("t", True)]}, "ClusterUnreachable"
    )
    data = m.fallback_manifest([LocalSource(repo)], "ClusterUnreachable", None, verdict).dump()
    validate(data)
    assert data["shadow_id"] is None and data["shadow_available"] is False
    assert (data["fallback_mode"], data["failure_reason"], data["mode"]) == (
        True,
        "ClusterUnreachable",
        "host-only",
    )
    assert data["local_sources"] == [
        {
            "name": "lib",
            "path": str(repo),
            "github_repo": "acme/lib",
            "snapshot_commit": None,
            "project_type": "node",
        }
    ]
    assert data["test_context"] == {
        "changed_files": ["lib/lib/a.js", "lib/lib/b.js"],
        "affected_modules": ["lib"],
        "project_type": "node",
    }
    assert data["verdict"]["mode"] == "host-only" and data["verdict"]["maxScore"] == 50
