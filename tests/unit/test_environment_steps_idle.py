"""The idle step with fakes: suspend after the idle timeout, resume on a new request value."""

from __future__ import annotations

import pytest
from shadow_operator.api import constants as c
from shadow_operator.controllers.environment.idle import IdleStep

from tests.support.fakes import World, environment, new_pass, to_patch

pytestmark = pytest.mark.unit

URL = "http://demo.team.svc:8080"


def env_with(idle: dict | None = None, annotations: dict | None = None, timeout: int | None = 600):
    spec = {"sources": [{"name": "app", "repo": "acme/app", "upload": {}}], "idleTimeoutSeconds": timeout}
    status = {"runtimeURL": URL, **({"idle": idle} if idle else {})}
    return environment(spec=spec, status=status, annotations=annotations)


async def test_no_timeout_no_runtime_call() -> None:
    world = World()
    assert await IdleStep(world.deps).suspend_if_idle(new_pass(env_with(timeout=None))) is None
    assert world.runtimes == {}


async def test_busy_workspace_is_looked_at_again_when_it_could_be_idle() -> None:
    world = World()
    world.runtime(URL).idle = 100.0
    state = new_pass(env_with())
    assert await IdleStep(world.deps).suspend_if_idle(state) == 501.0
    assert state.status.idle is None


async def test_idle_workspace_is_suspended_and_stays_so_until_a_new_resume_request() -> None:
    world = World()
    world.runtime(URL).idle = 700.0
    state = new_pass(env_with())
    step = IdleStep(world.deps)
    assert await step.suspend_if_idle(state) == 0.0
    assert state.status.idle is not None and state.status.idle.suspended_at is not None
    assert "Suspended" in world.recorder.reasons()

    suspended = to_patch(state.status)["idle"]
    assert step.suspended(new_pass(env_with(suspended))) is True
    old_request = env_with({**suspended, "resumeRequest": "1"}, {c.ANNOTATION_RESUME_REQUEST: "1"})
    assert step.suspended(new_pass(old_request)) is True

    resumed = new_pass(env_with({**suspended, "resumeRequest": "1"}, {c.ANNOTATION_RESUME_REQUEST: "2"}))
    assert step.suspended(resumed) is False
    # The patch clears suspendedAt (a null in a merge patch) and remembers the request answered.
    assert to_patch(resumed.status)["idle"] == {"suspendedAt": None, "resumeRequest": "2"}


async def test_unreachable_runtime_is_retried_later() -> None:
    world = World()
    world.runtime(URL).unavailable = "connection refused"
    assert await IdleStep(world.deps).suspend_if_idle(new_pass(env_with())) == 30.0
