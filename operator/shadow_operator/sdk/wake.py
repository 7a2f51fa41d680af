"""Transparent resume: a sandbox the operator suspended for idleness is woken by the first call that needs it.

Written once as operations (`kube.Op`), driven by the sync and the async clients alike. A Sandbox is asleep
when its condition Suspended is True for reason Idle (its Pod deleted, its volumes kept); it is woken by a new
value of the annotation shadow.dev/resume-requested, and the call waits (watching) until it is Ready again, at
most `timeout` seconds, then fails with one line. A Sandbox suspended by its spec (operatingMode Suspended,
replicas 0) is a person's choice: it is never woken here. A ShadowEnvironment's workspace is woken the same
way through the environment's own annotation (what `shadowctl start` also sets), never its spec.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from shadow_operator.api import constants as c
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.api.kinds import SANDBOX, SHADOW_ENVIRONMENT, ResourceKind
from shadow_operator.sdk import errors, kube
from shadow_operator.sdk.errors import RuntimeUnreachable, WaitTimeout
from shadow_operator.sdk.kube import Body, Call, Op

T = TypeVar("T")
WAKE_TIMEOUT = 60.0  # seconds a call waits for a sleeping sandbox
Progress = Callable[[str], None]
# The workspace condition of an environment suspended for idleness (its reason, before and after environments
# moved onto the Sandboxes' idle policy).
IDLE_WORKSPACE_REASONS = ("Suspended", c.REASON_IDLE)


def _condition(body: Body, kind: str) -> Body:
    found = (x for x in (body.get("status") or {}).get("conditions") or () if x.get("type") == kind)
    return next(found, {})


def is_ready(body: Body) -> bool:
    return _condition(body, c.COND_READY).get("status") == "True"


def asleep(body: Body) -> bool:
    """Suspended by the operator for idleness (not by its spec)."""
    suspended = _condition(body, c.COND_SUSPENDED)
    return suspended.get("status") == "True" and suspended.get("reason") == c.REASON_IDLE


def spec_suspended(body: Body) -> bool:
    spec = body.get("spec") or {}
    return spec.get("operatingMode") == "Suspended" or spec.get("replicas") == 0


def resume_value() -> str:
    """A new value of shadow.dev/resume-requested (any new value wakes the sandbox)."""
    return f"{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')} sdk {secrets.token_hex(4)}"


def _timed_out(what: str, timeout: float, hint: str) -> Callable[[Body], errors.ShadowError]:
    def error(body: Body) -> errors.ShadowError:
        ready = _condition(body, c.COND_READY)
        now = f"Ready is {ready.get('status')} ({ready.get('reason')})" if ready else "no status yet"
        return WaitTimeout(f"{what} did not wake up within {timeout:g}s; {now}", hint=hint)

    return error


def _resume(
    kind: ResourceKind,
    namespace: str,
    name: str,
    what: str,
    metadata: Body,
    awake: Callable[[Body], bool],
    timeout: float,
    hint: str,
    gone: errors.ShadowError,
) -> Op[Body]:
    """Set a new resume-requested value on the object, then follow it (watching) until `awake`."""
    patch = {"metadata": {**metadata, "annotations": {c.ANNOTATION_RESUME_REQUEST: resume_value()}}}
    body = yield from kube.send(
        Call("PATCH", kind.path(namespace, name), f"resume {what}", body=patch, content_type=kube.MERGE_PATCH)
    )
    return (
        yield from kube.wait_for(
            kind.path(namespace),
            name,
            what,
            body,
            lambda b: b if awake(b) else None,
            time.monotonic() + timeout,
            time.monotonic,
            _timed_out(what, timeout, hint),
            lambda: gone,
        )
    )


def wake_sandbox(
    namespace: str, name: str, *, timeout: float = WAKE_TIMEOUT, progress: Progress | None = None
) -> Op[Body]:
    """The Sandbox once Ready: woken first when it sleeps (or its Pod is gone and it is not Ready). A Sandbox
    suspended by its spec is returned as it is (the caller's next call says it is not reachable)."""
    what = f"sandbox {namespace}/{name}"
    body = yield from kube.get(SANDBOX.path(namespace, name), what)
    if is_ready(body) or spec_suspended(body):
        return body
    if progress is not None:
        progress(f"waking {what}…")
    return (
        yield from _resume(
            SANDBOX,
            namespace,
            name,
            what,
            # The uid as a precondition: a sandbox created again under this name is not the one asked about.
            {"uid": body["metadata"]["uid"]},
            is_ready,
            timeout,
            f"kubectl -n {namespace} describe sandbox {name}",
            errors.SandboxNotFoundError(f"{what} was deleted while waking up"),
        )
    )


def on_sandbox(
    namespace: str,
    name: str,
    make: Callable[[], Op[T]],
    *,
    timeout: float = WAKE_TIMEOUT,
    progress: Progress | None = None,
) -> Op[T]:
    """A runtime operation on a sandbox; when the pod proxy says its Pod is gone and the sandbox sleeps (or
    is going down), the sandbox is woken and the operation runs again (it never reached the runtime)."""
    try:
        return (yield from make())
    except RuntimeUnreachable:
        body = yield from kube.get(SANDBOX.path(namespace, name), f"sandbox {namespace}/{name}")
        if is_ready(body) or spec_suspended(body):
            raise
    yield from wake_sandbox(namespace, name, timeout=timeout, progress=progress)
    return (yield from make())


def environment_asleep(env: ShadowEnvironment) -> bool:
    """The workspace was suspended for idleness (not stopped by its spec)."""
    if env.spec.suspend:
        return False
    conditions = (env.status.conditions if env.status else None) or []
    cond = next((x for x in conditions if x.type == c.COND_WORKSPACE_READY), None)
    return cond is not None and cond.status == "False" and cond.reason in IDLE_WORKSPACE_REASONS


def wake_environment(
    env: ShadowEnvironment, *, timeout: float = WAKE_TIMEOUT, progress: Progress | None = None
) -> Op[ShadowEnvironment]:
    """The environment once its workspace is Ready again, woken first when it sleeps."""
    if not environment_asleep(env):
        return env
    namespace, name = env.namespace, env.name
    what = f"environment {namespace}/{name}"
    if progress is not None:
        progress(f"waking {what}…")
    woken = yield from _resume(
        SHADOW_ENVIRONMENT,
        namespace,
        name,
        what,
        {},
        lambda b: _condition(b, c.COND_WORKSPACE_READY).get("status") == "True",
        timeout,
        f"shadowctl status {name} -n {namespace}",
        errors.EnvironmentNotFound(f"{what} was deleted while waking up"),
    )
    return ShadowEnvironment.from_body(woken)
