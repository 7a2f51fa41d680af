"""The verify step with fakes: the rubric scored into a typed verdict, once per generation or request."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api.environment import VerifyRunCheck
from shadow_operator.clients.gitea import GiteaError
from shadow_operator.clients.runtime import ExecutionResult
from shadow_operator.controllers.environment import verify as verify_step
from shadow_operator.controllers.environment.state import Pass, StepFailed
from shadow_operator.controllers.environment.verify import VerifyStep
from shadow_operator.resources import copyin

from tests.support.fakes import World, environment, new_pass, to_patch

pytestmark = pytest.mark.unit

URL = "http://demo.team.svc:8080"
COMMIT = "a" * 40
SOURCE = {
    "name": "app",
    "repo": "acme/app",
    "path": "app",
    "commit": COMMIT,
    "branch": "main",
    "cloneURL": "http://gitea/acme/app.git",
}


def env_with(
    verify: dict, *, status: dict | None = None, annotations: dict | None = None, gitea: bool = True
):
    spec = {
        "sources": [{"name": "app", "repo": "acme/app", "upload": {}}],
        "verify": verify,
        "gitea": {"enabled": gitea},
    }
    return environment(
        spec=spec, status={"runtimeURL": URL, "sources": [SOURCE], **(status or {})}, annotations=annotations
    )


async def verify(world: World, state: Pass) -> int:
    """Run the step until no check is left running in the workspace, as the reconciler's passes would: the
    number of passes."""
    step = VerifyStep(world.deps)
    for passes in range(1, 20):
        if await step.verify(state) is None:
            return passes
    raise AssertionError("the verification never ended")


def result(code: int, out: str = "", truncated: bool = False) -> ExecutionResult:
    return ExecutionResult(exit_code=code, stdout=out, stderr="", timed_out=False, truncated=truncated)


async def test_passing_rubric_writes_a_typed_verdict_and_the_verified_time() -> None:
    world = World()
    world.gitea.branches["acme/app@main"] = COMMIT
    world.runtime(URL).answers = [(copyin.DETECT_PROJECT, result(0, f"{copyin.RESULT_MARKER} other"))]
    state = new_pass(env_with({"commands": [{"name": "unit", "command": "make test"}]}))
    await verify(world, state)
    verdict = state.status.verdict
    assert verdict is not None and verdict.result == "PASS" and verdict.observed_generation == 1
    assert state.is_true(c.COND_VERIFIED)
    assert state.status.timings is not None and state.status.timings.verified is not None
    assert to_patch(state.status)["verdict"]["maxScore"] == verdict.max_score
    # The same generation without a new request: nothing runs again.
    calls = len(world.runtime(URL).calls)
    again = new_pass(env_with({}, status={"verdict": to_patch(state.status)["verdict"]}))
    await VerifyStep(world.deps).verify(again)
    assert len(world.runtime(URL).calls) == calls


async def test_failing_command_and_a_gitea_branch_elsewhere_fail_with_evidence() -> None:
    world = World()
    world.gitea.branches["acme/app@main"] = "b" * 40
    world.runtime(URL).answers = [
        (copyin.DETECT_PROJECT, result(0, f"{copyin.RESULT_MARKER} other")),
        ("exit 3", result(3, "x" * 1000, truncated=True)),
    ]
    state = new_pass(env_with({"commands": [{"name": "unit", "command": "exit 3"}], "passThreshold": 100}))
    await verify(world, state)
    verdict = state.status.verdict
    assert verdict is not None and verdict.result == "FAIL"
    assert any("is at " + "b" * 40 in issue for issue in verdict.issues)
    unit = [ch for cat in verdict.evidence.values() for ch in cat.checks if ch.name == "unit"]
    assert unit and unit[0].detail.startswith("exit code 3: (output truncated)")
    assert world.recorder.events[-1][:2] == ("Warning", "VerificationFailed")


async def test_disabled_verification_runs_on_request_only() -> None:
    world = World()
    state = new_pass(env_with({"enabled": False}, gitea=False))
    state.set(c.COND_VERIFIED, True, "VerificationPassed", "old")
    await VerifyStep(world.deps).verify(state)
    assert state.conditions.find(c.COND_VERIFIED) is None and world.runtimes == {}

    requested = new_pass(
        env_with({"enabled": False}, gitea=False, annotations={c.ANNOTATION_VERIFY_REQUEST: "r1"})
    )
    await verify(world, requested)
    assert requested.status.verdict is not None and requested.status.verdict.trigger == "r1"


async def test_unreachable_runtime_is_a_wait() -> None:
    world = World()
    world.runtime(URL).unavailable = "refused"
    with pytest.raises(StepFailed) as failed:
        await VerifyStep(world.deps).verify(new_pass(env_with({}, gitea=False)))
    assert failed.value.code is None and failed.value.reason == "RuntimeUnreachable"


async def test_a_stalled_gitea_fails_its_check_within_the_deadline_instead_of_holding_the_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, the check of Gitea's branch waited in the pass for the Gitea client's own deadline, 120 s a call."""
    world = World()
    world.gitea.stalled = True
    world.runtime(URL).answers = [(copyin.DETECT_PROJECT, result(0, f"{copyin.RESULT_MARKER} other"))]
    state = new_pass(env_with({}))
    monkeypatch.setattr(verify_step, "GITEA_CHECK_SECONDS", 0.1)
    await asyncio.wait_for(verify(world, state), 2.0)
    verdict = state.status.verdict
    assert verdict is not None
    (check,) = [ch for ch in verdict.evidence["sourceVerification"].checks if "Gitea" in ch.name]
    assert not check.passed and check.detail == "Gitea stalled: no answer within 0.1s in total"


