"""Seed 000's workflow on kind, as a user runs it: from shadowctl, then from the SDK (sync and async).

Two local repositories (one with uncommitted work) become one environment; commands run in it; the change made
there shows in the diff and is promoted back into the local directory (never touching .git); the environment
is destroyed and `shadowctl cleanup` then finds nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from shadow_operator.sdk import AsyncShadowGateway, EnvironmentSpec, LocalSource, ShadowGateway

from tests.e2e.cluster import FULLNAME, OPERATOR_NAMESPACE, Cluster, eventually
from tests.support.hostile_repo import git

pytestmark = pytest.mark.e2e

SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")
ORG = "shadowdemo"
REQUESTS = {"cpu": "10m", "memory": "64Mi"}  # one 2-CPU node is shared with the other e2e tests
TIMEOUT = "420"


def repositories(root: Path) -> tuple[Path, Path]:
    """`core`, a package with uncommitted and untracked work, and `lib`, clean."""
    core, lib = root / "core", root / "lib"
    for repo, module in ((core, "core"), (lib, "lib")):
        (repo / module).mkdir(parents=True)
        (repo / module / "__init__.py").write_text('VERSION = "committed"\n')
        (repo / "remove-me.txt").write_text("goes away in the shadow\n")
        git(repo, "init", "-q", "-b", "main")
        git(repo, "add", ".")
        git(repo, "commit", "-q", "-m", "initial")
    (core / "core" / "__init__.py").write_text('VERSION = "uncommitted"\n')
    (core / "notes.md").write_text("untracked\n")
    return core, lib


def ctl(cluster: Cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "COLUMNS": "200"}
    return subprocess.run(
        [SHADOWCTL, *args], env=env, input=stdin, capture_output=True, text=True, timeout=900
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    )
    assert "Traceback" not in result.stderr
    return result.stdout


# An agent's work inside the workspace: change the uncommitted file, add one, delete one; and in .git too,
# which promote must never carry back.
AGENT_EDIT = (
    "echo 'VERSION = \"edited\"' > core/core/__init__.py && echo new > core/added.txt && "
    "rm core/remove-me.txt && echo tampered > core/.git/description"
)


def assert_promoted(core: Path, head: str) -> None:
    assert (core / "core" / "__init__.py").read_text() == 'VERSION = "edited"\n'
    assert (core / "added.txt").read_text() == "new\n"
    assert not (core / "remove-me.txt").exists()
    assert "tampered" not in (core / ".git" / "description").read_text()
    assert git(core, "rev-parse", "HEAD") == head  # promote writes files; commits stay the user's


def assert_clean(cluster: Cluster, namespace: str) -> None:
    def nothing_left() -> bool | None:
        result = ctl(cluster, "cleanup", "-n", namespace, "-o", "json")
        return (result.returncode == 0 and json.loads(result.stdout) == []) or None

    eventually(nothing_left, "shadowctl cleanup to find nothing", 120)


def test_seed_workflow_with_shadowctl(cluster: Cluster, e2e_namespace: str, tmp_path: Path) -> None:
    ns, name = e2e_namespace, f"cli-{uuid.uuid4().hex[:6]}"
    core, lib = repositories(tmp_path)
    head = git(core, "rev-parse", "HEAD")
    created = ok(
        ctl(
            cluster, "create", name, "-n", ns, "--local", f"{core}:{ORG}/core", "--local", str(lib),
            "--rewrite", f"https://github.com/{ORG}/={ORG}", "--cpu", REQUESTS["cpu"],
            "--memory", REQUESTS["memory"], "--timeout", TIMEOUT, "-o", "json",
        )
    )  # fmt: skip
    status = json.loads(created)["status"]  # -o json prints the object, as kubectl
    assert status["sourcesReady"] == "2/2" and status["verdict"]["result"] == "PASS"
    assert {s["repo"] for s in status["sources"]} == {f"{ORG}/core", "shadow/lib"}

    listed = json.loads(ok(ctl(cluster, "list", "-n", ns, "-o", "json")))["items"]
    assert [o["metadata"]["name"] for o in listed] == [name]
    assert {x["type"]: x["status"] for x in listed[0]["status"]["conditions"]}["Ready"] == "True"

    # exec streams the output and returns the command's exit code.
    assert (
        ok(ctl(cluster, "exec", name, "-n", ns, "--", "cat", "core/core/__init__.py"))
        == 'VERSION = "uncommitted"\n'
    )
    assert ctl(cluster, "exec", name, "-n", ns, "--", "sh", "-c", "echo bye >&2; exit 7").returncode == 7
    ok(ctl(cluster, "exec", name, "-n", ns, "--", "sh", "-c", AGENT_EDIT))
    stat = ok(ctl(cluster, "diff", name, "-n", ns, "--stat"))
    assert "M core/core/__init__.py" in stat and "A core/added.txt" in stat and "D core/remove-me.txt" in stat
    assert ".git" not in stat
    patch = ok(ctl(cluster, "diff", name, "-n", ns))
    assert '+VERSION = "edited"' in patch

    # cp both ways, a file and a directory.
    (tmp_path / "upload.txt").write_text("from my machine\n")
    ok(ctl(cluster, "cp", str(tmp_path / "upload.txt"), f"{name}:lib/upload.txt", "-n", ns))
    ok(ctl(cluster, "cp", f"{name}:lib/upload.txt", str(tmp_path / "back.txt"), "-n", ns))
    assert (tmp_path / "back.txt").read_text() == "from my machine\n"
    ok(ctl(cluster, "cp", f"{name}:lib/lib", str(tmp_path / "libcopy"), "-n", ns))
    assert (tmp_path / "libcopy" / "__init__.py").read_text() == 'VERSION = "committed"\n'

    # A shell from a pipe: the commands run in a PTY and end with the input.
    shell = ok(ctl(cluster, "shell", name, "-n", ns, stdin="echo shell-$((40 + 2))\nexit\n"))
    assert "shell-42" in shell

    # The journal saw the agent's commands.
    journal = json.loads(ok(ctl(cluster, "journal", name, "-n", ns, "-o", "json")))
    assert any("core/added.txt" in (e.get("command") or "") for e in journal)

    dry = json.loads(
        ok(ctl(cluster, "promote", name, "-n", ns, "--source", "core", "--dry-run", "-o", "json"))
    )
    assert dry == [
        {
            "source": "core",
            "localDir": str(core),
            "write": ["added.txt", "core/__init__.py"],
            "delete": ["remove-me.txt"],
            "refused": [],
        }
    ]
    assert (
        core / "core" / "__init__.py"
    ).read_text() == 'VERSION = "uncommitted"\n'  # dry run changed nothing
    refused = ctl(cluster, "promote", name, "-n", ns)  # no terminal to confirm on, no --force
    assert refused.returncode == 1 and "--force" in refused.stderr
    ok(ctl(cluster, "promote", name, "-n", ns, "--force"))
    assert_promoted(core, head)
    assert (lib / "upload.txt").read_text() == "from my machine\n"  # lib's change came back too

    ok(ctl(cluster, "destroy", name, "-n", ns))
    missing = ctl(cluster, "status", name, "-n", ns)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    assert_clean(cluster, ns)


def gateway_spec(core: Path, lib: Path) -> EnvironmentSpec:
    return EnvironmentSpec(
        local=[LocalSource(core, f"{ORG}/core"), LocalSource(lib)],
        rewrites={f"https://github.com/{ORG}/": ORG},
        requests=REQUESTS,
    )


def test_seed_workflow_with_the_sdk(
    cluster: Cluster, e2e_namespace: str, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig)
    core, lib = repositories(tmp_path)
    head = git(core, "rev-parse", "HEAD")
    with ShadowGateway(f"sdk-{uuid.uuid4().hex[:6]}", namespace=e2e_namespace) as shadow:
        env = shadow.start(gateway_spec(core, lib), timeout=float(TIMEOUT))
        assert env.status is not None and env.status.verdict is not None
        assert shadow.exec("cat core/core/__init__.py").stdout == 'VERSION = "uncommitted"\n'
        assert shadow.exec(["sh", "-c", "exit 3"]).exit_code == 3
        shadow.write_file("lib/written.txt", "by the sdk\n")
        assert shadow.read_file("lib/written.txt") == b"by the sdk\n"
        assert shadow.exec(AGENT_EDIT).ok
        diff = shadow.diff(paths_only=True)
        assert "core/core/__init__.py" in diff.modified and "core/remove-me.txt" in diff.deleted
        plans = shadow.promote(source="core")
        assert isinstance(plans, list) and plans[0].write == ["added.txt", "core/__init__.py"]
        assert_promoted(core, head)
        # Two forks (the default class cannot snapshot: both copied), each independent of the other.
        forks = shadow.fork(count=2, verify=False, timeout=float(TIMEOUT))
        assert [f.name for f in forks] == [f"{shadow.name}-fork-1", f"{shadow.name}-fork-2"]
        assert {f.status().status.clone_method for f in forks} == {"Copy"}  # type: ignore[union-attr]
        forks[0].write_file("lib/written.txt", "changed in fork 1\n")
        assert forks[1].read_file("lib/written.txt") == b"by the sdk\n"
        assert shadow.read_file("lib/written.txt") == b"by the sdk\n"
        for fork in forks:
            fork.stop()
        shadow.stop()
    assert_clean(cluster, e2e_namespace)


def test_seed_workflow_with_the_async_sdk(
    cluster: Cluster, e2e_namespace: str, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig)
    core, lib = repositories(tmp_path)
    head = git(core, "rev-parse", "HEAD")

    async def scenario() -> list[str]:
        async with AsyncShadowGateway(f"async-{uuid.uuid4().hex[:6]}", namespace=e2e_namespace) as shadow:
            await shadow.start(gateway_spec(core, lib), timeout=float(TIMEOUT))
            result = await shadow.exec(AGENT_EDIT)
            assert result.ok, result.stderr
            streamed = [
                e["data"] async for e in shadow.exec_stream("echo one; echo two") if e["type"] == "stdout"
            ]
            await shadow.promote(source="core")
            await shadow.stop()
            return streamed

    assert "".join(asyncio.run(scenario())) == "one\ntwo\n"
    assert_promoted(core, head)
    assert_clean(cluster, e2e_namespace)


def test_plain_sandboxes_from_shadowctl_and_the_sdk(
    cluster: Cluster, e2e_namespace: str, tmp_path: Path, monkeypatch: Any
) -> None:
    ns = e2e_namespace
    claim = f"cli-sbx-{uuid.uuid4().hex[:6]}"
    assert ok(ctl(cluster, "sandbox", "claim", claim, "--template", "workspace", "-n", ns)).strip() == claim
    # The claim names its sandbox's preview (the chart's domain on kind is preview.localhost).
    assert (cluster.get(ns, "sandboxclaims", claim) or {})["status"][
        "previewURL"
    ] == f"http://{claim}.preview.localhost/"
    assert (
        ok(ctl(cluster, "sandbox", "exec", claim, "-n", ns, "--", "sh", "-c", "echo hi > f.txt; cat f.txt"))
        == "hi\n"
    )
    ok(ctl(cluster, "sandbox", "cp", f"{claim}:f.txt", str(tmp_path / "f.txt"), "-n", ns))
    assert (tmp_path / "f.txt").read_text() == "hi\n"
    assert ctl(cluster, "sandbox", "exec", claim, "-n", ns, "--", "false").returncode == 1
    ok(ctl(cluster, "sandbox", "delete", claim, "-n", ns))

    monkeypatch.setenv("KUBECONFIG", cluster.kubeconfig)
    from shadow_operator.sdk import AsyncSandboxClient, SandboxClient

    with SandboxClient(namespace=ns) as client:
        sandbox = client.create_sandbox("workspace", sandbox_ready_timeout=300)
        sandbox.files.write("hello.txt", "from the sdk")
        assert sandbox.files.read("hello.txt") == b"from the sdk" and sandbox.files.exists("hello.txt")
        assert sandbox.commands.run("cat hello.txt").stdout == "from the sdk"
        events = list(sandbox.commands.stream("echo a; echo b >&2"))
        assert events[0]["type"] == "start"
        assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0
        assert "".join(e["data"] for e in events if e["type"] == "stdout") == "a\n"
        name = sandbox.claim_name
    assert name not in [c["metadata"]["name"] for c in cluster.list(ns, "sandboxclaims")]

    async def scenario() -> str:
        async with AsyncSandboxClient(namespace=ns) as client:
            sandbox = await client.create_sandbox("workspace", sandbox_ready_timeout=300)
            result = await sandbox.commands.run(["echo", "async"])
            await sandbox.terminate()
            return result.stdout

    assert asyncio.run(scenario()) == "async\n"


def test_doctor_is_green_for_the_release_as_installed(cluster: Cluster, e2e_namespace: str) -> None:
    """hack/kind/deploy.sh installs a release of any name (SHADOW_RELEASE) from the local registry's OCI chart
    into a namespace that is not shadow-system; doctor finds that operator from a tenant's namespace."""
    assert OPERATOR_NAMESPACE != "shadow-system"
    checks = {
        c["check"]: c for c in json.loads(ok(ctl(cluster, "doctor", "-n", e2e_namespace, "-o", "json")))
    }
    assert {name: c["state"] for name, c in checks.items()} == {
        "kubeconfig": "ok",
        "cluster": "ok",
        "CRDs": "ok",
        "operator": "ok",
        "storage": "ok",
        "snapshots": "ok",
        "templates": "ok",
        "podsecurity": "ok",  # the namespaces holding sandboxes enforce restricted (tests/e2e/conftest.py)
    }, checks
    assert OPERATOR_NAMESPACE in checks["operator"]["detail"], checks["operator"]
    # No image values were given: the release's chart pins the images it pushed by digest.
    deployment = k8s.AppsV1Api(cluster.api).read_namespaced_deployment(FULLNAME, OPERATOR_NAMESPACE)
    (image,) = {c.image for c in deployment.spec.template.spec.containers}
    assert "@sha256:" in image and image.split("@")[0].endswith("/shadow-operator/operator"), image
