"""The idle step with fakes: the environment's policy goes to its workspace Sandbox (within the template's), a
new resume request goes to the Sandbox once, and the Sandbox's idle suspension is reported."""

from __future__ import annotations

from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api.kinds import SANDBOX
from shadow_operator.api.models import Sandbox
from shadow_operator.controllers.environment.idle import IdleStep
from shadow_operator.controllers.environment.state import StepFailed

from tests.support.fakes import NAMESPACE, World, environment, new_pass, to_patch

pytestmark = pytest.mark.unit

SOURCES = [{"name": "app", "repo": "acme/app", "upload": {}}]


def env_with(
    idle: dict | None = None, annotations: dict | None = None, timeout: int | None = 600, **spec: Any
):
    spec = {"sources": SOURCES, **({"idleTimeoutSeconds": timeout} if timeout else {}), **spec}
    status = {**({"idle": idle} if idle else {})}
    return environment(spec=spec, status=status, annotations=annotations)


def template(policy: dict | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"podTemplate": {"spec": {"containers": [{"name": "main"}]}}}
    if policy is not None:
        spec["autoSuspendPolicy"] = policy
    return {"metadata": {"name": "tpl", "namespace": NAMESPACE}, "spec": spec}


def workspace(suspended_at: str | None = None, **annotations: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "demo", "namespace": NAMESPACE, "annotations": annotations},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main"}]}}},
    }
    if suspended_at:
        body["status"] = {"idle": {"suspendedAt": suspended_at}}
    return body


def test_the_workspace_gets_the_environments_policy_within_the_templates() -> None:
    step = IdleStep(World().deps)
    assert step.policy(new_pass(env_with(timeout=None)), template()) is None
    assert step.policy(new_pass(env_with()), template()) == {"suspendThresholdSeconds": 600}
    shorter = env_with(timeout=None, autoSuspendPolicy={"suspendThresholdSeconds": 30})
    assert step.policy(new_pass(shorter), template({"suspendThresholdSeconds": 60})) == {
        "suspendThresholdSeconds": 30
    }
    assert step.policy(new_pass(env_with(timeout=None)), template({"suspendThresholdSeconds": 60})) == {
        "suspendThresholdSeconds": 60
    }
    with pytest.raises(StepFailed) as refused:
        step.policy(new_pass(env_with(timeout=600)), template({"suspendThresholdSeconds": 60}))
    assert refused.value.code == c.REASON_AUTO_SUSPEND_POLICY_REFUSED and refused.value.retry is None


async def test_a_new_resume_request_goes_to_the_sandbox_once() -> None:
    world = World()
    step = IdleStep(world.deps)
    suspended = {"suspendedAt": "2026-01-01T00:00:00Z", "resumeRequest": "1"}
    # A value already forwarded does nothing.
    await step.forward_resume(new_pass(env_with(suspended, {c.ANNOTATION_RESUME_REQUEST: "1"})), workspace())
    assert world.client.writes == []

    state = new_pass(env_with(suspended, {c.ANNOTATION_RESUME_REQUEST: "2"}))
    await step.forward_resume(state, workspace())
    assert world.client.writes == [("patch", SANDBOX.kind, "demo")]
    forwarded = world.client.objects[(SANDBOX.kind, NAMESPACE, "demo")]
    assert forwarded["metadata"]["annotations"] == {c.ANNOTATION_RESUME_REQUEST: "2"}
    assert to_patch(state.status)["idle"]["resumeRequest"] == "2"
    assert "Resumed" in world.recorder.reasons()


def test_the_sandboxes_idle_suspension_is_reported_and_cleared() -> None:
    world = World()
    step = IdleStep(world.deps)
    state = new_pass(env_with())
    assert step.suspended(state, Sandbox.from_body(workspace("2026-01-01T00:00:05Z"))) is True
    assert to_patch(state.status)["idle"]["suspendedAt"] == "2026-01-01T00:00:05Z"
    assert "Suspended" in world.recorder.reasons()

    resumed = new_pass(env_with(to_patch(state.status)["idle"]))
    assert step.suspended(resumed, Sandbox.from_body(workspace())) is False
    # The patch clears suspendedAt (a null in a merge patch).
    assert to_patch(resumed.status)["idle"] == {"suspendedAt": None}
