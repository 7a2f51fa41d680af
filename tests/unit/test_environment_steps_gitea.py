"""The Gitea step with fakes: its children, the bootstrap once its Pod is Ready, failures counted in a row."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from shadow_operator.api import constants as c
from shadow_operator.api.kinds import NETWORK_POLICY, POD, SECRET, SERVICE, STATEFUL_SET
from shadow_operator.clients.gitea import GiteaError, GiteaTimedOut
from shadow_operator.controllers.config import Config
from shadow_operator.controllers.environment.gitea import BOOTSTRAP_ATTEMPTS, GiteaStep
from shadow_operator.controllers.environment.state import RETRY_SECONDS, Pass, StepFailed
from shadow_operator.resources import environment as res

from tests.support.fakes import NAMESPACE, World, environment, new_pass, settle, to_patch

pytestmark = pytest.mark.unit

SPEC = {
    "sources": [{"name": "app", "repo": "acme/app", "upload": {}}],
    "gitRewrites": [
        {"from": "https://github.com/acme/", "to": "acme"},
        {"from": "https://x.org/", "to": "x"},
    ],
}


def ready(sts: dict) -> dict:
    return {**sts, "status": {"readyReplicas": 1}}


async def made(world: World) -> tuple[GiteaStep, Any, dict, dict]:
    """The step, an environment and its Gitea's StatefulSet and credentials, as its first pass made them."""
    env = environment(spec=SPEC)
    step = GiteaStep(world.deps)
    sts, creds = await step.children(new_pass(env))
    return step, env, sts, creds


async def failed_setup(world: World, error: GiteaError) -> tuple[GiteaStep, Pass, dict, dict, StepFailed]:
    """A setup of a Ready Gitea whose calls fail with `error`, to its end: the step, the pass, the StatefulSet,
    the credentials and the failure the pass that read the end raised."""
    step, env, sts, creds = await made(world)
    world.gitea.fail_with = error
    state = new_pass(env)
    with pytest.raises(StepFailed) as failed:
        await settle(world, state, lambda: step.ready(state, ready(sts), creds))
    return step, state, sts, creds, failed.value


async def test_children_are_applied_and_the_credentials_generated_once() -> None:
    world, env = World(), environment(spec=SPEC)
    step = GiteaStep(world.deps)
    sts, creds = await step.children(new_pass(env))
    assert sts["metadata"]["name"] == res.gitea_name("demo")
    kinds = [kind for _, kind, _ in world.client.writes]
    assert kinds.count(SECRET.kind) == 1 and SERVICE.kind in kinds and STATEFUL_SET.kind in kinds
    assert kinds.count(NETWORK_POLICY.kind) == 2
    assert creds[c.GITEA_SECRET_USERNAME] == "shadow-admin" and len(creds[c.GITEA_SECRET_PASSWORD]) >= 24
    # The Secret is read from the cache afterwards: a second pass keeps the same password.
    secret = await world.client.get_live(SECRET, NAMESPACE, res.gitea_secret_name("demo"))
    assert secret is not None
    world.cache.store(SECRET).upsert({**secret, "metadata": {**secret["metadata"], "resourceVersion": "1"}})
    _, again = await step.children(new_pass(env))
    assert again[c.GITEA_SECRET_PASSWORD] == creds[c.GITEA_SECRET_PASSWORD]
    assert [kind for _, kind, _ in world.client.writes].count(SECRET.kind) == 1


def gitea_pod(sts: dict, controller_uid: str) -> dict:
    return {
        "metadata": {
            "name": f"{sts['metadata']['name']}-0",
            "namespace": NAMESPACE,
            "resourceVersion": "1",
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": "x",
                    "uid": controller_uid,
                    "controller": True,
                }
            ],
        },
        "status": {
            "containerStatuses": [
                {"name": "gitea", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "nope"}}}
            ]
        },
    }


async def test_a_pod_that_cannot_pull_its_image_is_a_failure_not_a_wait() -> None:
    world, env = World(), environment(spec=SPEC)
    step = GiteaStep(world.deps)
    sts, creds = await step.children(new_pass(env))
    # Read from the cache (the engine's additional feed of Gitea Pods), only when the StatefulSet controls it.
    world.cache.store(POD).upsert(gitea_pod(sts, "someone-else"))
    assert await step.ready(new_pass(env), sts, creds) is False
    world.cache.store(POD).upsert(
        {
            **gitea_pod(sts, sts["metadata"]["uid"]),
            "metadata": {**gitea_pod(sts, sts["metadata"]["uid"])["metadata"], "resourceVersion": "2"},
        }
    )
    with pytest.raises(StepFailed) as failed:
        await step.ready(new_pass(env), sts, creds)
    assert failed.value.code == "ImagePullFailed"


