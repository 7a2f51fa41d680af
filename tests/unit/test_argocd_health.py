"""The ArgoCD health checks (ShadowEnvironment, ShadowEnvironmentPool, Sandbox, SandboxClaim), run by a real
Lua interpreter on sample objects shaped like the operator's status."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from shadow_operator.resources import sandbox as sandbox_res

pytestmark = pytest.mark.unit

ARGOCD = Path(__file__).resolve().parents[2] / "charts/shadow-operator/argocd"
SCRIPT = ARGOCD / "shadowenvironment-health.lua"
LUA = shutil.which("lua5.4") or shutil.which("lua")


def lua_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{json.dumps(k)}] = {lua_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "{" + ", ".join(lua_value(v) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "nil"
    return json.dumps(value)


def health(obj: dict[str, Any], script: Path = SCRIPT) -> tuple[str, str]:
    if LUA is None:
        pytest.fail("no Lua interpreter: apt-get install lua5.4 (.ci/run installs it)")
    program = (
        f"obj = {lua_value(obj)}\n"
        f"local hs = (function() {script.read_text()} end)()\n"
        'io.write(hs.status, "\\n", hs.message or "")\n'
    )
    out = subprocess.run([LUA, "-"], input=program, capture_output=True, text=True, check=True)
    status, _, message = out.stdout.partition("\n")
    return status, message


def env(generation: int = 1, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "e", "generation": generation}, "status": status or None}


def cond(
    type_: str, status: str, reason: str = "R", message: str = "m", generation: int = 1
) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def test_health_follows_conditions_and_failure_codes() -> None:
    assert health(env())[0] == "Progressing"
    verdict = {"result": "PASS", "observedGeneration": 1}
    assert health(env(conditions=[cond("Ready", "True", message="all good")], verdict=verdict)) == (
        "Healthy",
        "all good",
    )
    status, message = health(
        env(conditions=[cond("Ready", "False", "Progressing", "waiting for SourcesReady")])
    )
    assert status == "Progressing" and "SourcesReady" in message
    failed = env(
        conditions=[cond("Ready", "False", "TemplateNotFound")],
        failure={"code": "TemplateNotFound", "message": "SandboxTemplate 'x' does not exist"},
    )
    assert health(failed) == ("Degraded", "TemplateNotFound: SandboxTemplate 'x' does not exist")
    verdict_failed = env(
        conditions=[cond("Ready", "True"), cond("Verified", "False", message="FAIL: score 50/100")]
    )
    assert health(verdict_failed) == ("Degraded", "FAIL: score 50/100")
    stale = env(generation=2, conditions=[cond("Ready", "True", generation=1)])
    assert health(stale)[0] == "Progressing"


def test_ready_environment_waits_for_its_verdict() -> None:
    """Ready comes a pass before the verdict: Healthy only once the verdict of this generation is in (seen on
    a real ArgoCD, which reported Healthy before the verification had run)."""
    verdict = {"result": "PASS", "observedGeneration": 1}
    ready = [cond("Ready", "True", message="all good")]
    status, message = health(env(conditions=ready))
    assert status == "Progressing" and "verdict" in message
    assert health(env(conditions=[*ready, cond("Verified", "True")], verdict=verdict)) == (
        "Healthy",
        "all good",
    )
    stale = env(generation=2, conditions=[cond("Ready", "True", generation=2)], verdict=verdict)
    assert health(stale)[0] == "Progressing"
    unverified = env(conditions=ready)
    unverified["spec"] = {"verify": {"enabled": False}}
    assert health(unverified) == ("Healthy", "all good")


def test_idle_suspended_environment_is_suspended_not_progressing() -> None:
    message = "suspended after 60s without activity; its volume is kept"
    suspended = env(
        conditions=[cond("Ready", "False", "Suspended", message), cond("Verified", "True")],
        idle={"suspendedAt": "2026-11-24T08:00:00Z"},
    )
    assert health(suspended) == ("Suspended", f"Suspended: {message}")
    resumed = env(
        conditions=[cond("Ready", "False", "Progressing", "waiting for WorkspaceReady")],
        idle={"resumeRequest": "1"},
    )
    assert health(resumed)[0] == "Progressing"


def test_sandbox_health() -> None:
    script = ARGOCD / "sandbox-health.lua"
    assert health({"metadata": {"generation": 1}}, script)[0] == "Progressing"
    ready = env(conditions=[cond("Ready", "True", "DependenciesReady", "Pod is Ready")])
    assert health(ready, script) == ("Healthy", "DependenciesReady: Pod is Ready")
    starting = env(conditions=[cond("Ready", "False", "DependenciesNotReady", "Pod is Pending")])
    assert health(starting, script)[0] == "Progressing"
    failed = env(conditions=[cond("Ready", "False", "PodFailed", "exit 1")])
    assert health(failed, script) == ("Degraded", "PodFailed: exit 1")
    suspended = env(
        conditions=[cond("Ready", "False", "SandboxSuspended"), cond("Suspended", "True", message="idle")]
    )
    assert health(suspended, script) == ("Suspended", "idle")
    stale = env(generation=3, conditions=[cond("Ready", "True", generation=2)])
    assert health(stale, script)[0] == "Progressing"


def test_idle_suspended_sandbox_is_suspended() -> None:
    """The conditions the operator writes for an idle suspension (its spec still Running) read as Suspended,
    while the Pod goes and after."""
    script = ARGOCD / "sandbox-health.lua"
    body = {
        "metadata": {"name": "box", "namespace": "ns", "generation": 1},
        "spec": {"operatingMode": "Running"},
    }
    why = "Suspended after 600s without activity: Pod deleted, volumes kept"
    for pod in ({"status": {"phase": "Running"}}, None):
        found, _ = sandbox_res.compute_conditions(body, sandbox_res.Observed(pod=pod, idle=why))
        conditions = [x.model_dump(by_alias=True, mode="json", exclude_none=True) for x in found]
        assert health({**body, "status": {"conditions": conditions}}, script)[0] == "Suspended", pod
    gone, _ = sandbox_res.compute_conditions(body, sandbox_res.Observed(pod=None, idle=why))
    conditions = [x.model_dump(by_alias=True, mode="json", exclude_none=True) for x in gone]
    assert health({**body, "status": {"conditions": conditions}}, script) == ("Suspended", why)


def test_sandbox_claim_health() -> None:
    script = ARGOCD / "sandboxclaim-health.lua"
    assert health(env(), script)[0] == "Progressing"
    bound = env(conditions=[cond("Ready", "True", "SandboxReady")], sandbox={"name": "s-1"})
    assert health(bound, script) == ("Healthy", "bound to Sandbox s-1")
    missing = env(conditions=[cond("Ready", "False", "TemplateNotFound", "SandboxTemplate 'x' not found")])
    assert health(missing, script) == ("Degraded", "TemplateNotFound: SandboxTemplate 'x' not found")
    pending = env(conditions=[cond("Ready", "False", "SandboxNotReady", "Sandbox is not ready")])
    assert health(pending, script)[0] == "Progressing"


def test_environment_pool_health() -> None:
    script = ARGOCD / "shadowenvironmentpool-health.lua"
    assert health(env(), script)[0] == "Progressing"
    full = env(conditions=[cond("Ready", "True", "Ready", "2 of 2 instances Ready")])
    assert health(full, script) == ("Healthy", "Ready: 2 of 2 instances Ready")
    starting = env(conditions=[cond("Ready", "False", "Starting", "1 of 2 instances Ready")])
    assert health(starting, script) == ("Progressing", "Starting: 1 of 2 instances Ready")
    missing = env(
        conditions=[cond("Ready", "False", "TemplateNotFound", "SandboxTemplate 'x' does not exist")]
    )
    assert health(missing, script)[0] == "Degraded"
    stale = env(generation=3, conditions=[cond("Ready", "True", generation=2)])
    assert health(stale, script)[0] == "Progressing"
