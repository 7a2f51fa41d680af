"""The copy-in step with fakes: uploads awaited, sources snapshotted into typed status, the baseline taken
once, push requests answered (an invalid one with its reason)."""

from __future__ import annotations

import json

import pytest
from shadow_operator.api import constants as c
from shadow_operator.clients.runtime import ExecutionResult
from shadow_operator.controllers.environment.copyin import CopyInStep
from shadow_operator.controllers.environment.state import StepFailed
from shadow_operator.resources import copyin

from tests.support.fakes import World, environment, new_pass, settle, to_patch

pytestmark = pytest.mark.unit

URL = "http://demo.team.svc:8080"
COMMIT = "c" * 40
SPEC = {
    "sources": [
        {"name": "app", "repo": "acme/app", "upload": {}},
        {"name": "lib", "repo": "acme/lib", "git": {"url": "https://example.com/lib.git"}},
    ],
    "gitea": {"enabled": False},
    "gitRewrites": [{"from": "https://github.com/acme/", "to": "acme"}],
}


# A snapshot is a background process of the runtime: started, looked in on, read and removed.
SNAPSHOT_CALLS = ["start shadow-operator: snapshot", "running", "result", "remove"]


def snapshot_ok() -> tuple[str, ExecutionResult]:
    out = f"cloning...\n{copyin.RESULT_MARKER} {COMMIT} main\n"
    return copyin.SNAPSHOT, ExecutionResult(exit_code=0, stdout=out, stderr="", timed_out=False)


async def test_waits_for_the_upload_then_copies_both_and_captures_the_baseline_once() -> None:
    world = World()
    world.runtime(URL).answers = [snapshot_ok()]
    step = CopyInStep(world.deps)
    state = new_pass(environment(spec=SPEC, status={"runtimeURL": URL}))
    step.note_uploads(state)
    await settle(world, state, lambda: step.copy_in(state, None))
    assert not state.is_true(c.COND_SOURCES_READY)
    assert state.status.sources_ready == "1/2" and [s.name for s in state.status.sources or ()] == ["lib"]
    assert state.status.timings is None

    uploaded = environment(
        spec=SPEC,
        status=to_patch(state.status),
        annotations={c.ANNOTATION_UPLOAD_PREFIX + "app": "done"},
    )
    state = new_pass(uploaded)
    step.note_uploads(state)
    await settle(world, state, lambda: step.copy_in(state, None))
    assert state.is_true(c.COND_SOURCES_READY) and state.status.sources_ready == "2/2"
    sources = to_patch(state.status)["sources"]
    assert [s["name"] for s in sources] == ["app", "lib"]
    assert sources[0] == {
        "name": "app",
        "repo": "acme/app",
        "path": "app",
        "commit": COMMIT,
        "branch": "main",
        "cloneURL": "",
        "publicURL": "https://github.com/acme/app",
    }
    timings = state.status.timings
    assert timings is not None and timings.uploaded is not None and timings.copied_in is not None
    assert world.runtime(URL).calls.count("capture_baseline") == 1
    # Once copied in, another pass neither snapshots nor captures again.
    before = list(world.runtime(URL).calls)
    state = new_pass(environment(spec=SPEC, status=to_patch(state.status)))
    state.set(c.COND_SOURCES_READY, True, "SourcesCopied", "")
    await step.copy_in(state, None)
    assert world.runtime(URL).calls == before


async def test_a_source_that_cannot_be_fetched_fails_with_its_code() -> None:
    world = World()
    world.runtime(URL).answers = [
        (
            copyin.SNAPSHOT,
            ExecutionResult(exit_code=128, stdout="", stderr="fatal: not found", timed_out=False),
        )
    ]
    state = new_pass(environment(spec=SPEC, status={"runtimeURL": URL}))
    with pytest.raises(StepFailed) as failed:
        await settle(world, state, lambda: CopyInStep(world.deps).copy_in(state, None))
    assert failed.value.code == "SourceFetchFailed" and "fatal: not found" in failed.value.message


async def test_a_runtime_that_stalls_the_copy_in_fails_it_with_its_own_code() -> None:
    """Before, a stalled transfer was `RuntimeUnreachable`: no failure code, retried for ever in silence."""
    world = World()
    world.runtime(URL).stalled = "the download of x moved fewer than 1966080 bytes in 30s"
    state = new_pass(environment(spec=SPEC, status={"runtimeURL": URL}))
    with pytest.raises(StepFailed) as failed:
        await settle(world, state, lambda: CopyInStep(world.deps).copy_in(state, None))
    assert failed.value.code == "RuntimeStalled" and "source 'lib': the download" in failed.value.message