async def test_starting_then_bootstrapped_with_a_token_orgs_and_repos() -> None:
    world, env = World(), environment(spec=SPEC)
    step = GiteaStep(world.deps)
    sts, creds = await step.children(new_pass(env))
    state = new_pass(env)
    assert await step.ready(state, sts, creds) is False
    assert state.conditions.items()[0].reason == "GiteaStarting"
    assert state.status.timings is None

    # The setup is an operation: the pass that starts it goes on without Gitea (the workspace side)...
    with pytest.raises(StepFailed) as pending:
        await step.ready(state, ready(sts), creds)
    assert pending.value.code is None and pending.value.reason == "GiteaSettingUp"
    # Not polled while it runs: its end wakes the pass (polls of every environment waiting for its setup
    # filled the work queue at a thousand environments).
    assert pending.value.retry is None
    run = state.status.gitea_operation
    assert run is not None and run.kind == "GiteaSetup" and run.deadline > run.started_at
    # ... and the pass its end wakes reads how it ended.
    await world.deps.operations.settled()
    assert await step.ready(state, ready(sts), creds) is True
    assert state.status.gitea_operation is None
    assert state.is_true(c.COND_GITEA_READY)
    assert world.gitea.orgs == {"acme", "x"} and world.gitea.repos == {"acme/app"}
    assert creds[c.GITEA_SECRET_TOKEN] == "token-1"  # stored into the Secret by a patch
    assert ("patch", SECRET.kind, res.gitea_secret_name("demo")) in world.client.writes
    assert state.status.timings is not None and state.status.timings.gitea_ready is not None
    assert "GiteaBootstrapped" in world.recorder.reasons()
    # Done for this generation: no Gitea call on the next pass.
    opened = len(world.gitea.opened)
    assert await step.ready(state, ready(sts), creds) is True
    assert len(world.gitea.opened) == opened


async def test_a_token_gitea_no_longer_knows_is_replaced() -> None:
    world, env = World(), environment(spec=SPEC)
    step = GiteaStep(world.deps)
    sts, creds = await step.children(new_pass(env))
    creds[c.GITEA_SECRET_TOKEN] = "from-a-lost-volume"
    state = new_pass(env)
    assert await settle(world, state, lambda: step.ready(state, ready(sts), creds)) is True
    assert creds[c.GITEA_SECRET_TOKEN] == "token-1"


async def test_bootstrap_failures_retry_then_fail_with_the_password_redacted() -> None:
    world, env = World(Config(SHADOW_GITEA_SETUP_RETRY="0")), environment(spec=SPEC)
    step = GiteaStep(world.deps)
    sts, creds = await step.children(new_pass(env))
    world.gitea.fail_with = GiteaError("create token", 500, f"boom {creds[c.GITEA_SECRET_PASSWORD]}")
    state = new_pass(env)
    for _ in range(BOOTSTRAP_ATTEMPTS - 1):
        with pytest.raises(StepFailed) as failed:
            await settle(world, state, lambda: step.ready(state, ready(sts), creds))
        assert failed.value.code is None and failed.value.reason == "GiteaBootstrapRetrying"
    with pytest.raises(StepFailed) as failed:
        await settle(world, state, lambda: step.ready(state, ready(sts), creds))
    assert failed.value.code == "GiteaBootstrapFailed"
    assert creds[c.GITEA_SECRET_PASSWORD] not in failed.value.message
    # A success resets the count; forgetting the environment does too.
    world.gitea.fail_with = None
    assert await settle(world, state, lambda: step.ready(state, ready(sts), creds)) is True
    step.forget((NAMESPACE, "demo"))


async def test_a_failed_setup_is_started_again_only_after_a_pause() -> None:
    """Before, the pass that read a failed setup's end (its end wakes one at once) cleared it, and the next pass
    started another at once: a Gitea that refuses connections was tried, and counted towards
    GiteaBootstrapFailed, in a tight loop (integration: 20 attempts within seconds while Gitea started)."""
    world = World(Config(SHADOW_GITEA_SETUP_RETRY="0.3"))
    error = GiteaError("list tokens", 0, "ConnectError: All connection attempts failed")
    step, state, sts, creds, failed = await failed_setup(world, error)
    assert failed.reason == "GiteaBootstrapRetrying"
    opened = len(world.gitea.opened)
    # Passes within the pause start nothing: the same failure, and a retry when the pause ends.
    for _ in range(5):
        with pytest.raises(StepFailed) as again:
            await step.ready(state, ready(sts), creds)
        assert again.value.reason == "GiteaBootstrapRetrying" and again.value.retry is not None
        assert 0 < again.value.retry <= 0.3
        assert state.status.gitea_operation is None
    assert len(world.gitea.opened) == opened
    # After it, the next pass tries again, and a Gitea that answers now is set up.
    await asyncio.sleep(0.35)
    world.gitea.fail_with = None
    assert await settle(world, state, lambda: step.ready(state, ready(sts), creds)) is True


