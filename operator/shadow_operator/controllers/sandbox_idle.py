"""The Sandbox's idle step (spec.autoSuspendPolicy): suspend a sandbox nobody has used for the policy's threshold,
resume it on a new value of the annotation shadow.dev/resume-requested.

Activity is the newest of:
- the runtime's idle clock (`/v1/health` idle_seconds): a runtime API call in flight or ended, an open terminal,
  a process started through the runtime still running;
- the annotation shadow.dev/last-activity (RFC 3339), which the preview router writes on preview and SDK-path
  requests (at most every 30 s), and any other client may;
- the moment the sandbox last became Ready, and the last resume request (a fresh Pod gets a whole threshold).

The runtime is asked only when the other signals say the sandbox could be idle by now, so a busy sandbox costs
one small request per threshold, and the pass is queued again for the moment it could next become idle: no
polling loop. A runtime that does not answer is never taken for idle (a custom image may have none); it is
asked again later.

An idle suspension never touches the spec (GitOps tools own it): it lives in status.idle.suspendedAt, the
Suspended condition (reason Idle) and Ready (reason Suspended). An explicit suspension (operatingMode or
replicas) takes over from it; setting the spec back to Running then resumes the sandbox as before.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.kinds import SECRET
from shadow_operator.api.models import Sandbox, SandboxIdleStatus, SandboxStatus, Secret
from shadow_operator.clients.runtime import Runtime, RuntimeUnavailable
from shadow_operator.controllers import metrics
from shadow_operator.engine.cache import Cache, Key
from shadow_operator.engine.events import EventRecorder
from shadow_operator.engine.status import StatusPass
from shadow_operator.resources import conditions as conds
from shadow_operator.resources import idle as policy
from shadow_operator.resources import sandbox as res

# The runtime's health answer is tiny; a runtime that takes longer than this is not waited for.
RUNTIME_TIMEOUT_SECONDS = 5.0
OpenRuntime = Callable[[str, str | None], Runtime]


def _open_runtime(url: str, token: str | None) -> Runtime:
    return Runtime(url, token, timeout=RUNTIME_TIMEOUT_SECONDS, max_answer_bytes=64 * 1024)


def idle_message(idle: SandboxIdleStatus, threshold: int | None) -> str:
    after = f" after {threshold}s without activity" if threshold else " for idleness"
    return (
        f"Suspended{after}: Pod deleted, volumes kept; set the annotation {c.ANNOTATION_RESUME_REQUEST} to a "
        "new value to resume"
    )


class SandboxIdle:
    def __init__(
        self,
        cache: Cache,
        recorder: EventRecorder,
        runtime_api_url: str | None = None,
        open_runtime: OpenRuntime = _open_runtime,
    ) -> None:
        self.cache = cache
        self.recorder = recorder
        self.runtime_api_url = runtime_api_url
        self.open_runtime = open_runtime
        # Why each suspended sandbox is suspended (idle or scale), for the gauge.
        self._suspended: dict[Key, str] = {}

    # ---------------------------------------------------------------------------------------- the decision
    async def decide(self, sandbox: Sandbox, state: StatusPass[SandboxStatus], now: datetime) -> float | None:
        """Act on a new resume request, then suspend an idle sandbox; the seconds until it could become idle
        (None: nothing to watch). `is_suspended(state)` tells the rest of the pass whether the Pod must go."""
        self._resume_on_request(sandbox, state, now)
        idle = state.status.idle
        explicit = res.is_suspended(sandbox.body["spec"])
        if explicit and idle is not None and idle.suspended_at is not None:
            idle.suspended_at = None  # the explicit suspension takes over; Running then resumes as before
        if explicit or is_suspended(state) or sandbox.spec.auto_suspend_policy is None:
            return None
        if c.LABEL_WARM_POOL in sandbox.metadata.labels:
            return None  # stock waiting in a pool is idle by nature
        return await self._suspend_if_idle(sandbox, state, now)

    def _resume_on_request(self, sandbox: Sandbox, state: StatusPass[SandboxStatus], now: datetime) -> None:
        value = sandbox.metadata.annotations.get(c.ANNOTATION_RESUME_REQUEST)
        idle = state.status.idle
        if not value or (idle is not None and idle.resume_request == value):
            return  # none, or one already acted on
        if idle is None:
            idle = state.status.idle = SandboxIdleStatus()
        idle.resume_request = value
        # Someone wants the sandbox: as much activity as a request (and a fresh Pod gets a whole threshold).
        idle.last_activity_time = now.replace(microsecond=0)
        if idle.suspended_at is None:
            return  # running or resuming already: nothing more to do, however many new values arrive
        idle.suspended_at = None
        idle.resume_requested_at = now
        metrics.SANDBOX_RESUMES.labels(sandbox.namespace, "annotation").inc()
        self.recorder.info(
            sandbox.body, reason="Resumed", message=f"Resuming on request ({c.ANNOTATION_RESUME_REQUEST})"
        )

    async def _suspend_if_idle(
        self, sandbox: Sandbox, state: StatusPass[SandboxStatus], now: datetime
    ) -> float | None:
        assert sandbox.spec.auto_suspend_policy is not None
        threshold = sandbox.spec.auto_suspend_policy.suspend_threshold_seconds
        ready = state.conditions.find(c.COND_READY)
        if ready is None or ready.status != "True":
            return None  # starting (or failing): its Pod's changes wake the Sandbox
        idle = state.status.idle or SandboxIdleStatus()
        known = policy.newest(
            idle.last_activity_time,
            idle.resume_requested_at,
            ready.last_transition_time,
            policy.parse_activity(sandbox.metadata.annotations.get(c.ANNOTATION_LAST_ACTIVITY), now),
        )
        if known is not None and (remaining := policy.idle_since(known, threshold, now)) > 0:
            return policy.recheck_after(remaining)
        try:
            idle_seconds = await self._runtime_idle_seconds(sandbox)
        except RuntimeUnavailable:
            return min(float(threshold), policy.UNREACHABLE_RECHECK_SECONDS)
        last = policy.newest(known, policy.ago(now, idle_seconds))
        assert last is not None
        idle.last_activity_time = last.replace(microsecond=0)
        state.status.idle = idle
        remaining = policy.idle_since(last, threshold, now)
        if remaining > 0:
            return policy.recheck_after(remaining)
        idle.suspended_at = now.replace(microsecond=0)
        idle.resume_requested_at = None
        metrics.SANDBOX_SUSPENDS.labels(sandbox.namespace, "idle").inc()
        self.recorder.info(sandbox.body, reason="Suspended", message=idle_message(idle, threshold))
        return None

    async def _runtime_idle_seconds(self, sandbox: Sandbox) -> float:
        url = self.runtime_api_url or (sandbox.status.runtime_url if sandbox.status else None)
        if not url:
            raise RuntimeUnavailable("no runtime URL yet")
        secret = self.cache.store(SECRET).get(sandbox.namespace, naming.token_secret_name(sandbox.name))
        token = Secret.model_validate(secret).values().get(c.RUNTIME_TOKEN_KEY) if secret else None
        async with self.open_runtime(url, token) as runtime:
            return await runtime.idle_seconds()

    # ------------------------------------------------------------------------------------ after the pass
    def observe(self, sandbox: Sandbox, state: StatusPass[SandboxStatus], now: datetime) -> None:
        """Metrics and events of what this pass changed: a suspension completed, a resume by scaling, a resumed
        sandbox Ready again (its latency)."""
        key = (sandbox.namespace, sandbox.name)
        idle = state.status.idle
        was_suspended = conds.is_true(state.old.conditions, c.COND_SUSPENDED)
        now_suspended = state.conditions.is_true(c.COND_SUSPENDED)
        self._count(key, ("idle" if is_suspended(state) else "scale") if now_suspended else None)
        if state.became_true(c.COND_SUSPENDED) and not is_suspended(state):
            metrics.SANDBOX_SUSPENDS.labels(sandbox.namespace, "scale").inc()
        requested = idle.resume_requested_at if idle else None
        if was_suspended and not now_suspended and requested is None:
            # Brought back by its spec (operatingMode Running, replicas 1): timed from now.
            metrics.SANDBOX_RESUMES.labels(sandbox.namespace, "scale").inc()
            self.recorder.info(
                sandbox.body, reason="Resumed", message="Resuming: the spec asks for it to run"
            )
            idle = state.status.idle = idle or SandboxIdleStatus()
            idle.resume_requested_at = requested = now
        if requested is not None and idle is not None and state.conditions.is_true(c.COND_READY):
            seconds = max((now - requested).total_seconds(), 0.0)
            metrics.SANDBOX_RESUME_SECONDS.labels(sandbox.namespace).observe(seconds)
            idle.resume_requested_at = None

    def forget(self, key: Key) -> None:
        self._count(key, None)

    def _count(self, key: Key, cause: str | None) -> None:
        """The gauge of suspended sandboxes, moved by the one whose cause (None: not suspended) changed."""
        before = self._suspended.get(key)
        if before == cause:
            return
        if before is not None:
            metrics.SANDBOXES_SUSPENDED.labels(key[0], before).dec()
            del self._suspended[key]
        if cause is not None:
            metrics.SANDBOXES_SUSPENDED.labels(key[0], cause).inc()
            self._suspended[key] = cause


def is_suspended(state: StatusPass[SandboxStatus]) -> bool:
    """Whether the sandbox is suspended for idleness (its Pod must go) after this pass's decision."""
    idle = state.status.idle
    return idle is not None and idle.suspended_at is not None