async def test_a_fork_keeps_the_baseline_its_clone_brought() -> None:
    world = World()
    world.runtime(URL).answers = [snapshot_ok()]
    world.runtime(URL).baseline = True
    spec = {"workspace": {"from": {"environment": "origin"}}, "gitea": {"enabled": False}}
    status = {
        "runtimeURL": URL,
        "clone": {
            "method": "Copy",
            "reason": "r",
            "source": "environment/origin",
            "sources": [{"name": "app", "repo": "acme/app", "path": "app"}],
        },
    }
    state = new_pass(environment(spec=spec, status=status))
    step = CopyInStep(world.deps)
    step.note_uploads(state)
    await settle(world, state, lambda: step.copy_in(state, None))
    assert state.is_true(c.COND_SOURCES_READY)
    assert "came with the clone" in state.conditions.items()[0].message
    assert "capture_baseline" not in world.runtime(URL).calls
    assert state.status.timings is not None and state.status.timings.uploaded is None


async def test_an_invalid_push_request_is_answered_with_its_reason_and_once() -> None:
    world = World()
    annotations = {c.ANNOTATION_PUSH_REQUEST: json.dumps({"id": "p1", "source": "app"})}
    state = new_pass(environment(spec=SPEC, status={"runtimeURL": URL}, annotations=annotations))
    step = CopyInStep(world.deps)
    await step.push_request(state, "token")
    last = state.status.last_push
    assert last is not None and last.id == "p1" and last.error and "branch" in last.error
    answered = new_pass(environment(spec=SPEC, status=to_patch(state.status), annotations=annotations))
    await step.push_request(answered, "token")
    assert answered.status.last_push == last and world.runtimes == {}


async def test_a_push_request_is_answered_by_an_operation_and_an_interrupted_one_is_not_run_again() -> None:
    world = World()
    request = {"id": "p2", "source": "app", "branch": "feature", "message": "promote"}
    annotations = {c.ANNOTATION_PUSH_REQUEST: json.dumps(request)}
    state = new_pass(environment(spec=SPEC, status={"runtimeURL": URL}, annotations=annotations))
    step = CopyInStep(world.deps)
    await step.push_request(state, "token")
    run = state.status.operation
    assert run is not None and (run.kind, run.request) == ("Push", "p2") and state.status.last_push is None
    await settle(world, state, lambda: step.push_request(state, "token"))
    last = state.status.last_push
    assert last is not None and last.id == "p2" and last.error == "source 'app' is not copied in (yet)"
    assert world.recorder.reasons() == ["Pushed"]

    # An operator that started after the push began (a restart, a new leader) does not push a second time.
    interrupted = {**to_patch(state.status), "lastPush": None, "operation": run.model_dump(by_alias=True)}
    taken = new_pass(environment(spec=SPEC, status=interrupted, annotations=annotations))
    await CopyInStep(World().deps).push_request(taken, "token")
    last = taken.status.last_push
    assert last is not None and last.id == "p2" and last.error and "not run twice" in last.error
    assert taken.status.operation is None


async def test_a_source_gitea_lost_is_pushed_again_without_a_new_baseline() -> None:
    """The Gitea step drops from status.sources a source whose snapshot a new, empty Gitea lacks: the copy-in
    pushes it again, and the diff baseline of the first copy-in stays."""
    world = World()
    world.runtime(URL).answers = [snapshot_ok()]
    step = CopyInStep(world.deps)
    only_lib = [
        {"name": "lib", "repo": "acme/lib", "path": "lib", "commit": COMMIT, "branch": "main", "cloneURL": ""}
    ]
    uploaded = {c.ANNOTATION_UPLOAD_PREFIX + "app": "done"}
    state = new_pass(
        environment(spec=SPEC, status={"runtimeURL": URL, "sources": only_lib}, annotations=uploaded)
    )
    state.set(c.COND_SOURCES_READY, True, "SourcesCopied", "")
    await settle(world, state, lambda: step.copy_in(state, None))
    assert [s.name for s in state.status.sources or ()] == ["app", "lib"]
    assert state.status.sources_ready == "2/2"
    assert world.runtime(URL).calls == SNAPSHOT_CALLS