async def test_gitea_gets_an_emptydir_unless_persistence_is_enabled() -> None:
    world = World()
    step = GiteaStep(world.deps)
    sts, _ = await step.children(new_pass(environment(spec=SPEC)))
    assert "volumeClaimTemplates" not in sts["spec"]
    assert sts["spec"]["template"]["spec"]["volumes"][0]["emptyDir"] == {"sizeLimit": "1Gi"}
    persistent = environment("kept", spec={**SPEC, "gitea": {"persistence": {"enabled": True}}})
    sts, _ = await step.children(new_pass(persistent))
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == [res.GITEA_DATA_VOLUME]


async def test_a_gitea_statefulset_made_with_a_claim_keeps_it() -> None:
    """An environment from before emptyDir was the default: its StatefulSet's claim template cannot be removed
    (the API server refuses the change), so the step keeps building it with one."""
    world, env = World(), environment(spec=SPEC)
    step = GiteaStep(world.deps)
    old = res.build_gitea_statefulset(env.body, image="g", cluster_domain="c", on_volume=True)
    old["metadata"].update(resourceVersion="1", uid="sts-uid")
    world.cache.store(STATEFUL_SET).upsert(old)
    sts, _ = await step.children(new_pass(env))
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == [res.GITEA_DATA_VOLUME]


# A source the copy-in pushed to Gitea, as status.sources lists it.
COPIED_APP = {
    "name": "app",
    "repo": "acme/app",
    "path": "app",
    "commit": "c" * 40,
    "branch": "main",
    "cloneURL": "u",
}


def running_pod(sts: dict, uid: str) -> dict:
    pod = gitea_pod(sts, sts["metadata"]["uid"])
    pod["metadata"].update(uid=uid, resourceVersion=uid)
    pod["status"] = {"phase": "Running"}
    return pod


async def test_a_new_gitea_pod_that_lost_the_data_gets_the_sources_pushed_again() -> None:
    copied = [dict(COPIED_APP)]
    world = World()
    step = GiteaStep(world.deps)
    env = environment(spec=SPEC, status={"sources": copied})
    sts, creds = await step.children(new_pass(env))
    world.gitea.branches["acme/app@main"] = "c" * 40  # the copy-in pushed it
    world.cache.store(POD).upsert(running_pod(sts, "pod-1"))
    state = new_pass(env)
    assert await settle(world, state, lambda: step.ready(state, ready(sts), creds)) is True
    assert state.status.gitea_pod_uid == "pod-1" and state.status.sources
    # The same Pod: nothing to check. The data is there: nothing lost either.
    opened = len(world.gitea.opened)
    assert await step.ready(state, ready(sts), creds) is True
    assert len(world.gitea.opened) == opened

    # The Pod is replaced (rescheduled) and its emptyDir with it: a Gitea that knows nothing.
    world.gitea.tokens, world.gitea.orgs, world.gitea.repos, world.gitea.branches = [], set(), set(), {}
    world.cache.store(POD).upsert(running_pod(sts, "pod-2"))
    assert await settle(world, state, lambda: step.ready(state, ready(sts), creds)) is True
    assert state.status.gitea_pod_uid == "pod-2"
    assert creds[c.GITEA_SECRET_TOKEN] == "token-1" and world.gitea.repos == {"acme/app"}
    # The copy-in step pushes what status.sources no longer lists.
    assert state.status.sources == []
    assert "GiteaDataLost" in world.recorder.reasons()
    assert "pushed again" in state.conditions.items()[0].message


