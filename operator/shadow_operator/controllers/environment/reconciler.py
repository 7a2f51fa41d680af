"""ShadowEnvironment reconciler: a workspace Sandbox, a Gitea, the sources copied in, and a verdict.

Each pass walks the same steps and stops at the first that is not done yet; every step is idempotent, so a
restart of the operator (or a second replica taking over) resumes where the last one stopped:

1. preflight: the SandboxTemplate, the StorageClass and the RuntimeClass exist (else `TemplateNotFound`,
   `StorageUnavailable`, `RuntimeClassNotFound`);
1b. a fork (spec.workspace.from): snapshot the source's volume after a flush and restore the workspace volume
   from it (claimed while the snapshot is cut), or, when no VolumeSnapshotClass serves it, plan a copy
   streamed between the runtimes (clone.py);
2. children: Gitea's Secret (credentials generated once), Service and StatefulSet (gitea.py), and the
   workspace Sandbox;
3. a Pod that will not start surfaces as `ImagePullFailed`, `Unschedulable` or `StorageUnavailable`;
4. Gitea bootstrap: the operator's API token, one organization per owner, one repository per source, as an
   operation off the workers with a deadline in total (gitea.py);
4b. a fork by copy: the source workspace's tree and its diff baseline are streamed into the new one;
4c. while Gitea is not ready yet, the workspace side of the copy-in runs: git sources are cloned and arrived
   uploads snapshotted (copyin.py `prepare`), so that only the push waits for Gitea;
5. copy-in (copyin.py): each source is cloned (or waits for its upload), snapshotted with its uncommitted
   work and pushed to Gitea; then the runtime captures the baseline that diffs are taken against;
6. verification (verify.py): seed 001's rubric, scored into `status.verdict`. Idleness is the workspace
   Sandbox's own (spec.autoSuspendPolicy, given by idle.py, which reports it).

The status is the typed `ShadowEnvironmentStatus` the engine validated; the steps change it and this module
writes it back. When each phase first finished goes to status.timings and to a histogram (metrics.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.environment import Failure, PhaseTimings, ShadowEnvironment
from shadow_operator.api.kinds import (
    NETWORK_POLICY,
    POD,
    PVC,
    RUNTIME_CLASS,
    SANDBOX,
    SANDBOX_TEMPLATE,
    SECRET,
    SERVICE,
    SHADOW_ENVIRONMENT,
    SHADOW_ENVIRONMENT_POOL,
    STATEFUL_SET,
    STORAGE_CLASS,
    ResourceKind,
)
from shadow_operator.api.models import ObjectMeta, Sandbox, SandboxStatus
from shadow_operator.clients import gitpush
from shadow_operator.clients.pacing import Slots
from shadow_operator.controllers import metrics
from shadow_operator.controllers.environment.clone import CloneStep, Restore
from shadow_operator.controllers.environment.copyin import CopyInStep
from shadow_operator.controllers.environment.gitea import GITEA_SETUP, GiteaStep
from shadow_operator.controllers.environment.idle import IdleStep
from shadow_operator.controllers.environment.pool import PoolStep
from shadow_operator.controllers.environment.state import (
    POLL_SECONDS,
    RETRY_SECONDS,
    Pass,
    Ports,
    StepFailed,
)
from shadow_operator.controllers.environment.verify import VerifyStep
from shadow_operator.engine import Cache, Cached, Index, Reconciler, Watch
from shadow_operator.engine.cache import Body, Key
from shadow_operator.engine.status import dump
from shadow_operator.resources import conditions as conds
from shadow_operator.resources import environment as res
from shadow_operator.resources import indexes as ix
from shadow_operator.resources.egress_narrowing import egress_narrowed


def _envs_in_namespace(template: Body, cache: Cache) -> Iterable[Key]:
    """A template changed: every environment of its namespace may start from it (the default is by name)."""
    namespace = template["metadata"]["namespace"]
    for env in cache.store(SHADOW_ENVIRONMENT).list(namespace):
        yield namespace, env["metadata"]["name"]


def _forks_of(env: Body, cache: Cache) -> Iterable[Key]:
    """An environment changed (e.g. its sources are in): the forks waiting for it may go on."""
    meta = env["metadata"]
    return cache.store(SHADOW_ENVIRONMENT).keys_by_index(ix.FORK_OF, f"{meta['namespace']}/{meta['name']}")


def _env_of_pod(pod: Body, cache: Cache) -> Iterable[Key]:
    """A workspace Pod -> its Sandbox -> the environment controlling it; a Gitea Pod -> its StatefulSet ->
    the environment controlling that (children are named after the environment's instance, which is not
    always the environment's name: spec.pool)."""
    meta = ObjectMeta.model_validate(pod["metadata"])
    if meta.labels.get(c.LABEL_COMPONENT) == c.COMPONENT_GITEA:
        ref = meta.controller
        if ref is not None and ref.kind == STATEFUL_SET.kind:
            yield from _controlling_env(cache.store(STATEFUL_SET).get(meta.namespace, ref.name))
        return
    yield from _controlling_env(cache.store(SANDBOX).get(meta.namespace, meta.name))


def _controlling_env(obj: Body | None) -> Iterable[Key]:
    meta = ObjectMeta.model_validate(obj["metadata"]) if obj is not None else None
    ref = meta.controller if meta is not None else None
    if meta is not None and ref is not None and ref.kind == SHADOW_ENVIRONMENT.kind:
        yield meta.namespace, ref.name


GITEA_PODS = f"{c.LABEL_COMPONENT}={c.COMPONENT_GITEA},{c.LABEL_ENVIRONMENT}"


class EnvironmentReconciler(Reconciler[ShadowEnvironment]):
    kind = SHADOW_ENVIRONMENT
    owns = (SANDBOX, STATEFUL_SET, SERVICE, SECRET, NETWORK_POLICY)
    watches = (
        Watch(SANDBOX_TEMPLATE, _envs_in_namespace),
        Watch(POD, _env_of_pod),
        Watch(SHADOW_ENVIRONMENT, _forks_of),
    )
    # Gitea's objects carry the environment's labels and the operator's managed-by label (no Sandbox label).
    cached = (
        Cached(STATEFUL_SET, c.LABEL_ENVIRONMENT),
        Cached(SECRET, c.MANAGED_BY_SELECTOR),
        Cached(SERVICE, c.MANAGED_BY_SELECTOR),
        # Gitea's Pods beside the Sandbox Pods (which the Pod cache holds by their Sandbox label).
        Cached(POD, GITEA_PODS, additional=True),
        Cached(SHADOW_ENVIRONMENT_POOL),
    )
    indexes = (
        Index(SHADOW_ENVIRONMENT, ix.FORK_OF, ix.fork_of),
        Index(SANDBOX, ix.BY_CONTROLLER, ix.by_controller),
    )
    workers = 4

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps = Ports(
            client=self.client,
            cache=self.cache,
            recorder=self.recorder,
            config=self.config,
            push_settings=gitpush.PushSettings(
                work_dir=self.config.git_work_dir,
                max_bundle_bytes=self.config.max_bundle_bytes,
                slots=Slots(
                    total=self.config.git_push_concurrency,
                    per_namespace=self.config.git_push_concurrency_per_namespace,
                ),
                timeout=self.config.git_push_timeout,
            ),
            operations=self.operations,
        )
        self.pool = PoolStep(self.steps)
        self.gitea = GiteaStep(self.steps)
        self.clone = CloneStep(self.steps)
        self.copy_in = CopyInStep(self.steps)
        self.verify = VerifyStep(self.steps)
        self.idle = IdleStep(self.steps)

    async def deleted(self, key: Key) -> None:
        self.gitea.forget(key)
        self.copy_in.forget(key)
        self.operations.forget(key)

    # ------------------------------------------------------------------------------------------ the pass
    async def reconcile(self, env: ShadowEnvironment) -> float | None:
        state = Pass(env)
        try:
            retry = await self._steps(state)
        except StepFailed as failed:
            state.fail(failed)
            retry = failed.retry
        # The start-up deadline: once the sources were in, a workspace that is not Ready is suspended or
        # recovering, not starting.
        if (
            not state.ready
            and state.failure is None
            and not state.is_true(c.COND_SOURCES_READY)
            and not env.spec.suspend  # stopped on request before its sources were in: not late
        ):
            created = env.metadata.creation_timestamp
            deadline = env.spec.startup_timeout_seconds
            if created is not None and (datetime.now(UTC) - created).total_seconds() > deadline:
                state.failure = Failure(
                    code="Timeout",
                    message=f"not Ready {deadline}s after creation; waiting for: {state.waiting_for()}",
                )
        await self._publish(env, state)
        return retry

    async def _steps(self, state: Pass) -> float | None:
        env, status = state.env, state.status
        template = await self._preflight(state)
        await self.pool.take(state, template)
        self.copy_in.note_uploads(state)
        gitea_on = env.spec.gitea.enabled
        status.gitea_url = res.gitea_url(state.named, self.config.cluster_domain) if gitea_on else None

        creds: dict[str, str] = {}
        sts = None
        if gitea_on:
            sts, creds = await self.gitea.children(state)
        restore: Restore | None = None
        if env.spec.workspace.from_ is not None:
            restore = await self.clone.restore(state)
        stopped = self.idle.stopped(state)
        sandbox = await self.steps.apply(
            SANDBOX,
            res.build_workspace_sandbox(
                state.named,
                template,
                gitea_base_url=status.gitea_url,
                suspended=stopped,
                auto_suspend_policy=self.idle.policy(state, template),
                data_source=restore.data_source if restore else None,
                storage_class=restore.storage_class if restore else None,
                min_size=restore.min_size if restore else None,
            ),
            env,
        )
        await self.idle.forward_resume(state, sandbox)
        workspace = Sandbox.from_body(sandbox)
        sb_status = workspace.status or SandboxStatus()
        status.runtime_url = sb_status.runtime_url
        status.runtime_token_secret = sb_status.runtime_token_secret
        status.preview_url = sb_status.preview_url

        if stopped:
            message = (
                "stopped on request (spec.suspend); its volume and Gitea are kept. Start it again with "
                f"shadowctl start {env.name} (spec.suspend: false)"
            )
            state.set(c.COND_WORKSPACE_READY, False, "Stopped", message)
            raise StepFailed(None, "Stopped", message, retry=None)
        if self.idle.suspended(state, workspace):
            policy = workspace.spec.auto_suspend_policy
            after = f" after {policy.suspend_threshold_seconds}s" if policy else ""
            message = (
                f"suspended{after} without activity; its volume is kept. Set the annotation "
                f"{c.ANNOTATION_RESUME_REQUEST} to a new value (shadowctl start) to resume"
            )
            state.set(c.COND_WORKSPACE_READY, False, "Suspended", message)
            raise StepFailed(None, "Suspended", message, retry=None)
        workspace_ready = await self._workspace(state, sb_status)
        if workspace_ready and not conds.is_true(state.old.conditions, c.COND_WORKSPACE_READY):
            # Said at once, before Gitea is set up: the client waits for it to upload (a pool's instance is
            # Ready in the first pass).
            await self._publish(env, state)

        gitea_ready = not gitea_on
        gitea_pending: StepFailed | None = None
        if gitea_on:
            assert sts is not None
            try:
                gitea_ready = await self.gitea.ready(state, sts, creds)
            except StepFailed as pending:
                if pending.code is not None:
                    raise
                gitea_pending = pending  # being set up: the workspace side need not wait for it
        else:
            state.remove(c.COND_GITEA_READY)
            if status.gitea_operation is not None:  # Gitea was turned off while it was set up
                self.operations.forget((env.namespace, env.name), GITEA_SETUP)
                status.gitea_operation = None
        if workspace_ready and restore is not None and status.clone and status.clone.completed_at is None:
            await self.clone.finish(state)
            return 0.0  # Cloned goes to status now, not after the copy-in (a fork's sources: the next pass)
        if workspace_ready and not gitea_ready:
            # Clones and snapshots in the workspace while Gitea starts; only the push waits for it.
            await self.copy_in.prepare(state)
        if gitea_pending is not None:
            if not workspace_ready and gitea_pending.retry is None:
                gitea_pending.retry = POLL_SECONDS  # the workspace's start-up failures are found by looking
            raise gitea_pending
        if not (workspace_ready and gitea_ready):
            return min(POLL_SECONDS, restore.poll or POLL_SECONDS) if restore else POLL_SECONDS

        sources_were_ready = state.is_true(c.COND_SOURCES_READY)
        if not await self.copy_in.copy_in(state, creds.get(c.GITEA_SECRET_TOKEN)):
            return None  # a source's copy-in is under way: its end wakes us
        if not state.is_true(c.COND_SOURCES_READY):
            return None  # waiting for an upload: its annotation wakes us
        if not sources_were_ready:
            return 0.0  # Ready now (written at the end of this pass); verification runs in the next one
        if gitea_on:
            await self.copy_in.push_request(state, creds.get(c.GITEA_SECRET_TOKEN))
        return await self.verify.verify(state)  # while a check runs in the workspace: when to look in on it

    async def _workspace(self, state: Pass, sb_status: SandboxStatus) -> bool:
        """Whether the workspace Pod is Ready; raises StepFailed when it cannot start."""
        env = state.env
        pod = self.cache.store(POD).get(env.namespace, state.instance)
        if conds.is_true(conds.of(pod), "PodScheduled"):
            state.mark("scheduled")
        if any(x.type == c.COND_READY and x.status == "True" for x in sb_status.conditions or ()):
            state.set(c.COND_WORKSPACE_READY, True, "WorkspaceReady", "the workspace Pod is Ready")
            state.mark("scheduled")  # a Pod scheduled and Ready before this pass saw it
            state.mark("workspace_ready")
            return True
        failure = res.pod_failure(pod, "workspace Pod", datetime.now(UTC)) or res.pvc_failure(
            self.cache.store(PVC).get(env.namespace, naming.pvc_name(c.WORKSPACE_VOLUME, state.instance)),
            "workspace",
        )
        if failure:
            raise StepFailed(failure[0], failure[0], failure[1])
        state.set(c.COND_WORKSPACE_READY, False, "WorkspaceStarting", "waiting for the workspace Pod")
        return False

    # ----------------------------------------------------------------------------------------- preflight
    async def _preflight(self, state: Pass) -> Body:
        env = state.env
        name = env.spec.template or self.config.default_template
        template = self.cache.store(SANDBOX_TEMPLATE).get(env.namespace, name)
        if template is None:
            raise StepFailed(
                "TemplateNotFound",
                "TemplateNotFound",
                f"SandboxTemplate {name!r} does not exist in namespace {env.namespace}; create it or set "
                "spec.template",
                retry=None,  # the template's creation wakes us
            )
        state.conditions.set_or_remove(c.COND_EGRESS_NARROWED, egress_narrowed(template, env.spec.egress))
        storage_class = env.spec.workspace.storage_class_name
        # Checked with a live read until the workspace's volume claim exists; after that the class is moot.
        claim = self.cache.store(PVC).get(env.namespace, naming.pvc_name(c.WORKSPACE_VOLUME, state.instance))
        if storage_class and claim is None:
            await self._require(
                STORAGE_CLASS,
                storage_class,
                "StorageUnavailable",
                f"StorageClass {storage_class!r} does not exist; use one of `kubectl get storageclass` or "
                "leave spec.workspace.storageClassName unset for the default",
            )
        # The RuntimeClass the workspace Pod runs with (the environment's, else the template's): the API server
        # refuses a Pod naming one that does not exist, so it is checked (live) while the Pod is not there yet.
        runtime_class = env.spec.runtime_class_name or res.template_runtime_class(template)
        if runtime_class and self.cache.store(POD).get(env.namespace, state.instance) is None:
            await self._require(
                RUNTIME_CLASS,
                runtime_class,
                "RuntimeClassNotFound",
                f"RuntimeClass {runtime_class!r} does not exist; use one of `kubectl get runtimeclass`, or "
                "leave spec.runtimeClassName unset for the template's",
            )
        return template

    async def _require(self, kind: ResourceKind, name: str, code: str, message: str) -> None:
        """A failure `code` with `message` (tried again later) when the cluster-scoped `name` does not exist."""
        if await self.client.get_live(kind, "", name) is None:
            raise StepFailed(code, code, message, retry=RETRY_SECONDS)

    # ------------------------------------------------------------------------------------------ status
    async def _publish(self, env: ShadowEnvironment, state: Pass) -> None:
        """Write what changed in this pass (a second call writes what changed since the first); a new failure
        is also told as an Event."""
        before = state.last
        failure = state.finish().failure
        if failure is not None and failure != before.failure:
            self.recorder.warn(env.body, reason=failure.code, message=failure.message[:1000])
        if await state.write(self.client, SHADOW_ENVIRONMENT):
            _observe_timings(env, dump(before.timings), state.status.timings)


def _observe_timings(env: ShadowEnvironment, before: dict[str, Any], timings: PhaseTimings | None) -> None:
    """Each phase that finished since the status `before` was written, in seconds since the environment's
    creation."""
    created = env.metadata.creation_timestamp
    if timings is None or created is None:
        return
    finished = timings.model_dump(by_alias=True, exclude_none=True)
    for phase, at in finished.items():
        if phase not in before:
            seconds = max((at - created).total_seconds(), 0.0)
            metrics.ENVIRONMENT_PHASE_SECONDS.labels(env.namespace, phase).observe(seconds)