def test_a_long_check_is_looked_at_less_often_as_it_runs() -> None:
    """Each look is a reconcile pass and a runtime call: a day-long check is looked at every 30 s, not every 2 s;
    a short one still every 2 s; never later than its deadline."""
    now = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)

    def look(ran: float, left: float = 86400.0) -> float:
        check = VerifyRunCheck(
            category="codeExecution",
            name="day",
            process="p1",
            started_at=now - timedelta(seconds=ran),
            deadline=now + timedelta(seconds=left),
        )
        return verify_step._next_look(check, now)

    assert look(0) == verify_step.POLL_SECONDS
    assert look(5) == verify_step.POLL_SECONDS
    assert look(100) == pytest.approx(20.0)
    assert look(3600) == verify_step.MAX_POLL_SECONDS
    assert look(3600, left=7) == pytest.approx(7.0)
    assert look(3600, left=-5) == verify_step.POLL_SECONDS  # past it: the next look kills it


async def test_source_probes_run_as_background_processes_and_detection_is_not_scored() -> None:
    """Before, the pass itself awaited `runtime.sh` for each source's check of its commit and its detection (up to
    a minute each, in the environment controller's worker)."""
    world = World()
    world.gitea.branches["acme/app@main"] = COMMIT
    world.runtime(URL).answers = [(copyin.DETECT_PROJECT, result(0, f"{copyin.RESULT_MARKER} python"))]
    state = new_pass(env_with({"install": True, "commands": [{"name": "unit", "command": "make test"}]}))
    step = VerifyStep(world.deps)
    # The first pass lists the checks and starts the sources' probes side by side, then returns to look soon.
    assert await step.verify(state) == verify_step.PROBE_POLL_SECONDS
    run = state.status.verify_run
    assert run is not None
    assert [(ch.name, ch.probe, bool(ch.process)) for ch in run.checks] == [
        (f"app: workspace has {COMMIT[:12]}", "SourceCommit", True),
        ("app: Gitea acme/app@main is the snapshot", None, False),
        ("app: project kind", "ProjectKind", True),
        ("unit", None, False),
    ]
    await verify(world, state)
    assert not [call for call in world.runtime(URL).calls if call.startswith("sh ")]
    verdict = state.status.verdict
    assert verdict is not None and verdict.result == "PASS", verdict
    names = {cat: [ch.name for ch in evidence.checks] for cat, evidence in verdict.evidence.items()}
    assert names == {
        "sourceVerification": [
            f"app: workspace has {COMMIT[:12]}",
            "app: Gitea acme/app@main is the snapshot",
        ],
        "installationHealth": ["app: installs from git"],
        "codeExecution": ["unit"],
    }


async def test_gitea_answering_500_just_after_the_push_is_asked_again() -> None:
    """Gitea records a pushed branch from a queue; in make e2e a pool's environment got FAIL from one 500 of
    `get branch` asked right after its copy-in."""
    world = World()
    world.gitea.branches["acme/app@main"] = COMMIT
    world.gitea.fail_with = GiteaError("get branch", 500, "Internal Server Error")
    world.runtime(URL).answers = [(copyin.DETECT_PROJECT, result(0, f"{copyin.RESULT_MARKER} other"))]
    state = new_pass(env_with({}))
    asyncio.get_running_loop().call_later(0.3, setattr, world.gitea, "fail_with", None)
    await asyncio.wait_for(verify(world, state), 5.0)
    verdict = state.status.verdict
    assert verdict is not None
    (check,) = [ch for ch in verdict.evidence["sourceVerification"].checks if "Gitea" in ch.name]
    assert check.passed, check