async def test_a_new_gitea_pod_with_its_data_loses_nothing() -> None:
    copied = [dict(COPIED_APP)]
    world = World()
    step = GiteaStep(world.deps)
    env = environment(spec={**SPEC, "gitea": {"persistence": {"enabled": True}}}, status={"sources": copied})
    sts, creds = await step.children(new_pass(env))
    world.gitea.branches["acme/app@main"] = "c" * 40
    world.cache.store(POD).upsert(running_pod(sts, "pod-1"))
    state = new_pass(env)
    assert await settle(world, state, lambda: step.ready(state, ready(sts), creds)) is True
    world.cache.store(POD).upsert(running_pod(sts, "pod-2"))
    assert await settle(world, state, lambda: step.ready(state, ready(sts), creds)) is True
    assert [s.name for s in state.status.sources or ()] == ["app"]
    assert state.status.gitea_pod_uid == "pod-2"
    assert "GiteaDataLost" not in world.recorder.reasons()


async def test_a_stalled_gitea_holds_no_pass_and_fails_with_giteastalled_at_its_deadline() -> None:
    """Before, the bootstrap was awaited in the pass: a Gitea that accepts and never answers held the reconcile
    worker (here: the pass never returned)."""
    world = World(Config(SHADOW_GITEA_SETUP_TIMEOUT="0.2", SHADOW_GITEA_SETUP_RETRY="0"))
    step, env, sts, creds = await made(world)
    world.gitea.stalled = True
    state = new_pass(env)
    with pytest.raises(StepFailed) as pending:
        await asyncio.wait_for(step.ready(state, ready(sts), creds), 1.0)
    assert pending.value.reason == "GiteaSettingUp"
    assert state.conditions.find(c.COND_GITEA_READY).reason == "GiteaSettingUp"  # type: ignore[union-attr]
    # A pass while it runs only looks.
    with pytest.raises(StepFailed):
        await asyncio.wait_for(step.ready(state, ready(sts), creds), 1.0)
    with pytest.raises(StepFailed) as failed:
        await settle(world, state, lambda: step.ready(state, ready(sts), creds))
    assert failed.value.code == "GiteaStalled" and failed.value.retry == RETRY_SECONDS
    assert "did not finish within 0.2s in total" in failed.value.message
    assert state.status.gitea_operation is None
    # Tried again in a later pass: the failure stands meanwhile, and goes once Gitea answers again.
    state.fail(failed.value)
    retry = new_pass(environment(spec=SPEC, status=to_patch(state.finish())))
    with pytest.raises(StepFailed) as again:
        await step.ready(retry, ready(sts), creds)
    assert again.value.code == "GiteaStalled" and retry.status.gitea_operation is not None
    world.gitea.stalled = False
    assert await settle(world, retry, lambda: step.ready(retry, ready(sts), creds)) is True


async def test_a_call_gitea_does_not_answer_in_time_is_a_stall_at_once() -> None:
    *_, failed = await failed_setup(World(), GiteaTimedOut("create token", 0, "ReadTimeout: timed out"))
    assert failed.code == "GiteaStalled" and "stopped answering" in failed.message


async def test_an_operator_that_takes_over_carries_the_setup_on_under_its_id() -> None:
    world = World()
    started = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    run = {
        "kind": "GiteaSetup",
        "id": "before",
        "startedAt": "2026-01-01T00:00:05Z",
        "deadline": "2026-01-01T00:02:05Z",
    }
    env = environment(spec=SPEC, status={"giteaOperation": run})
    step = GiteaStep(world.deps)
    sts, creds = await step.children(new_pass(env))
    state = new_pass(env)
    with pytest.raises(StepFailed):
        await step.ready(state, ready(sts), creds)
    taken = state.status.gitea_operation
    assert taken is not None and (taken.id, taken.started_at, taken.taken_over) == ("before", started, 1)
    assert await settle(world, state, lambda: step.ready(state, ready(sts), creds)) is True
    assert world.gitea.repos == {"acme/app"} and len(world.gitea.tokens) == 1


async def test_a_setup_of_a_pod_since_replaced_is_not_taken_for_the_new_one() -> None:
    world = World()
    step = GiteaStep(world.deps)
    env = environment(spec=SPEC)
    sts, creds = await step.children(new_pass(env))
    world.cache.store(POD).upsert(running_pod(sts, "pod-1"))
    state = new_pass(env)
    with pytest.raises(StepFailed):
        await step.ready(state, ready(sts), creds)
    first = state.status.gitea_operation
    await world.deps.operations.settled()
    world.cache.store(POD).upsert(running_pod(sts, "pod-2"))  # replaced while it was set up
    with pytest.raises(StepFailed) as pending:
        await step.ready(state, ready(sts), creds)
    assert pending.value.reason == "GiteaSettingUp"
    again = state.status.gitea_operation
    assert first is not None and again is not None and again.id != first.id
    assert await settle(world, state, lambda: step.ready(state, ready(sts), creds)) is True
    assert state.status.gitea_pod_uid == "pod-2"
