"""shadowctl against a real API server: create, list, status, destroy, and the errors of a missing object."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.sandbox_operator import ENVIRONMENT, Objects
from tests.support.shadowctl import run

pytestmark = pytest.mark.integration


def test_create_list_status_destroy(objs: Objects, kubeconfig: str) -> None:
    ns = objs.namespace
    created = run(
        kubeconfig,
        "create", "cli", "-n", ns, "--no-wait",
        "--git", "https://example.com/org/tool.git@v1:org/tool",
        "--rewrite", "https://github.com/org/=org",
        "--template", "absent", "--cpu", "500m", "--memory-limit", "2Gi",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    env: dict[str, Any] | None = objs.get(ENVIRONMENT, "cli", "v1alpha1")
    assert env is not None
    assert env["spec"]["sources"] == [
        {"name": "tool", "repo": "org/tool", "git": {"url": "https://example.com/org/tool.git", "ref": "v1"}}
    ]
    assert env["spec"]["gitRewrites"] == [{"from": "https://github.com/org/", "to": "org"}]
    # Laid over the template's by the operator: a request alone keeps the template's limits.
    assert env["spec"]["resources"] == {"requests": {"cpu": "500m"}, "limits": {"memory": "2Gi"}}

    objs.wait(
        ENVIRONMENT, "cli", lambda o: (o.get("status") or {}).get("failure"), timeout=30, version="v1alpha1"
    )
    listed = run(kubeconfig, "list", "-n", ns, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    # As kubectl prints several objects: a v1 List of the objects themselves.
    as_list = json.loads(listed.stdout)
    assert as_list["apiVersion"] == "v1" and as_list["kind"] == "List"
    [item] = as_list["items"]
    stored = objs.get(ENVIRONMENT, "cli", "v1alpha1")
    assert stored is not None
    assert item["apiVersion"] == "shadow.dev/v1alpha1" and item["kind"] == "ShadowEnvironment"
    assert item["metadata"]["uid"] == stored["metadata"]["uid"]
    assert item["status"]["failure"]["code"] == "TemplateNotFound"
    table = run(kubeconfig, "list", "-n", ns)
    assert table.stdout.split() == [
        "NAME",
        "READY",
        "SOURCES",
        "VERDICT",
        "FAILURE",
        "cli",
        "False",
        "TemplateNotFound",
    ]
    status = run(kubeconfig, "status", "cli", "-n", ns)
    assert status.returncode == 0 and "TemplateNotFound" in status.stdout
    as_yaml = yaml.safe_load(run(kubeconfig, "status", "cli", "-n", ns, "-o", "yaml").stdout)
    assert as_yaml["kind"] == "ShadowEnvironment" and as_yaml["spec"] == stored["spec"]

    missing = run(kubeconfig, "status", "nope", "-n", ns)
    assert missing.returncode == 1 and missing.stderr.startswith(
        f"error: ShadowEnvironment {ns}/nope does not exist"
    )
    assert "hint: list the environments: shadowctl list" in missing.stderr
    assert "Traceback" not in missing.stderr

    destroyed = run(kubeconfig, "destroy", "cli", "-n", ns)
    assert destroyed.returncode == 0, destroyed.stderr
    assert run(kubeconfig, "destroy", "cli", "-n", ns).stderr.startswith(
        f"error: ShadowEnvironment {ns}/cli does not exist"
    )


def test_create_refuses_a_linked_worktree_before_creating_anything(
    objs: Objects, kubeconfig: str, tmp_path: Path
) -> None:
    """It used to create the environment, wait for its workspace, then refuse the worktree and leave the
    environment behind."""
    main = tmp_path / "main"
    main.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q", str(main)], check=True)
    (main / "app.py").write_text("print('hi')\n")
    subprocess.run([*git, "-C", str(main), "add", "app.py"], check=True)
    subprocess.run([*git, "-C", str(main), "commit", "-qm", "one"], check=True)
    subprocess.run([*git, "-C", str(main), "worktree", "add", "-q", str(tmp_path / "linked")], check=True)

    refused = run(
        kubeconfig,
        "create",
        "wt",
        "-n",
        objs.namespace,
        "--local",
        str(tmp_path / "linked"),
        "--timeout",
        "20",
    )
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("error: ") and "linked worktree" in refused.stderr
    assert objs.get(ENVIRONMENT, "wt", "v1alpha1") is None  # nothing left behind
