"""The idle step: suspend the workspace after spec.idleTimeoutSeconds without runtime activity (its Pod goes,
its volume stays), and resume it when the annotation shadow.dev/resume-requested gets a new value; and stop it
while spec.suspend is true (a user's `shadowctl stop`), the same way."""

from __future__ import annotations

from shadow_operator.api import constants as c
from shadow_operator.api.environment import IdleStatus
from shadow_operator.clients.runtime import RuntimeUnavailable
from shadow_operator.controllers.environment.state import POLL_SECONDS, Pass, Ports


class IdleStep:
    def __init__(self, deps: Ports) -> None:
        self.deps = deps

    def stopped(self, state: Pass) -> bool:
        """Whether the user asked for the workspace to be stopped (spec.suspend, `shadowctl stop`)."""
        return state.env.spec.suspend

    def suspended(self, state: Pass) -> bool:
        """Whether the workspace is to stay suspended (a new resume request clears the suspension)."""
        env = state.env
        idle = state.status.idle
        resume = env.metadata.annotations.get(c.ANNOTATION_RESUME_REQUEST)
        if idle is not None and idle.suspended_at and resume and resume != idle.resume_request:
            # suspendedAt set to None explicitly: the status patch clears it.
            state.status.idle = idle = IdleStatus(resume_request=resume, suspended_at=None)
            self.deps.recorder.info(env.body, reason="Resumed", message="workspace resumed on request")
        return bool(idle is not None and idle.suspended_at)

    async def suspend_if_idle(self, state: Pass) -> float | None:
        """Suspend an idle workspace (the next pass removes its Pod); the seconds until the next look."""
        env = state.env
        timeout = env.spec.idle_timeout_seconds
        if not timeout:
            return None
        async with self.deps.runtime_for(env.namespace, state.instance, state.status.runtime_url) as runtime:
            try:
                idle_seconds = await runtime.idle_seconds()
            except RuntimeUnavailable:
                return POLL_SECONDS * 10
        if idle_seconds < timeout:
            return timeout - idle_seconds + 1.0
        idle = state.status.idle or IdleStatus()
        idle.suspended_at = state.now().replace(microsecond=0)
        state.status.idle = idle
        self.deps.recorder.info(
            env.body,
            reason="Suspended",
            message=f"no runtime activity for {int(idle_seconds)}s: workspace suspended",
        )
        return 0.0  # the next pass suspends the Sandbox and reports it
