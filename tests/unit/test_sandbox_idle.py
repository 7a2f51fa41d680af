"""The Sandbox's idle step with fakes: when the runtime is asked (only when the sandbox could be idle), when the
pass comes back, suspension and resume on a new request value, and the idle clock's signals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api.models import Sandbox, SandboxStatus
from shadow_operator.clients.runtime import Runtime
from shadow_operator.controllers.sandbox_idle import SandboxIdle, is_suspended
from shadow_operator.engine.cache import Cache
from shadow_operator.engine.events import EventRecorder
from shadow_operator.engine.status import StatusPass, dump
from shadow_operator.resources import idle as policies

from tests.support.fakes import FakeRecorder, FakeRuntime

pytestmark = pytest.mark.unit

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
READY_SINCE = NOW - timedelta(seconds=700)
URL = "http://box.team.svc:8888"


def sandbox(
    threshold: int | None = 600, idle: dict | None = None, ready: bool = True, **annotations: str
) -> Sandbox:
    spec: dict[str, Any] = {"podTemplate": {"spec": {"containers": [{"name": "main"}]}}}
    if threshold is not None:
        spec["autoSuspendPolicy"] = {"suspendThresholdSeconds": threshold}
    when = READY_SINCE.strftime("%Y-%m-%dT%H:%M:%SZ")
    status: dict[str, Any] = {
        "runtimeURL": URL,
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "reason": "X",
                "lastTransitionTime": when,
            }
        ],
    }
    if idle:
        status["idle"] = idle
    meta = {"name": "box", "namespace": "team", "uid": "u", "generation": 1, "annotations": annotations}
    return Sandbox.from_body({"metadata": meta, "spec": spec, "status": status})


class Rig:
    def __init__(self) -> None:
        self.runtime = FakeRuntime(URL)
        self.recorder = FakeRecorder()
        self.step = SandboxIdle(Cache(), cast(EventRecorder, self.recorder), open_runtime=self._open)

    def _open(self, url: str, token: str | None) -> Runtime:
        assert url == URL
        return cast(Runtime, self.runtime)

    async def decide(self, box: Sandbox) -> tuple[float | None, StatusPass[SandboxStatus]]:
        state = StatusPass(box, SandboxStatus, now=lambda: NOW)
        return await self.step.decide(box, state, NOW), state


async def test_no_policy_no_runtime_call() -> None:
    rig = Rig()
    assert (await rig.decide(sandbox(threshold=None)))[0] is None
    assert (await rig.decide(sandbox(ready=False)))[0] is None  # starting: its Pod's changes wake it
    assert rig.runtime.calls == []


async def test_runtime_asked_only_when_the_sandbox_could_be_idle() -> None:
    rig = Rig()
    recent = (NOW - timedelta(seconds=100)).strftime("%Y-%m-%dT%H:%M:%SZ")
    recheck, _ = await rig.decide(sandbox(**{c.ANNOTATION_LAST_ACTIVITY: recent}))
    assert recheck == 500.0  # when the router's last request is a threshold old
    assert rig.runtime.calls == []


async def test_busy_sandbox_is_looked_at_again_when_it_could_be_idle() -> None:
    rig = Rig()
    rig.runtime.idle = 100.0
    recheck, state = await rig.decide(sandbox())
    assert recheck == 500.0 and rig.runtime.calls == ["idle"]
    assert not is_suspended(state)
    assert dump(state.status)["idle"] == {"lastActivityTime": "2026-01-01T11:58:20Z"}


async def test_idle_sandbox_is_suspended_and_stays_so_until_a_new_resume_request() -> None:
    rig = Rig()
    rig.runtime.idle = 700.0
    recheck, state = await rig.decide(sandbox())
    assert recheck is None and is_suspended(state)
    assert "Suspended" in rig.recorder.reasons()
    suspended = dump(state.status)["idle"]
    assert suspended["suspendedAt"] == "2026-01-01T12:00:00Z"

    # Suspended: nothing asked of the runtime (there is none), the same request value does nothing.
    rig.runtime.calls.clear()
    _, again = await rig.decide(
        sandbox(idle={**suspended, "resumeRequest": "1"}, **{c.ANNOTATION_RESUME_REQUEST: "1"})
    )
    assert is_suspended(again) and rig.runtime.calls == []

    _, resumed = await rig.decide(
        sandbox(idle={**suspended, "resumeRequest": "1"}, **{c.ANNOTATION_RESUME_REQUEST: "2"})
    )
    assert not is_suspended(resumed)
    assert "Resumed" in rig.recorder.reasons()
    idle = dump(resumed.status)["idle"]
    assert idle["resumeRequest"] == "2" and "suspendedAt" not in idle and idle["resumeRequestedAt"]
    # A later new value while it runs is only noted (and counts as activity): no second resume.
    events = len(rig.recorder.events)
    _, running = await rig.decide(sandbox(idle=idle, **{c.ANNOTATION_RESUME_REQUEST: "3"}))
    assert not is_suspended(running) and len(rig.recorder.events) == events


async def test_an_explicit_suspension_takes_over_from_the_idle_one() -> None:
    rig = Rig()
    box = sandbox(idle={"suspendedAt": "2026-01-01T11:00:00Z"})
    box.body["spec"]["operatingMode"] = "Suspended"
    _, state = await rig.decide(box)
    assert not is_suspended(state)  # the spec's suspension applies; Running later resumes it as before


async def test_unreachable_runtime_is_retried_later_and_never_taken_for_idle() -> None:
    rig = Rig()
    rig.runtime.unavailable = "connection refused"
    recheck, state = await rig.decide(sandbox())
    assert recheck == policies.UNREACHABLE_RECHECK_SECONDS and not is_suspended(state)
    recheck, _ = await rig.decide(sandbox(threshold=20))
    assert recheck == 20.0


def test_last_activity_annotation_is_read_defensively() -> None:
    assert policies.parse_activity("2026-01-01T11:59:00Z", NOW) == NOW - timedelta(seconds=60)
    assert policies.parse_activity("2026-01-01T12:00:30Z", NOW) == NOW  # a clock a little ahead: now
    assert policies.parse_activity("2999-01-01T00:00:00Z", NOW) is None  # far future: ignored
    assert policies.parse_activity("yesterday", NOW) is None
    assert policies.parse_activity(None, NOW) is None
    assert policies.recheck_after(-5.0) == policies.MIN_RECHECK_SECONDS  # never a busy loop
