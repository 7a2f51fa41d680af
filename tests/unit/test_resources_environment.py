"""ShadowEnvironment's pure builders, the copy-in program (run for real with git) and the verdict."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.environment import ShadowEnvironment, ShadowEnvironmentStatus
from shadow_operator.common.sources import SourcePlan, plan_sources
from shadow_operator.common.verdict import (
    CODE_EXECUTION,
    INSTALLATION_HEALTH,
    SOURCE_VERIFICATION,
    CheckResult,
    score_verdict,
)
from shadow_operator.resources import copyin
from shadow_operator.resources import environment as res

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def environment(**spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "shadow.dev/v1alpha1",
        "kind": "ShadowEnvironment",
        "metadata": {"name": "demo", "namespace": "team", "uid": "u-1", "generation": 1},
        "spec": {
            "sources": [
                {"name": "core", "repo": "microsoft/amplifier-core", "upload": {}},
                {
                    "name": "lib",
                    "repo": "lib",
                    "path": "libs/lib",
                    "git": {"url": "https://example.com/lib.git"},
                },
            ],
            **spec,
        },
    }
    # Defaults as the API server applies them from the generated schema.
    return ShadowEnvironment.from_body(body).model_dump(by_alias=True, exclude_none=True) | {
        "metadata": body["metadata"]
    }


def template() -> dict[str, Any]:
    return {
        "metadata": {"name": "workspace", "namespace": "team"},
        "spec": {
            "service": True,
            "podTemplate": {
                "metadata": {"labels": {"app": "ws"}},
                "spec": {
                    "containers": [
                        {
                            "name": "runtime",
                            "image": "ws:1",
                            "args": ["--root", "/workspace", "--port", "8888"],
                            "ports": [
                                {"name": "runtime", "containerPort": 8888},
                                {"name": "preview", "containerPort": 3000},
                            ],
                            "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
                        }
                    ],
                    "volumes": [{"name": "workspace", "emptyDir": {}}],
                },
            },
        },
    }


def test_the_environments_resources_keep_the_templates_other_limits() -> None:
    """`shadowctl create --cpu 500m` on a template with a memory limit: the limit stays (it was dropped)."""
    base = template()
    base["spec"]["podTemplate"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    env = environment(resources={"requests": {"cpu": "500m"}, "limits": {"cpu": "2"}})
    container = res.build_workspace_sandbox(env, base, gitea_base_url=None)["spec"]["podTemplate"]["spec"][
        "containers"
    ][0]
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "256Mi"},
        "limits": {"memory": "1Gi", "cpu": "2"},
    }


def test_workspace_pod_takes_the_environments_runtime_class_else_the_templates() -> None:
    def runtime_class(env: dict[str, Any], tmpl: dict[str, Any]) -> str | None:
        pod = res.build_workspace_sandbox(env, tmpl, gitea_base_url=None)["spec"]["podTemplate"]["spec"]
        return pod.get("runtimeClassName")

    kata = template()
    kata["spec"]["podTemplate"]["spec"]["runtimeClassName"] = "kata"
    assert runtime_class(environment(runtimeClassName="gvisor"), template()) == "gvisor"
    assert runtime_class(environment(), kata) == "kata"
    assert runtime_class(environment(runtimeClassName="gvisor"), kata) == "gvisor"
    assert runtime_class(environment(), template()) is None


def test_workspace_sandbox_mounts_a_volume_at_the_preserved_path() -> None:
    env = environment(
        workspace={"mountPath": "/home/dev/src", "size": "5Gi", "storageClassName": "fast"},
        env=[{"name": "MODE", "value": "shadow"}],
        preview={"port": 5173},
        resources={"limits": {"memory": "1Gi"}},
    )
    sandbox = res.build_workspace_sandbox(env, template(), gitea_base_url="http://demo-gitea.team.svc:3000")
    spec = sandbox["spec"]
    pod = spec["podTemplate"]["spec"]
    container = pod["containers"][0]
    assert sandbox["metadata"]["name"] == "demo"
    assert sandbox["metadata"]["labels"][c.LABEL_ENVIRONMENT] == "demo"
    assert "annotations" not in sandbox["metadata"]
    private = environment()
    private["metadata"]["annotations"] = {c.ANNOTATION_PREVIEW_ACCESS: "private"}
    built = res.build_workspace_sandbox(private, template(), gitea_base_url=None)
    assert built["metadata"]["annotations"] == {c.ANNOTATION_PREVIEW_ACCESS: "private"}
    # Under the template's managed NetworkPolicy, like a claim's sandbox.
    assert sandbox["metadata"]["labels"][c.LABEL_TEMPLATE_REF_HASH] == naming.name_hash(
        template()["metadata"]["name"]
    )
    assert container["args"] == ["--root", "/home/dev/src", "--port", "8888"]
    assert container["workingDir"] == "/home/dev/src"
    assert container["volumeMounts"] == [{"name": "workspace", "mountPath": "/home/dev/src"}]
    assert pod["volumes"] == []  # the template's emptyDir gives way to the PVC
    assert spec["volumeClaimTemplates"] == [
        {
            # Labelled with the environment, so `shadowctl cleanup` can tell a leftover volume from a live one.
            "metadata": {
                "name": "workspace",
                "labels": {
                    "shadow.dev/environment": env["metadata"]["name"],
                    "shadow.dev/component": "workspace",
                    "app.kubernetes.io/managed-by": "shadow-operator",
                },
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "5Gi"}},
                "storageClassName": "fast",
            },
        }
    ]
    env_vars = {e["name"]: e["value"] for e in container["env"]}
    assert env_vars["MODE"] == "shadow"
    assert env_vars[c.ENV_GITEA_URL] == "http://demo-gitea.team.svc:3000"
    assert env_vars["SANDBOX_RUNTIME_ROOT"] == "/home/dev/src"
    assert {"name": "preview", "containerPort": 5173, "protocol": "TCP"} in container["ports"]
    assert not any(p["containerPort"] == 3000 for p in container["ports"])
    assert container["resources"] == {"limits": {"memory": "1Gi"}}
    assert spec["service"] is True
    assert spec["operatingMode"] == "Running"
    idle = res.build_workspace_sandbox(env, template(), gitea_base_url=None, suspended=True)
    assert idle["spec"]["operatingMode"] == "Suspended"
    assert idle["spec"]["volumeClaimTemplates"] == spec["volumeClaimTemplates"]  # the volume stays
    # The template itself is not modified.
    assert template()["spec"]["podTemplate"]["spec"]["volumes"] == [{"name": "workspace", "emptyDir": {}}]


def test_git_rewrites_are_understood_by_git_itself(tmp_path: Path) -> None:
    """The environment variables make real git fetch the named prefix from the local "Gitea"."""
    gitea = tmp_path / "gitea"
    bare = gitea / "microsoft" / "amplifier-core"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
    work = tmp_path / "work"
    git(tmp_path, "init", "-q", "-b", "main", str(work))
    (work / "README").write_text("hello\n")
    git(work, "add", "README")
    git(work, "commit", "-q", "-m", "one")
    git(work, "push", "-q", str(bare), "main")

    rewrites = [{"from": "https://github.com/microsoft/", "to": "microsoft"}]
    env = {e["name"]: e["value"] for e in res.git_config_env(rewrites, gitea.as_uri())}
    out = subprocess.run(
        ["git", "ls-remote", "https://github.com/microsoft/amplifier-core", "main"],
        env={**clean_env(), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split()[0] == git(work, "rev-parse", "HEAD")
    # Only the named prefix is redirected.
    other = subprocess.run(
        ["git", "config", "--get-urlmatch", "url.insteadOf", "https://github.com/google/x"],
        env={**clean_env(), **env},
        capture_output=True,
        text=True,
    )
    assert other.returncode == 1


def test_gitea_statefulset_keeps_its_data_on_an_emptydir_by_default() -> None:
    env = environment()
    sts = res.build_gitea_statefulset(env, image="gitea:1", cluster_domain="cluster.local")
    assert sts["metadata"]["name"] == "demo-gitea"
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    password = next(e for e in container["env"] if e["name"] == "GITEA_ADMIN_PASSWORD")
    assert password["valueFrom"]["secretKeyRef"] == {"name": "demo-gitea-admin", "key": "password"}
    assert pod["automountServiceAccountToken"] is False
    # No claim to wait for: the data directory is the Pod's own, limited to persistence.size.
    assert "volumeClaimTemplates" not in sts["spec"]
    assert "persistentVolumeClaimRetentionPolicy" not in sts["spec"]
    assert pod["volumes"] == [{"name": res.GITEA_DATA_VOLUME, "emptyDir": {"sizeLimit": "1Gi"}}]
    assert container["volumeMounts"] == [{"name": res.GITEA_DATA_VOLUME, "mountPath": res.GITEA_DATA_PATH}]
    service = res.build_gitea_service(env)
    assert service["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]


def test_gitea_statefulset_on_a_volume_when_asked_for_kept_when_retained() -> None:
    env = environment(
        gitea={"persistence": {"enabled": True, "size": "2Gi"}}, workspace={"storageClassName": "fast"}
    )
    sts = res.build_gitea_statefulset(
        env, image="gitea:1", cluster_domain="cluster.local", on_volume=res.gitea_on_volume(env, None)
    )
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    [claim] = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == res.GITEA_DATA_VOLUME
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    assert "volumes" not in sts["spec"]["template"]["spec"]
    retained = environment(gitea={"persistence": {"enabled": True, "retain": True}})
    sts = res.build_gitea_statefulset(
        retained, image="gitea:1", cluster_domain="cluster.local", on_volume=True
    )
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"


def test_gitea_keeps_the_storage_its_statefulset_was_created_with() -> None:
    """volumeClaimTemplates cannot change: an environment whose Gitea has a claim (made before emptyDir was
    the default) keeps it, and one on an emptyDir never gains one."""
    plain = environment()
    asked = environment(gitea={"persistence": {"enabled": True}})
    with_claim = res.build_gitea_statefulset(plain, image="g", cluster_domain="c", on_volume=True)
    without = res.build_gitea_statefulset(asked, image="g", cluster_domain="c", on_volume=False)
    assert res.gitea_on_volume(plain, None) is False
    assert res.gitea_on_volume(asked, None) is True
    # retain needs a volume (admission refuses it without enabled; an object from before keeps one).
    assert res.gitea_on_volume(environment(gitea={"persistence": {"retain": True}}), None) is True
    assert res.gitea_on_volume(plain, with_claim) is True
    assert res.gitea_on_volume(asked, without) is False


def test_sources_are_planned_with_default_organization_and_public_url() -> None:
    plans = plan_sources(environment(gitea={"organization": "team"}))
    assert [(p.name, p.path, p.full_repo, p.upload) for p in plans] == [
        ("core", "core", "microsoft/amplifier-core", True),
        ("lib", "libs/lib", "team/lib", False),
    ]
    rewrites = [{"from": "https://github.com/microsoft/", "to": "microsoft"}]
    assert res.public_url(plans[0], rewrites) == "https://github.com/microsoft/amplifier-core"
    assert res.public_url(plans[1], rewrites) is None


# ------------------------------------------------------------------------------------------- failures
def test_pod_failures_map_to_codes() -> None:
    pulling = {
        "status": {
            "containerStatuses": [
                {
                    "image": "nope:1",
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}},
                }
            ]
        }
    }
    code, message = res.pod_failure(pulling, "workspace Pod", NOW) or ("", "")
    assert code == "ImagePullFailed" and "nope:1" in message

    def unschedulable(age: float, message: str) -> dict[str, Any]:
        since = (NOW - timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ")
        cond = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": since,
        }
        return {"status": {"conditions": [cond]}}

    assert res.pod_failure(unschedulable(5, "0/3 nodes are available: Insufficient cpu"), "Pod", NOW) is None
    assert (
        res.pod_failure(unschedulable(60, "0/3 nodes are available: Insufficient cpu"), "Pod", NOW) or ("",)
    )[0] == "Unschedulable"
    unbound = unschedulable(60, "pod has unbound immediate PersistentVolumeClaims")
    assert (res.pod_failure(unbound, "Pod", NOW) or ("",))[0] == "StorageUnavailable"
    assert res.pod_failure({"status": {"phase": "Running"}}, "Pod", NOW) is None
    # The Sandbox's Pod and its PVCs are created together: the scheduler's first try can miss the claim, and
    # while the volume is then provisioned (WaitForFirstConsumer) that stale message stays on the Pod.
    raced = unschedulable(60, '0/1 nodes are available: persistentvolumeclaim "workspace-x" not found.')
    assert res.pod_failure(raced, "Pod", NOW) is None


# -------------------------------------------------------------------------------------------- copy-in
def git(cwd: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, env=clean_env(), capture_output=True, text=True, check=True)
    return out.stdout.strip()


def clean_env() -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "dev",
        "GIT_AUTHOR_EMAIL": "dev@example.com",
        "GIT_COMMITTER_NAME": "dev",
        "GIT_COMMITTER_EMAIL": "dev@example.com",
    }


def run_copy_in(root: Path, plan: SourcePlan, remote: Path) -> list[str]:
    """SNAPSHOT in `root`, then its bundle's refs fetched into the bare repository `remote` as they are."""
    env = {**clean_env(), **copyin.snapshot_env(plan, bundle="out/snapshot.bundle")}
    out = subprocess.run(["sh", "-c", copyin.SNAPSHOT], cwd=root, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    fields = copyin.parse_result(out.stdout)
    assert fields is not None
    git(remote, "fetch", "-q", str(root / "out/snapshot.bundle"), "+refs/*:refs/*")
    return fields


def test_copy_in_snapshots_uncommitted_work_without_touching_the_copy(tmp_path: Path) -> None:
    root = tmp_path / "workspace"
    src = root / "core"
    git(tmp_path, "init", "-q", "-b", "main", str(src))
    (src / ".gitignore").write_text("*.log\n")
    (src / "lib.py").write_text("VERSION = 1\n")
    git(src, "add", ".")
    git(src, "commit", "-q", "-m", "v1")
    git(src, "branch", "feature")
    committed = git(src, "rev-parse", "HEAD")
    (src / "lib.py").write_text("VERSION = 2  # uncommitted\n")
    (src / "new.py").write_text("print('untracked')\n")
    (src / "debug.log").write_text("ignored\n")
    remote = tmp_path / "gitea.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)

    plan = SourcePlan("core", "core", "org", "core", None, None, upload=True)
    commit, branch = run_copy_in(root, plan, remote)

    assert branch == "main" and commit != committed
    assert git(remote, "rev-parse", copyin.SNAPSHOT_REF) == commit
    assert git(remote, "rev-parse", "feature") == committed  # other branches travel along
    assert git(remote, "show", f"{commit}:lib.py") == "VERSION = 2  # uncommitted"
    assert git(remote, "show", f"{commit}:new.py") == "print('untracked')"
    files = git(remote, "ls-tree", "--name-only", commit).split()
    assert "debug.log" not in files
    # The copy still looks like the user's checkout: same HEAD, the change still uncommitted.
    assert git(src, "rev-parse", "HEAD") == committed
    assert "M lib.py" in git(src, "status", "--porcelain")
    assert "refs/shadow" not in git(src, "for-each-ref")  # the bundle's ref does not stay behind
    # Run again: the same snapshot (idempotent), nothing new.
    assert run_copy_in(root, plan, remote) == [commit, "main"]


def test_copy_in_clones_a_git_source_at_a_ref(tmp_path: Path) -> None:
    upstream = tmp_path / "upstream"
    git(tmp_path, "init", "-q", "-b", "main", str(upstream))
    (upstream / "a.txt").write_text("one\n")
    git(upstream, "add", ".")
    git(upstream, "commit", "-q", "-m", "one")
    first = git(upstream, "rev-parse", "HEAD")
    (upstream / "a.txt").write_text("two\n")
    git(upstream, "commit", "-q", "-am", "two")
    remote = tmp_path / "gitea.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    root = tmp_path / "workspace"
    root.mkdir()

    plan = SourcePlan("up", "deps/up", "org", "up", upstream.as_uri(), first, upload=False)
    commit, _ = run_copy_in(root, plan, remote)
    assert commit == first
    assert (root / "deps/up/a.txt").read_text() == "one\n"
    assert git(remote, "rev-parse", copyin.SNAPSHOT_REF) == first


def test_copy_in_reports_a_missing_upload(tmp_path: Path) -> None:
    plan = SourcePlan("core", "core", "org", "core", None, None, upload=True)
    env = {**clean_env(), **copyin.snapshot_env(plan, bundle=None)}
    out = subprocess.run(["sh", "-c", copyin.SNAPSHOT], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 3 and "missing" in out.stderr
    assert copyin.parse_result(out.stdout) is None


def test_redact_and_tail() -> None:
    assert copyin.redact("token abc leaked abc", ["abc"]) == "token *** leaked ***"
    text = "\n".join(f"line {i}" for i in range(500))
    assert copyin.tail(text, 50).endswith("line 499") and len(copyin.tail(text, 50)) <= 51


# -------------------------------------------------------------------------------------------- verdict
def test_verdict_scales_applicable_categories_and_round_trips() -> None:
    checks = {
        SOURCE_VERIFICATION: [CheckResult("core in workspace", True), CheckResult("core in Gitea", True)],
        INSTALLATION_HEALTH: [CheckResult("core installs", False, "exit code 1: no setup.py")],
        CODE_EXECUTION: [],
    }
    verdict = score_verdict(checks, pass_threshold=75, verified_at=NOW, generation=3)
    assert verdict["result"] == "FAIL"
    assert verdict["score"] == 50 and verdict["maxScore"] == 100
    assert verdict["evidence"][SOURCE_VERIFICATION]["score"] == 30
    assert CODE_EXECUTION not in verdict["evidence"]
    assert verdict["issues"] == ["installationHealth: core installs failed: exit code 1: no setup.py"]
    status = ShadowEnvironmentStatus.model_validate({"verdict": verdict})
    assert status.model_dump(by_alias=True, exclude_none=True, mode="json")["verdict"] == {
        **verdict,
        "verifiedAt": "2026-11-23T12:00:00Z",
    }
    passed = score_verdict(
        {SOURCE_VERIFICATION: [CheckResult("x", True)]}, pass_threshold=75, verified_at=NOW, generation=1
    )
    assert passed["result"] == "PASS" and passed["score"] == 100
    empty = score_verdict({}, pass_threshold=0, verified_at=NOW, generation=1)
    assert empty["result"] == "FAIL" and empty["issues"]
