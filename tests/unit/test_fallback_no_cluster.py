"""Host-only fallback with no cluster reachable (a kubeconfig pointing at a closed loopback port): opt-in, labelled
(fallback_mode, failure_reason ClusterUnreachable, mode host-only), and the local directory untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from shadow_operator.sdk import ClusterUnreachable, EnvironmentSpec, LocalSource, ShadowGateway
from shadow_operator.sdk import manifest as m

from tests.support.controlplane import free_port

pytestmark = pytest.mark.unit

SHADOWCTL = str(Path(sys.executable).parent / "shadowctl")
CHECK = "cd app && python3 -B -c 'import app; assert app.ANSWER == 42' && touch ../made-by-check"


@pytest.fixture
def closed_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{free_port()}"}}}}]
users: [{{name: u, user: {{token: nobody}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
"""
    )
    monkeypatch.setenv("KUBECONFIG", str(path))
    return str(path)


@pytest.fixture
def app(tmp_path: Path) -> Path:
    repo = tmp_path / "app"
    (repo / "app").mkdir(parents=True)
    (repo / "app" / "__init__.py").write_text("ANSWER = 42\n")
    (repo / "pyproject.toml").write_text('[project]\nname = "app"\nversion = "1"\n')
    return repo


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_sdk_falls_back_only_when_asked(closed_cluster: str, app: Path) -> None:
    before = listing(app)
    spec = EnvironmentSpec(local=[LocalSource(app)], verify_commands=[CHECK])
    with ShadowGateway("nowhere", app) as gw:
        with pytest.raises(ClusterUnreachable):
            gw.manifest()  # never silent: without the opt-in the error stands
        found = gw.manifest(fallback="host-only", spec=spec)
        verdict = gw.verify(fallback="host-only")  # workspace_path alone: no commands known
    data = found.dump()
    jsonschema.Draft202012Validator(json.loads(m.SCHEMA_PATH.read_text())).validate(data)
    assert (data["fallback_mode"], data["failure_reason"], data["mode"]) == (
        True,
        "ClusterUnreachable",
        "host-only",
    )
    assert data["shadow_available"] is False and data["local_sources"][0]["project_type"] == "python"
    assert data["verdict"]["result"] == "PASS" and data["verdict"]["score"] == 50
    assert data["verdict"]["evidence"]["codeExecution"]["checks"][0]["passed"] is True
    assert verdict.mode == "host-only" and verdict.max_score == 50
    assert "codeExecution" not in verdict.evidence
    assert any("code execution was not checked" in i for i in verdict.issues)
    assert listing(app) == before  # the check's file was made in the temporary copy


def test_cli_verify_and_manifest_fall_back_labelled(closed_cluster: str, app: Path) -> None:
    env = {**os.environ, "KUBECONFIG": closed_cluster, "COLUMNS": "200"}

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([SHADOWCTL, *args], env=env, capture_output=True, text=True, timeout=120)

    plain = ctl("verify", "nowhere")
    assert (
        plain.returncode == 1
        and "cannot reach the API server" in plain.stderr
        and "HOST-ONLY" not in plain.stderr
    )

    failing = ctl(
        "verify",
        "nowhere",
        "--fallback",
        "host-only",
        "--local",
        str(app),
        "--verify",
        "exit 3",
        "-o",
        "json",
    )
    assert failing.returncode == 1, failing.stderr
    assert "shadow unavailable (ClusterUnreachable): HOST-ONLY" in failing.stderr
    verdict = json.loads(failing.stdout)
    assert (verdict["mode"], verdict["result"], verdict["fallbackMode"]) == ("host-only", "FAIL", True)
    assert verdict["failureReason"] == "ClusterUnreachable" and verdict["passThreshold"] == 35

    passing = ctl("manifest", "nowhere", "--fallback", "host-only", "--local", str(app), "--verify", CHECK)
    assert passing.returncode == 0, passing.stderr
    assert "HOST-ONLY" in passing.stderr and "fallback_mode: true" in passing.stdout

    unknown = ctl("manifest", "nowhere", "--fallback", "docker")
    assert unknown.returncode == 1 and "fallback 'docker' is unknown" in unknown.stderr
    assert not (app.parent / "made-by-check").exists()