async def test_while_gitea_starts_sources_are_fetched_into_the_workspace_once() -> None:
    """The workspace side of the copy-in does not wait for Gitea: the git source is cloned (and the upload,
    once it arrived, snapshotted) without a bundle and without a word in status; the copy-in proper later
    pushes."""
    world = World()
    world.runtime(URL).answers = [snapshot_ok()]
    step = CopyInStep(world.deps)
    spec = {**SPEC, "gitea": {"enabled": True}}
    state = new_pass(environment(spec=spec, status={"runtimeURL": URL}))
    await settle(world, state, lambda: step.prepare(state))
    assert world.runtime(URL).calls == SNAPSHOT_CALLS  # lib; app is not uploaded yet
    assert state.status.sources is None and not state.is_true(c.COND_SOURCES_READY)
    await step.prepare(state)
    assert len(world.runtime(URL).calls) == 4 and state.status.operation is None  # done once

    uploaded = environment(
        spec=spec, status={"runtimeURL": URL}, annotations={c.ANNOTATION_UPLOAD_PREFIX + "app": "done"}
    )
    state = new_pass(uploaded)
    await settle(world, state, lambda: step.prepare(state))
    assert world.runtime(URL).calls == SNAPSHOT_CALLS * 2
    # Nothing was bundled for Gitea: no fetch of a bundle, no delete.
    # Forgotten with the environment: a new one of the same name prepares again.
    step.forget(("team", "demo"))
    state = new_pass(uploaded)
    await settle(world, state, lambda: step.prepare(state))
    assert world.runtime(URL).calls == SNAPSHOT_CALLS * 4


async def test_a_source_that_cannot_be_cloned_fails_before_gitea_is_up() -> None:
    world = World()
    world.runtime(URL).answers = [
        (
            copyin.SNAPSHOT,
            ExecutionResult(exit_code=128, stdout="", stderr="fatal: no such repo", timed_out=False),
        )
    ]
    state = new_pass(environment(spec={**SPEC, "gitea": {"enabled": True}}, status={"runtimeURL": URL}))
    with pytest.raises(StepFailed) as failed:
        await settle(world, state, lambda: CopyInStep(world.deps).prepare(state))
    assert failed.value.code == "SourceFetchFailed" and "fatal: no such repo" in failed.value.message


async def test_a_fork_has_nothing_to_prepare() -> None:
    world = World()
    spec = {"workspace": {"from": {"environment": "origin"}}}
    await CopyInStep(world.deps).prepare(new_pass(environment(spec=spec, status={"runtimeURL": URL})))
    assert world.runtime(URL).calls == []


async def test_a_copy_in_an_operator_before_this_one_started_is_waited_for_not_started_again() -> None:
    """An operator that starts again (or a new leader) finds the snapshot's process in status.operation: it waits
    for that process and reads its answer instead of cloning the source a second time."""
    world = World()
    runtime = world.runtime(URL)
    runtime.processes["p-first"] = snapshot_ok()[1]
    operation = {
        "kind": "CopyIn",
        "id": "op-first",
        "source": "lib",
        "push": False,
        "process": "p-first",
        "startedAt": "2026-01-01T00:00:05Z",
        "deadline": "2026-01-01T01:00:05Z",
    }
    state = new_pass(environment(spec=SPEC, status={"runtimeURL": URL, "operation": operation}))
    step = CopyInStep(world.deps)
    assert await step.copy_in(state, None) is False  # carried on: the same operation and process
    taken = state.status.operation
    assert taken is not None and (taken.id, taken.process, taken.taken_over) == ("op-first", "p-first", 1)
    await settle(world, state, lambda: step.copy_in(state, None))
    assert [(s.name, s.commit) for s in state.status.sources or ()] == [("lib", COMMIT)]
    assert runtime.calls == ["running", "result", "remove"] and runtime.removed == ["p-first"]
    assert state.status.operation is None and to_patch(state.status)["operation"] is None  # cleared


async def test_the_record_of_a_source_that_left_the_spec_is_dropped() -> None:
    world = World()
    gone = {
        "kind": "CopyIn",
        "id": "op-gone",
        "source": "old",
        "push": False,
        "process": "p-gone",
        "startedAt": "2026-01-01T00:00:05Z",
        "deadline": "2026-01-01T01:00:05Z",
    }
    spec = {**SPEC, "sources": SPEC["sources"][1:]}  # lib only, copied in
    lib = {
        "name": "lib",
        "repo": "acme/lib",
        "path": "lib",
        "commit": COMMIT,
        "branch": "main",
        "cloneURL": "",
    }
    status = {"runtimeURL": URL, "sources": [lib], "operation": gone}
    state = new_pass(environment(spec=spec, status=status))
    assert await CopyInStep(world.deps).copy_in(state, None) is True
    assert state.status.operation is None and state.is_true(c.COND_SOURCES_READY)
    assert "start shadow-operator: snapshot" not in world.runtime(URL).calls
