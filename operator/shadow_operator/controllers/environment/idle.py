"""The idle step: the workspace Sandbox suspends itself when idle (spec.autoSuspendPolicy, see
controllers/sandbox_idle.py); this step gives it the environment's policy, forwards a new value of the
environment's annotation shadow.dev/resume-requested to it, and reports its idle suspension. It also stops the
workspace while spec.suspend is true (a user's `shadowctl stop`), through the Sandbox's operatingMode."""

from __future__ import annotations

from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api.environment import IdleStatus
from shadow_operator.api.kinds import SANDBOX
from shadow_operator.api.models import AutoSuspendPolicy, Sandbox
from shadow_operator.controllers.environment.state import Pass, Ports, StepFailed
from shadow_operator.engine.cache import Body
from shadow_operator.resources import idle as policies


class IdleStep:
    def __init__(self, deps: Ports) -> None:
        self.deps = deps

    def stopped(self, state: Pass) -> bool:
        """Whether the user asked for the workspace to be stopped (spec.suspend, `shadowctl stop`)."""
        return state.env.spec.suspend

    def policy(self, state: Pass, template: Body) -> dict[str, Any] | None:
        """The workspace Sandbox's autoSuspendPolicy: the environment's (or its idleTimeoutSeconds) within the
        template's."""
        spec = state.env.spec
        override = spec.auto_suspend_policy
        if override is None and spec.idle_timeout_seconds:
            override = AutoSuspendPolicy(suspend_threshold_seconds=spec.idle_timeout_seconds)
        try:
            return policies.effective_policy(
                template["spec"], override, f"ShadowEnvironment {state.env.name!r}"
            )
        except policies.PolicyRefused as refused:
            code = c.REASON_AUTO_SUSPEND_POLICY_REFUSED
            raise StepFailed(code, code, str(refused), retry=None) from None

    async def forward_resume(self, state: Pass, sandbox: Body) -> None:
        """A new value of the environment's resume annotation goes to its Sandbox, once: the Sandbox resumes on
        it (a value the router wrote on the Sandbox itself is never overwritten by an older one of ours)."""
        env = state.env
        value = env.metadata.annotations.get(c.ANNOTATION_RESUME_REQUEST)
        idle = state.status.idle
        if not value or (idle is not None and idle.resume_request == value):
            return
        meta = sandbox["metadata"]
        patch = {"metadata": {"annotations": {c.ANNOTATION_RESUME_REQUEST: value}}}
        await self.deps.client.patch(SANDBOX, meta["namespace"], meta["name"], patch)
        state.status.idle = idle = idle or IdleStatus()
        idle.resume_request = value
        if idle.suspended_at is not None:
            self.deps.recorder.info(env.body, reason="Resumed", message="workspace resumed on request")

    def suspended(self, state: Pass, sandbox: Sandbox) -> bool:
        """Whether the workspace Sandbox is suspended for idleness (mirrored into status.idle.suspendedAt)."""
        sandbox_idle = sandbox.status.idle if sandbox.status else None
        suspended_at = sandbox_idle.suspended_at if sandbox_idle else None
        idle = state.status.idle
        was = idle.suspended_at if idle else None
        if suspended_at != was:
            state.status.idle = idle = idle or IdleStatus()
            # None set explicitly: the status patch clears it.
            idle.suspended_at = suspended_at
            if suspended_at is not None:
                self.deps.recorder.info(
                    state.env.body, reason="Suspended", message="no activity: workspace suspended"
                )
        return suspended_at is not None
