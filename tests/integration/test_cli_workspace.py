"""The client verbs that work in a workspace, from the client side: shadowctl and the SDK through the real API
server's pod proxy to a real sandbox-runtime (tests/support/proxied_workspace.py): exec's shell command
line, decide, handoff, journal, git(), logs, and sync (local edits pushed into the running workspace)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from shadow_operator.sdk import ShadowGateway

from tests.runtime.conftest import Server
from tests.support.proxied_workspace import proxied_environment
from tests.support.sandbox_operator import install_crds

pytestmark = pytest.mark.integration

SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")


def run(kubeconfig: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": kubeconfig, "COLUMNS": "200"}
    return subprocess.run([SHADOWCTL, *args], env=env, capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.fixture
def workspace(k8s_api: client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[Server]:
    install_crds(k8s_api)
    root = tmp_path / "workspace"
    root.mkdir()
    with proxied_environment(k8s_api, namespace, "ws", root) as server:
        yield server


def test_exec_runs_one_argument_under_sh_and_several_as_an_argv(
    workspace: Server, kubeconfig: str, namespace: str
) -> None:
    (workspace.root / "app").mkdir()
    line = run(kubeconfig, "exec", "ws", "-n", namespace, "cd app && pwd && exit 3")
    assert line.returncode == 3, line.stderr
    assert line.stdout.strip() == str(workspace.root / "app")
    argv = run(kubeconfig, "exec", "ws", "-n", namespace, "--", "printf", "%s|", "a b", "$HOME")
    assert argv.returncode == 0 and argv.stdout == "a b|$HOME|"  # no shell: nothing expanded


def test_decide_and_handoff(workspace: Server, kubeconfig: str, namespace: str) -> None:
    decided = run(
        kubeconfig, "decide", "ws", "-n", namespace, "keep the v1 API: two clients call it", "--author", "ana"
    )
    assert decided.returncode == 0, decided.stderr
    with ShadowGateway("ws", namespace=namespace) as gw:
        entry = gw.decide("ship behind a flag")
        assert entry.kind == "decision" and entry.text == "ship behind a flag"
        assert [e.text for e in gw.journal(significant=True) if e.kind == "decision"] == [
            "keep the v1 API: two clients call it",
            "ship behind a flag",
        ]
    handoff = run(kubeconfig, "handoff", "ws", "-n", namespace)
    assert handoff.returncode == 0, handoff.stderr
    assert "keep the v1 API: two clients call it" in handoff.stdout and "ship behind a flag" in handoff.stdout
    assert handoff.stdout == (workspace.root / "HANDOFF.md").read_text()
    empty = run(kubeconfig, "decide", "ws", "-n", namespace, "  ")
    assert empty.returncode == 1 and empty.stderr.startswith("error: a decision needs its text")


def test_git_through_the_gateway(workspace: Server, namespace: str, kubeconfig: str) -> None:
    repo = workspace.root / "app"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "new.txt").write_text("x\n")
    with ShadowGateway("ws", namespace=namespace) as gw:
        status = gw.git("status --short", cwd="app")
        branch = gw.git("rev-parse --abbrev-ref HEAD", cwd="app")
    assert status.ok and status.stdout == "?? new.txt\n"
    assert branch.stdout.strip() in ("main", "HEAD")


def test_logs_reads_the_workspace_pods_log(
    workspace: Server, kubeconfig: str, namespace: str, k8s_api: client.ApiClient
) -> None:
    # No kubelet runs here: the API server has no log for the Pod yet, and says so with an empty answer.
    logs = run(kubeconfig, "logs", "ws", "-n", namespace, "--tail", "5")
    assert logs.returncode == 0 and logs.stdout == "", logs.stderr
    # Its Pod gone (evicted, deleted): the API server's refusal, in one line.
    client.CoreV1Api(k8s_api).delete_namespaced_pod("ws", namespace, grace_period_seconds=0)
    gone = run(kubeconfig, "logs", "ws", "-n", namespace)
    assert gone.returncode == 1 and "Traceback" not in gone.stderr
    assert gone.stderr.startswith("error: log of ws: ") and "not found" in gone.stderr
