"""The copy-in step: each source is cloned (or waits for its upload), snapshotted with its uncommitted work and
pushed to Gitea (pushes.py); then the runtime captures the baseline that diffs are taken against. Once the
environment is Ready, the client's push requests (shadow.dev/push-request) are answered here too.

The workspace side does not wait for Gitea: while Gitea starts, `prepare` clones the git sources and snapshots
the uploads that arrived; the copy-in proper, once Gitea is set up, finds them in place (a snapshot of the same
tree is the same commit) and only bundles and pushes.

Each source's snapshot and push is an operation (engine/operations.py): started by a pass, recorded in
status.operation, run off the reconcile workers under the operations' slots, and read by the pass its end wakes.
A large copy-in of one tenant therefore holds no worker while another tenant's environment is served."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable
from datetime import timedelta
from typing import Final, TypeVar

from shadow_operator.api import constants as c
from shadow_operator.api.environment import OperationRun, PushStatus, SourceStatus
from shadow_operator.clients import gitpush
from shadow_operator.clients.gitea import GiteaError
from shadow_operator.clients.runtime import RuntimeRefused, RuntimeStalled, RuntimeUnavailable
from shadow_operator.common.sources import SourcePlan
from shadow_operator.controllers.environment import pushes
from shadow_operator.controllers.environment.state import RETRY_SECONDS, Pass, Ports, StepFailed, plans
from shadow_operator.engine import Outcome, Running
from shadow_operator.engine.cache import Key
from shadow_operator.resources import copyin
from shadow_operator.resources import environment as res

COPY_IN: Final = "CopyIn"
PUSH: Final = "Push"
INTERRUPTED = (
    "the operator stopped (a restart or a leader change) while it pushed; a push is not run twice: request it "
    "again"
)
T = TypeVar("T")


class CopyInStep:
    """Keeps, per environment, the sources already prepared in the workspace while Gitea started."""

    def __init__(self, deps: Ports) -> None:
        self.deps = deps
        self._prepared: dict[Key, set[str]] = {}

    def forget(self, key: Key) -> None:
        self._prepared.pop(key, None)

    def note_uploads(self, state: Pass) -> None:
        """Record when the client's uploads had all arrived (their annotations wake the pass at once)."""
        env = state.env
        uploads = [p.name for p in plans(state) if p.upload]
        annotations = env.metadata.annotations
        forked = env.spec.workspace.from_ is not None  # a fork's sources came with its clone
        if uploads and not forked and all(c.ANNOTATION_UPLOAD_PREFIX + n in annotations for n in uploads):
            state.mark("uploaded")

    async def prepare(self, state: Pass) -> None:
        """The workspace side of the copy-in, while Gitea is not ready: clone each git source and snapshot
        each upload that arrived, once, each as an operation (`_operate`). Nothing goes to status but the
        operation under way; a source that cannot be fetched fails now."""
        env = state.env
        if env.spec.workspace.from_ is not None:
            return  # a fork's sources came with its clone
        key = (env.namespace, env.name)
        prepared = self._prepared.setdefault(key, set())
        done = {s.name for s in state.status.sources or ()}
        annotations = env.metadata.annotations
        todo = [
            p
            for p in plans(state)
            if p.name not in done
            and p.name not in prepared
            and not (p.upload and (c.ANNOTATION_UPLOAD_PREFIX + p.name) not in annotations)
        ]
        for plan in todo:
            if await self._operate(state, plan, None, None) is None:
                return  # under way: its end wakes the pass
            prepared.add(plan.name)

    async def _operate(
        self, state: Pass, plan: SourcePlan, target: pushes.Target | None, token: str | None
    ) -> tuple[str, str] | None:
        """The copy-in of one source as an operation (engine/operations.py), recorded in status.operation:
        (commit, branch) once it ended, None while it (or another source's) is under way. Its failure is raised
        here as the StepFailed it ended with.

        The snapshot (a clone, for a git source) runs in the workspace as a background process of its runtime;
        the operation waits for it off the workers, then pushes the bundle. An operation this operator does not
        run (it started again, or took over as leader) is carried on: it waits for the same process rather
        than cloning again, and pushes (a snapshot of the same tree is the same commit)."""
        env, deps = state.env, self.deps
        key = (env.namespace, env.name)
        push = target is not None
        run = state.status.operation
        if run is not None and run.kind != COPY_IN:
            if isinstance(deps.operations.look(key, run.kind, run.id), Running):
                return None  # e.g. a push request's: its record stays until its answer is read
        elif run is not None:
            seen = deps.operations.look(key, COPY_IN, run.id)
            if isinstance(seen, Running):
                return None
            if seen is None and run.source == plan.name and run.process is not None:
                bundle = _bundle(run.id) if run.push else None
                self._start(state, plan, target, token, run.id, run.process, bundle, taken_over=run)
                return None
            state.status.operation = None  # set explicitly: the status patch clears it
            if isinstance(seen, Outcome):
                if isinstance(seen.error, TimeoutError):
                    raise StepFailed(
                        "SourceFetchFailed",
                        "SourceFetchFailed",
                        f"source {run.source!r}: the copy-in did not end by {run.deadline:%H:%M:%S} UTC",
                        retry=RETRY_SECONDS,
                    )
                if run.source == plan.name and run.push == push:
                    result: tuple[str, str] = seen.result()
                    return result
                if seen.error is None and not run.push and run.source is not None:
                    self._prepared.setdefault(key, set()).add(run.source)
        operation = secrets.token_hex(8)
        bundle = _bundle(operation) if push else None
        async with deps.runtime_for(env.namespace, state.instance, state.status.runtime_url) as runtime:
            process = await self._snapshot(pushes.start_snapshot(runtime, plan, bundle), plan, token)
        self._start(state, plan, target, token, operation, process, bundle, taken_over=None)
        return None

    def _start(
        self,
        state: Pass,
        plan: SourcePlan,
        target: pushes.Target | None,
        token: str | None,
        operation: str,
        process: str,
        bundle: str | None,
        *,
        taken_over: OperationRun | None,
    ) -> None:
        """Run the operation `operation` that waits for the snapshot `process` and pushes its bundle (`taken_over`:
        the record in status of one an operator before this one started)."""
        env, deps = state.env, self.deps
        runtime = deps.runtime_for(env.namespace, state.instance, state.status.runtime_url)

        async def work() -> tuple[str, str]:
            async with runtime:
                commit, branch = await self._snapshot(
                    pushes.finish_snapshot(runtime, plan, process, bundle, target, deps.push_settings),
                    plan,
                    token,
                )
            if target is not None:
                gitea_url = deps.gitea_api_url(state.named)
                async with deps.open_gitea(gitea_url, username="", token=target.token) as gitea:
                    try:
                        await gitea.set_default_branch(plan.org, plan.repo, branch)
                    except GiteaError as exc:
                        raise StepFailed(None, "GiteaBootstrapRetrying", str(exc)) from None
            return commit, branch

        # Every step is bounded on its own (the snapshot, each step of the push): this is the backstop.
        timeout = pushes.SNAPSHOT_TIMEOUT + 4 * deps.push_settings.timeout
        now = state.now()
        deps.operations.start(
            (env.namespace, env.name), COPY_IN, work, timeout=timeout, operation_id=operation
        )
        state.status.operation = OperationRun(
            kind=COPY_IN,
            id=operation,
            source=plan.name,
            push=target is not None,
            process=process,
            # One taken over keeps when it started; its deadline is this operator's.
            started_at=taken_over.started_at if taken_over is not None else now.replace(microsecond=0),
            deadline=(now + timedelta(seconds=timeout)).replace(microsecond=0),
            taken_over=(taken_over.taken_over or 0) + 1 if taken_over is not None else None,
        )

    async def _snapshot(self, snapshot: Awaitable[T], plan: SourcePlan, token: str | None) -> T:
        """Await a source's snapshot (its start, its end and push); its failure as a StepFailed with its code."""
        try:
            return await snapshot
        except RuntimeStalled as exc:
            raise StepFailed(
                "RuntimeStalled", "RuntimeStalled", f"source {plan.name!r}: {exc}", retry=RETRY_SECONDS
            ) from None
        except RuntimeUnavailable as exc:
            raise StepFailed(None, "RuntimeUnreachable", str(exc)) from None
        except (pushes.SnapshotFailed, gitpush.PushFailed, RuntimeRefused) as exc:
            what = f"cloning {plan.git_url}" if plan.git_url else "snapshotting the upload"
            if isinstance(exc, gitpush.PushFailed):
                what = f"pushing the snapshot to Gitea {plan.full_repo}"
            raise StepFailed(
                "SourceFetchFailed",
                "SourceFetchFailed",
                f"source {plan.name!r}: {what} failed: {copyin.redact(str(exc), [token or ''])}",
                retry=RETRY_SECONDS,
            ) from None

    async def copy_in(self, state: Pass, token: str | None) -> bool:
        """Copy in each source, one operation at a time, then capture the baseline: False while a source's
        operation is under way (its end wakes the pass)."""
        env, deps = state.env, self.deps
        planned = plans(state)
        forked = env.spec.workspace.from_ is not None
        done = {s.name: s for s in state.status.sources or ()}
        base_url = state.status.gitea_url
        rewrites = [r.model_dump(by_alias=True) for r in env.spec.git_rewrites or ()]
        annotations = env.metadata.annotations
        waiting = []
        under_way = None
        for plan in planned:
            if plan.name in done:
                continue
            # A fork's sources came with its clone; others are uploaded by the client.
            if plan.upload and not forked and (c.ANNOTATION_UPLOAD_PREFIX + plan.name) not in annotations:
                waiting.append(plan.name)
                continue
            push_url = f"{base_url}/{plan.full_repo}.git" if base_url else None
            target = None
            if push_url and token:
                target = pushes.Target(
                    f"{deps.gitea_api_url(state.named)}/{plan.full_repo}.git", push_url, token, env.namespace
                )
            copied = await self._operate(state, plan, target, token)
            if copied is None:
                under_way = plan.name
                break
            commit, branch = copied
            entry = {
                "name": plan.name,
                "repo": plan.full_repo,
                "path": plan.path,
                "commit": commit,
                "branch": branch,
                "cloneURL": push_url or "",
            }
            public = res.public_url(plan, rewrites)
            if public:
                entry["publicURL"] = public
            done[plan.name] = SourceStatus.model_validate(entry)
            state.status.sources = [done[p.name] for p in planned if p.name in done]
            deps.recorder.info(
                env.body,
                reason="SourceCopied",
                message=f"{plan.name}: {plan.full_repo}@{commit[:12]} ({branch})",
            )
        state.status.sources_ready = f"{len(done)}/{len(planned)}"
        run = state.status.operation
        # A source that left the spec while it was copied in: its operation is not read; its record goes.
        if (
            under_way is None
            and run is not None
            and run.kind == COPY_IN
            and not isinstance(deps.operations.look((env.namespace, env.name), COPY_IN, run.id), Running)
        ):
            state.status.operation = None
        if under_way is not None:
            if not state.is_true(c.COND_SOURCES_READY):  # else a source pushed again to a new Gitea
                slot = deps.operations.waiting((env.namespace, env.name), COPY_IN)
                message = f"copying in source {under_way}" + (" (waiting for a slot)" if slot else "")
                state.set(c.COND_SOURCES_READY, False, "CopyingIn", message)
            return False
        if waiting:
            state.set(
                c.COND_SOURCES_READY,
                False,
                "WaitingForUpload",
                f"waiting for the upload of {', '.join(waiting)} (shadowctl create --local, or "
                "shadow_operator.sdk.upload_source)",
            )
            return True
        if not state.is_true(c.COND_SOURCES_READY):
            baseline = "baseline captured"
            try:
                async with deps.runtime_for(
                    env.namespace, state.instance, state.status.runtime_url
                ) as runtime:
                    # A fork keeps the baseline its clone brought: it diffs against the original copy-in.
                    if forked and await runtime.has_baseline():
                        baseline = "the diff baseline came with the clone"
                    else:
                        await runtime.capture_baseline(list(c.BASELINE_EXCLUDE))
            except RuntimeUnavailable as exc:
                raise StepFailed(None, "RuntimeUnreachable", str(exc)) from None
            state.set(
                c.COND_SOURCES_READY,
                True,
                "SourcesCopied",
                f"{len(planned)} source(s) copied in; {baseline}",
            )
        state.mark("copied_in")
        return True

    async def push_request(self, state: Pass, token: str | None) -> None:
        """Answer the client's shadow.dev/push-request (pushes.py) in status.lastPush, by an operation recorded in
        status.operation. A push is not idempotent (a promote makes a new commit): one that an operator before
        this one started is answered as interrupted, never run a second time."""
        env, deps = state.env, self.deps
        key = (env.namespace, env.name)
        run = state.status.operation
        if run is not None and run.kind == PUSH:
            seen = deps.operations.look(key, PUSH, run.id)
            if isinstance(seen, Running):
                return
            state.status.operation = None  # set explicitly: the status patch clears it
            if seen is None:
                state.status.last_push = pushes.answer(run.request or "", error=INTERRUPTED)
                return
            try:
                answer: PushStatus = seen.result()
            except TimeoutError:
                answer = pushes.answer(
                    run.request or "", error=f"the push did not end by {run.deadline:%H:%M:%S} UTC"
                )
            except RuntimeUnavailable as exc:
                raise StepFailed(None, "RuntimeUnreachable", str(exc)) from None
            state.status.last_push = answer
            outcome = (
                f"failed: {answer.error}" if answer.error else f"{answer.repo}@{(answer.commit or '')[:12]}"
            )
            deps.recorder.info(
                env.body, reason="Pushed", message=f"push {answer.id} ({answer.branch}) {outcome}"[:1000]
            )
            return
        request = pushes.pending_request(env.metadata.annotations, state.status.last_push)
        if isinstance(request, PushStatus):  # not a valid request: answered with the reason
            state.status.last_push = request
            return
        if request is None or not token:
            return
        copied = {s.name for s in state.status.sources or ()}
        planned = plans(state)
        runtime = deps.runtime_for(env.namespace, state.instance, state.status.runtime_url)
        gitea_url = deps.gitea_api_url(state.named)
        clone_base = str(state.status.gitea_url)

        async def work() -> PushStatus:
            async with runtime, deps.open_gitea(gitea_url, username="", token=token) as gitea:
                return await pushes.perform(
                    request,
                    runtime,
                    gitea,
                    planned,
                    copied,
                    push_base=gitea_url,
                    clone_base=clone_base,
                    token=token,
                    settings=deps.push_settings,
                    tenant=env.namespace,
                )

        # Every step is bounded on its own (the snapshot, each step of the push): this is the backstop.
        timeout = pushes.SNAPSHOT_TIMEOUT + 4 * deps.push_settings.timeout
        now = state.now()
        state.status.operation = OperationRun(
            kind=PUSH,
            id=deps.operations.start(key, PUSH, work, timeout=timeout),
            request=request.id,
            started_at=now.replace(microsecond=0),
            deadline=(now + timedelta(seconds=timeout)).replace(microsecond=0),
        )


def _bundle(operation: str) -> str:
    """Where the copy-in operation `operation` has the workspace write its bundle (one that takes over finds it)."""
    return f"{pushes.BUNDLE_DIR}/{operation}.bundle"
