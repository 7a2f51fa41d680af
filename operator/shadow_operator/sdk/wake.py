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
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from shadow_operator.api import constants as c
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.api.kinds import SANDBOX, SANDBOX_CLAIM, SHADOW_ENVIRONMENT, ResourceKind
from shadow_operator.sdk import errors, kube
from shadow_operator.sdk.errors import Forbidden, RuntimeUnreachable, WaitTimeout
from shadow_operator.sdk.kube import Body, Call, Op, Pause

T = TypeVar("T")
WAKE_TIMEOUT = 60.0  # seconds a call waits for a sleeping sandbox
# A woken sandbox's runtime is tried again after these pauses while it refuses the connection, then once a
# second until the call's deadline. The pod proxy's answer when nothing listens on the Pod's port yet:
EARLY_PAUSES = (0.1, 0.1, 0.15, 0.15, 0.2, 0.2, 0.25, 0.25, 0.5, 0.5)
CONNECTION_REFUSED = "connect: connection refused"
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


@dataclass(frozen=True)
class _Sleeper:
    """What is woken (a Sandbox or an environment), and what its errors say."""

    kind: ResourceKind
    namespace: str
    name: str
    what: str
    hint: str
    gone: errors.ShadowError


def _sandbox(namespace: str, name: str) -> _Sleeper:
    what = f"sandbox {namespace}/{name}"
    return _Sleeper(
        SANDBOX,
        namespace,
        name,
        what,
        f"kubectl -n {namespace} describe sandbox {name}",
        errors.SandboxNotFoundError(f"{what} was deleted while waking up"),
    )


def _ask(path: str, what: str, metadata: Body) -> Op[Body]:
    """Set a new resume-requested value on the object at `path`."""
    patch = {"metadata": {**metadata, "annotations": {c.ANNOTATION_RESUME_REQUEST: resume_value()}}}
    return (yield from kube.send(Call("PATCH", path, what, body=patch, content_type=kube.MERGE_PATCH)))


def _resume(target: _Sleeper, metadata: Body, awake: Callable[[Body], bool], timeout: float) -> Op[Body]:
    """Set a new resume-requested value on the object, then follow it (watching) until `awake`."""
    path = target.kind.path(target.namespace, target.name)
    body = yield from _ask(path, f"resume {target.what}", metadata)
    return (yield from _follow(target, body, awake, time.monotonic() + timeout, timeout))


def _follow(
    target: _Sleeper, body: Body, awake: Callable[[Body], bool], deadline: float, timeout: float
) -> Op[Body]:
    return (
        yield from kube.wait_for(
            target.kind.path(target.namespace),
            target.name,
            target.what,
            body,
            lambda b: b if awake(b) else None,
            deadline,
            time.monotonic,
            _timed_out(target.what, timeout, target.hint),
            lambda: target.gone,
        )
    )


def wake_sandbox(
    namespace: str,
    name: str,
    *,
    timeout: float = WAKE_TIMEOUT,
    progress: Progress | None = None,
    claim: str | None = None,
) -> Op[Body]:
    """The Sandbox once Ready: woken first when it sleeps (or its Pod is gone and it is not Ready), through its
    `claim` for a caller who may not patch Sandboxes. A Sandbox suspended by its spec is returned as it is
    (the caller's next call says it is not reachable)."""
    body = yield from kube.get(SANDBOX.path(namespace, name), f"sandbox {namespace}/{name}")
    if is_ready(body) or spec_suspended(body):
        return body
    return (yield from _wake(body, is_ready, timeout, progress, claim))


def _wake(
    body: Body, awake: Callable[[Body], bool], timeout: float, progress: Progress | None, claim: str | None
) -> Op[Body]:
    """Ask for the resume of the Sandbox `body` (as last read), then follow it until `awake`. A caller who
    may not patch Sandboxes (a tenant: the chart's role has no verb on them) asks through its `claim`, whose
    annotation the operator passes on."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    target = _sandbox(namespace, name)
    if progress is not None:
        progress(f"waking {target.what}…")
    deadline = time.monotonic() + timeout
    try:
        # The uid as a precondition: a sandbox created again under this name is not the one asked about.
        body = yield from _ask(
            target.kind.path(namespace, name), f"resume {target.what}", {"uid": body["metadata"]["uid"]}
        )
    except Forbidden:
        if claim is None:
            raise
        yield from _ask(SANDBOX_CLAIM.path(namespace, claim), f"resume {target.what} through its claim", {})
    return (yield from _follow(target, body, awake, deadline, timeout))


def _started(asleep: Body) -> Callable[[Body], bool]:
    """Ready, or its Pod has an address the sandbox did not have when it was found asleep: the new Pod,
    starting (not the old one going down)."""
    before = (asleep.get("status") or {}).get("podIPs")

    def check(body: Body) -> bool:
        ips = (body.get("status") or {}).get("podIPs")
        return is_ready(body) or (bool(ips) and ips != before)

    return check


def on_sandbox(
    namespace: str,
    name: str,
    make: Callable[[], Op[T]],
    *,
    timeout: float = WAKE_TIMEOUT,
    progress: Progress | None = None,
    asleep: Body | None = None,
    claim: str | None = None,
) -> Op[T]:
    """A runtime operation on a sandbox. When the pod proxy says its Pod is gone and the sandbox sleeps (or is
    going down), or the caller has just read it asleep (`asleep`, the Sandbox as read: no call that would
    fail), the sandbox is woken (through its `claim` for a caller who may not patch Sandboxes) and the
    operation runs on the new Pod (it never reached the runtime).

    The operation is tried as soon as the new Pod has an address, not once Ready: Ready waits for the
    kubelet's readiness probe (once a second at most) and then for the operator's status. While the runtime
    refuses the connection (still starting: nothing reached it), it is tried again after a short pause (a
    second at most) until `timeout`; on any other failure the call waits (watching) for Ready and runs once
    more.
    """
    if asleep is None:
        try:
            return (yield from make())
        except RuntimeUnreachable:
            asleep = yield from kube.get(SANDBOX.path(namespace, name), f"sandbox {namespace}/{name}")
            if is_ready(asleep) or spec_suspended(asleep):
                raise
    deadline = time.monotonic() + timeout
    body = yield from _wake(asleep, _started(asleep), timeout, progress, claim)
    pauses = iter(EARLY_PAUSES)
    while not is_ready(body):
        try:
            return (yield from make())
        except RuntimeUnreachable as exc:
            if CONNECTION_REFUSED not in str(exc):
                break
        pause = next(pauses, 1.0)
        if time.monotonic() + pause >= deadline:
            break
        yield Pause(pause)
    if not is_ready(body):
        yield from _follow(_sandbox(namespace, name), body, is_ready, deadline, timeout)
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
    target = _Sleeper(
        SHADOW_ENVIRONMENT,
        namespace,
        name,
        what,
        f"shadowctl status {name} -n {namespace}",
        errors.EnvironmentNotFound(f"{what} was deleted while waking up"),
    )
    woken = yield from _resume(
        target, {}, lambda b: _condition(b, c.COND_WORKSPACE_READY).get("status") == "True", timeout
    )
    return ShadowEnvironment.from_body(woken)
