"""The client verbs that work in a workspace, from the client side: shadowctl and the SDK through the real API
server's pod proxy to a real sandbox-runtime (tests/support/proxied_workspace.py): exec's shell command
line, decide, handoff, journal, git(), logs, and sync (local edits pushed into the running workspace)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from shadow_operator.sdk import LocalSource, ShadowGateway

from tests.runtime.conftest import Server
from tests.support.controlplane import wait_for
from tests.support.proxied_workspace import proxied_environment
from tests.support.sandbox_operator import install_crds
from tests.support.shadowctl import SHADOWCTL, run

pytestmark = pytest.mark.integration


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


def local_repository(path: Path) -> Path:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(path)]
    path.mkdir()
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (path / ".gitignore").write_text("build/\n")
    (path / "app.py").write_text("print('v1')\n")
    (path / "old.py").write_text("gone soon\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    return path


def test_sync_pushes_local_edits_and_deletions_only_inside_the_source(
    workspace: Server, kubeconfig: str, namespace: str, tmp_path: Path
) -> None:
    local = local_repository(tmp_path / "app")
    with ShadowGateway("ws", namespace=namespace) as gw:
        gw.upload(LocalSource(local, name="app"))  # as `create --local` does: the first push
    remote = workspace.root / "app"
    assert (remote / "old.py").read_text() == "gone soon\n"
    (remote / "agent.txt").write_text("made in the workspace\n")  # never pushed from here: never deleted
    (workspace.root / "outside.txt").write_text("not the source's\n")

    (local / "app.py").write_text("print('v2')\n")
    (local / "new.py").write_text("new\n")
    (local / "old.py").unlink()
    (local / "build").mkdir()
    (local / "build" / "out.bin").write_text("ignored\n")
    synced = run(kubeconfig, "sync", "ws", "-n", namespace, "-o", "json")
    assert synced.returncode == 0, synced.stderr
    [pushed] = json.loads(synced.stdout)
    assert pushed["source"] == "app" and pushed["deleted"] == ["old.py"]
    assert sorted(pushed["sent"]) == ["app.py", "new.py"]
    assert (remote / "app.py").read_text() == "print('v2')\n" and (remote / "new.py").read_text() == "new\n"
    assert not (remote / "old.py").exists() and not (remote / "build").exists()
    assert (remote / "agent.txt").exists() and (workspace.root / "outside.txt").exists()
    again = run(kubeconfig, "sync", "ws", "-n", namespace)
    assert again.returncode == 0 and "app: up to date" in again.stderr

    # A record of the last push that names paths outside the source or in .git (edited on disk, or by
    # anything that can write there) deletes none of them.
    state = next(Path(os.environ["XDG_STATE_HOME"]).rglob("ws.json"))
    data = json.loads(state.read_text())
    data["pushed"]["app"].update(
        {"../outside.txt": [1, 1], ".git/HEAD": [1, 1], "a/../../outside.txt": [1, 1]}
    )
    state.write_text(json.dumps(data))
    assert run(kubeconfig, "sync", "ws", "-n", namespace).returncode == 0
    assert (workspace.root / "outside.txt").exists() and (remote / ".git" / "HEAD").exists()

    # --watch: an edit arrives without another command.
    watcher = subprocess.Popen(
        [SHADOWCTL, "sync", "ws", "-n", namespace, "--watch"],
        env={**os.environ, "KUBECONFIG": kubeconfig},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    assert watcher.stderr is not None
    reader = threading.Thread(target=lambda: said.extend(watcher.stderr or ()), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any(line.startswith("watching ") for line in said), timeout=30, what="the watch")
        (local / "app.py").write_text("print('v3')\n")
        wait_for(
            lambda: (remote / "app.py").read_text() == "print('v3')\n", timeout=30, what="the edit pushed"
        )
    finally:
        watcher.terminate()
        watcher.wait(10)
