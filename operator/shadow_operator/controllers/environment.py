"""ShadowEnvironment reconciler: a workspace Sandbox, a Gitea, the sources copied in, and a verdict.

Each pass walks the same steps and stops at the first that is not done yet; every step is idempotent, so a
restart of the operator (or a second replica taking over) resumes where the last one stopped:

1. preflight: the SandboxTemplate and the StorageClass exist (else `TemplateNotFound`, `StorageUnavailable`);
1b. a fork (spec.workspace.from): snapshot the source's volume after a flush and wait until it is ready to
   use, or, when no VolumeSnapshotClass serves it, plan a copy streamed between the runtimes (step 4b);
2. children: the Gitea Secret (credentials generated once), Service and StatefulSet, and the workspace Sandbox;
3. a Pod that will not start surfaces as `ImagePullFailed`, `Unschedulable` or `StorageUnavailable`;
4. Gitea bootstrap: the operator's API token, one organization per owner, one repository per source;
4b. a fork by copy: the source workspace's tree and its diff baseline are streamed into the new one;
5. copy-in: each source is cloned (or waits for its upload), snapshotted with its uncommitted work and pushed
   to Gitea; then the runtime captures the baseline that diffs are taken against;
6. verification: seed 001's rubric, scored into `status.verdict`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.api.kinds import (
    NETWORK_POLICY,
    POD,
    PVC,
    SANDBOX,
    SANDBOX_TEMPLATE,
    SECRET,
    SERVICE,
    SHADOW_ENVIRONMENT,
    STATEFUL_SET,
    STORAGE_CLASS,
    VOLUME_SNAPSHOT,
    VOLUME_SNAPSHOT_CLASS,
)
from shadow_operator.clients import gitpush
from shadow_operator.clients.gitea import Gitea, GiteaError
from shadow_operator.clients.kube import ApiError
from shadow_operator.clients.runtime import (
    ExecResult,
    Runtime,
    RuntimeAnswerTooLarge,
    RuntimeRefused,
    RuntimeUnavailable,
)
from shadow_operator.controllers import pushes
from shadow_operator.engine import Cache, Cached, Index, NotOwned, Reconciler, Watch
from shadow_operator.engine.cache import Body, Key
from shadow_operator.resources import conditions as conds
from shadow_operator.resources import copyin, gitea_policy, snapshots
from shadow_operator.resources import environment as res
from shadow_operator.resources import indexes as ix
from shadow_operator.resources.verdict import (
    CODE_EXECUTION,
    INSTALLATION_HEALTH,
    SOURCE_VERIFICATION,
    CheckResult,
    score_verdict,
)

_log = logging.getLogger("shadow_operator.environment")

# VolumeSnapshots are not watched (their API is optional): one is read this often while it is being cut.
SNAPSHOT_POLL_SECONDS = 0.5
POLL_SECONDS = 3.0  # while Pods start: Gitea's Pod is not watched, and start-up failures must show quickly
RETRY_SECONDS = 30.0  # after a failure that may heal (a source that could not be fetched, a missing class)
BOOTSTRAP_ATTEMPTS = 20  # consecutive failures of a ready Gitea before GiteaBootstrapFailed
ADMIN_USERNAME = "shadow-admin"
BASELINE_EXCLUDE = [".git/", ".sandbox-runtime/", "__pycache__/"]
# The runtime's diff baseline, in its state directory on the volume (a copy-fork takes it along).
BASELINE_DIR = ".sandbox-runtime/baseline"


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
    """A workspace Pod -> its Sandbox -> the environment that Sandbox belongs to."""
    meta = pod["metadata"]
    sandbox = cache.store(SANDBOX).get(meta.get("namespace", ""), meta["name"])
    env = ((sandbox or {}).get("metadata", {}).get("labels") or {}).get(c.LABEL_ENVIRONMENT)
    if env:
        yield meta["namespace"], env


@dataclass(frozen=True)
class _Restore:
    """What a fork's workspace volume is made from."""

    data_source: dict[str, str] | None  # a VolumeSnapshot, or None (an empty volume the copy fills)
    storage_class: str | None
    min_size: str | None


class StepFailed(Exception):
    """A step cannot complete; `code` is a failure code for status (None: keep waiting, not a failure)."""

    def __init__(
        self, code: str | None, reason: str, message: str, retry: float | None = POLL_SECONDS
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.retry = retry


class EnvironmentReconciler(Reconciler[ShadowEnvironment]):
    kind = SHADOW_ENVIRONMENT
    owns = (SANDBOX, STATEFUL_SET, SERVICE, SECRET, NETWORK_POLICY)
    watches = (
        Watch(SANDBOX_TEMPLATE, _envs_in_namespace),
        Watch(POD, _env_of_pod),
        Watch(SHADOW_ENVIRONMENT, _forks_of),
    )
    cached = (Cached(STATEFUL_SET, c.LABEL_ENVIRONMENT),)
    indexes = (Index(SHADOW_ENVIRONMENT, ix.FORK_OF, ix.fork_of),)
    workers = 4

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._bootstrap_failures: dict[Key, int] = {}
        self._push_settings = gitpush.PushSettings(
            work_dir=self.config.git_work_dir,
            max_bundle_bytes=self.config.max_bundle_bytes,
            slots=asyncio.Semaphore(self.config.git_push_concurrency),
        )

    async def deleted(self, key: Key) -> None:
        self._bootstrap_failures.pop(key, None)

    # ------------------------------------------------------------------------------------------ the pass
    async def reconcile(self, env: ShadowEnvironment) -> float | None:
        if env.deleting:
            return None
        state = _Status(env)
        try:
            retry = await self._steps(env, state)
        except StepFailed as failed:
            state.fail(failed)
            retry = failed.retry
        # The start-up deadline: once the sources were in, a workspace that is not Ready is suspended or
        # recovering, not starting.
        if (
            not state.ready
            and state.failure is None
            and not conds.is_true(state.conditions, c.COND_SOURCES_READY)
        ):
            created = env.metadata.creation_timestamp
            deadline = env.spec.startup_timeout_seconds
            if created is not None and (datetime.now(UTC) - created).total_seconds() > deadline:
                state.failure = {
                    "code": "Timeout",
                    "message": f"not Ready {deadline}s after creation; waiting for: {state.waiting_for()}",
                }
        await self._write_status(env, state)
        return retry

    async def _steps(self, env: ShadowEnvironment, state: _Status) -> float | None:
        body, ns = env.body, env.namespace
        template = await self._preflight(env)
        gitea_on = env.spec.gitea.enabled
        base_url = res.gitea_url(body, self.config.cluster_domain) if gitea_on else None
        state.status["giteaURL"] = base_url

        creds: dict[str, str] = {}
        sts = None
        if gitea_on:
            creds = await self._ensure_gitea_secret(env)
            await self._apply(SERVICE, res.build_gitea_service(body), env)
            for policy in gitea_policy.build_gitea_network_policies(body, self.config.operator_namespace):
                await self._apply(NETWORK_POLICY, policy, env)
            sts = await self._apply(
                STATEFUL_SET,
                res.build_gitea_statefulset(
                    body,
                    image=self.config.gitea_image,
                    cluster_domain=self.config.cluster_domain,
                    pull_policy=self.config.gitea_image_pull_policy,
                ),
                env,
            )
        restore: _Restore | None = None
        if env.spec.workspace.from_ is not None:
            restore = await self._clone(env, state)
        suspended = self._suspended(env, state)
        sandbox = await self._apply(
            SANDBOX,
            res.build_workspace_sandbox(
                body,
                template,
                gitea_base_url=base_url,
                suspended=suspended,
                data_source=restore.data_source if restore else None,
                storage_class=restore.storage_class if restore else None,
                min_size=restore.min_size if restore else None,
            ),
            env,
        )
        sb_status = sandbox.get("status") or {}
        state.status.update(
            sandbox=env.name,
            runtimeURL=sb_status.get("runtimeURL"),
            runtimeTokenSecret=sb_status.get("runtimeTokenSecret"),
            previewURL=sb_status.get("previewURL"),
        )

        if suspended:
            message = (
                f"suspended after {env.spec.idle_timeout_seconds}s without activity; its volume is kept. "
                f"Set the annotation {c.ANNOTATION_RESUME_REQUEST} to a new value to resume"
            )
            state.set(c.COND_WORKSPACE_READY, False, "Suspended", message)
            raise StepFailed(None, "Suspended", message, retry=None)
        workspace_ready = conds.is_true(sb_status.get("conditions"), c.COND_READY)
        if workspace_ready:
            state.set(c.COND_WORKSPACE_READY, True, "WorkspaceReady", "the workspace Pod is Ready")
        else:
            pod = self.cache.store(POD).get(ns, env.name)
            failure = res.pod_failure(pod, "workspace Pod", datetime.now(UTC)) or res.pvc_failure(
                self.cache.store(PVC).get(ns, naming.pvc_name(c.WORKSPACE_VOLUME, env.name)), "workspace"
            )
            if failure:
                raise StepFailed(failure[0], failure[0], failure[1])
            state.set(c.COND_WORKSPACE_READY, False, "WorkspaceStarting", "waiting for the workspace Pod")

        gitea_ready = not gitea_on
        if gitea_on:
            assert sts is not None
            gitea_ready = await self._gitea(env, state, sts, creds)
        else:
            state.remove(c.COND_GITEA_READY)
        if workspace_ready and restore is not None:
            await self._finish_clone(env, state)
        if not (workspace_ready and gitea_ready):
            return POLL_SECONDS

        sources_were_ready = conds.is_true(state.conditions, c.COND_SOURCES_READY)
        await self._copy_in(env, state, creds.get(c.GITEA_SECRET_TOKEN))
        if not conds.is_true(state.conditions, c.COND_SOURCES_READY):
            return None  # waiting for an upload: its annotation wakes us
        if not sources_were_ready:
            return 0.0  # Ready now (written at the end of this pass); verification runs in the next one
        if gitea_on:
            await self._push_request(env, state, creds.get(c.GITEA_SECRET_TOKEN))
        await self._verify(env, state)
        return await self._suspend_if_idle(env, state)

    # ------------------------------------------------------------------------------------------ idleness
    def _suspended(self, env: ShadowEnvironment, state: _Status) -> bool:
        idle = dict(state.status.get("idle") or {})
        resume = env.metadata.annotations.get(c.ANNOTATION_RESUME_REQUEST)
        if idle.get("suspendedAt") and resume and resume != idle.get("resumeRequest"):
            idle = {"resumeRequest": resume, "suspendedAt": None}
            state.status["idle"] = idle
            self.recorder.info(env.body, reason="Resumed", message="workspace resumed on request")
        return bool(idle.get("suspendedAt"))

    async def _suspend_if_idle(self, env: ShadowEnvironment, state: _Status) -> float | None:
        timeout = env.spec.idle_timeout_seconds
        if not timeout:
            return None
        async with self._runtime(env, state) as runtime:
            try:
                idle = await runtime.idle_seconds()
            except RuntimeUnavailable:
                return POLL_SECONDS * 10
        if idle < timeout:
            return timeout - idle + 1.0
        state.status["idle"] = {
            **(state.status.get("idle") or {}),
            "suspendedAt": conds.now_rfc3339(),
        }
        self.recorder.info(
            env.body, reason="Suspended", message=f"no runtime activity for {int(idle)}s: workspace suspended"
        )
        return 0.0  # the next pass suspends the Sandbox and reports it

    # ----------------------------------------------------------------------------------------- preflight
    async def _preflight(self, env: ShadowEnvironment) -> Body:
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
        storage_class = env.spec.workspace.storage_class_name
        # Checked with a live read until the workspace's volume claim exists; after that the class is moot.
        claim = self.cache.store(PVC).get(env.namespace, naming.pvc_name(c.WORKSPACE_VOLUME, env.name))
        if (
            storage_class
            and claim is None
            and await self.client.get_live(STORAGE_CLASS, "", storage_class) is None
        ):
            raise StepFailed(
                "StorageUnavailable",
                "StorageUnavailable",
                f"StorageClass {storage_class!r} does not exist; use one of `kubectl get storageclass` or "
                "leave spec.workspace.storageClassName unset for the default",
                retry=RETRY_SECONDS,
            )
        return template

    async def _apply(self, kind: Any, manifest: dict[str, Any], env: ShadowEnvironment) -> Body:
        try:
            return await self.client.apply(kind, manifest, owner=env.body)
        except NotOwned:
            name = manifest["metadata"]["name"]
            raise StepFailed(
                None,
                "NameConflict",
                f"{kind} {name!r} exists and does not belong to this environment; delete it or rename the "
                "environment",
                retry=RETRY_SECONDS,
            ) from None

    # ------------------------------------------------------------------------------------------ forks
    async def _clone(self, env: ShadowEnvironment, state: _Status) -> _Restore:
        """Decide how to clone (once), take the snapshot and wait until it can be restored.

        Returns what the workspace volume is made from. Raises StepFailed while the snapshot is being cut, so
        the Sandbox (and its volume) is only created from a snapshot that is ready to use.
        """
        origin = env.spec.workspace.from_
        assert origin is not None
        clone = dict(state.status.get("clone") or {})
        if not clone:
            clone = await self._plan_clone(env)
            state.status.update(clone=clone, cloneMethod=clone["method"])
            self.recorder.info(env.body, reason="Cloning", message=f"{clone['method']}: {clone['reason']}")
        if clone["method"] == "Copy":
            if not clone.get("completedAt"):
                state.set(c.COND_CLONED, False, "Copying", f"copy planned: {clone['reason']}")
            return _Restore(None, clone.get("storageClassName"), clone.get("restoreSize"))
        name = clone["snapshot"]
        if not clone.get("restoreSize"):
            snapshot = await self.client.get_live(VOLUME_SNAPSHOT, env.namespace, name)
            if snapshot is None:
                if origin.snapshot:
                    raise StepFailed(
                        "CloneSourceNotFound",
                        "CloneSourceNotFound",
                        f"VolumeSnapshot {name!r} does not exist in namespace {env.namespace} any more",
                        retry=None,
                    )
                snapshot = await self._take_snapshot(env, clone)
            phase, detail = snapshots.snapshot_state(snapshot)
            if phase == "Failed":
                raise StepFailed(
                    "SnapshotFailed", "SnapshotFailed", f"VolumeSnapshot {name}: {detail}", retry=None
                )
            if phase == "Pending":
                timeout = origin.timeout_seconds
                started = conds.parse_time(clone.get("startedAt")) or datetime.now(UTC)
                if (datetime.now(UTC) - started).total_seconds() > timeout:
                    raise StepFailed(
                        "SnapshotTimeout",
                        "SnapshotTimeout",
                        f"VolumeSnapshot {name} was not ready to use {timeout}s after it was requested "
                        f"({detail}); check the snapshot controller and the CSI driver "
                        "(kubectl describe volumesnapshot), or fork with spec.workspace.from.method: Copy",
                        retry=None,
                    )
                message = f"VolumeSnapshot {name}: {detail}"
                state.set(c.COND_CLONED, False, "Snapshotting", message)
                raise StepFailed(None, "Snapshotting", message, retry=SNAPSHOT_POLL_SECONDS)
            size = (snapshot.get("status") or {}).get("restoreSize")
            clone["restoreSize"] = str(size) if size else clone.get("restoreSize") or "0"
            state.status["clone"] = clone
        if not clone.get("completedAt"):
            state.set(
                c.COND_CLONED,
                False,
                "Restoring",
                f"restoring VolumeSnapshot {name} into the workspace volume",
            )
        restore_size = clone.get("restoreSize")
        return _Restore(
            snapshots.data_source(name),
            clone.get("storageClassName"),
            restore_size if restore_size != "0" else None,
        )

    async def _plan_clone(self, env: ShadowEnvironment) -> dict[str, Any]:
        origin = env.spec.workspace.from_
        assert origin is not None
        ns, started = env.namespace, conds.now_rfc3339()
        if origin.snapshot:
            snapshot = await self.client.get_live(VOLUME_SNAPSHOT, ns, origin.snapshot)
            if snapshot is None:
                raise StepFailed(
                    "CloneSourceNotFound",
                    "CloneSourceNotFound",
                    f"VolumeSnapshot {origin.snapshot!r} does not exist in namespace {ns}; take one with "
                    "`shadowctl snapshot ENV` or name an existing one (kubectl get volumesnapshot)",
                    retry=RETRY_SECONDS,
                )
            annotations = snapshot["metadata"].get("annotations") or {}
            return {
                "method": "Snapshot",
                "reason": f"restoring VolumeSnapshot {origin.snapshot}",
                "source": f"volumesnapshot/{origin.snapshot}",
                "snapshot": origin.snapshot,
                "storageClassName": env.spec.workspace.storage_class_name
                or await self._class_for_snapshot(snapshot),
                "sources": snapshots.parse_sources_annotation(annotations.get(c.ANNOTATION_SNAPSHOT_SOURCES)),
                "startedAt": started,
            }
        name = origin.environment
        assert name is not None
        source = self.cache.store(SHADOW_ENVIRONMENT).get(ns, name)
        if source is None or name == env.name:
            raise StepFailed(
                "CloneSourceNotFound",
                "CloneSourceNotFound",
                f"environment {name!r} does not exist in namespace {ns}"
                if source is None
                else "an environment cannot fork itself",
                retry=None,  # its creation wakes us
            )
        src_status = source.get("status") or {}
        if not conds.is_true(src_status.get("conditions"), c.COND_SOURCES_READY):
            raise StepFailed(
                None,
                "WaitingForSource",
                f"waiting for environment {name} to have its sources copied in",
                retry=None,
            )
        pvc = self.cache.store(PVC).get(ns, naming.pvc_name(c.WORKSPACE_VOLUME, name))
        if pvc is None:
            raise StepFailed(None, "WaitingForSource", f"environment {name} has no workspace volume yet")
        source_class = pvc["spec"].get("storageClassName")
        target_class = env.spec.workspace.storage_class_name or source_class
        clone: dict[str, Any] = {
            "source": f"environment/{name}",
            "storageClassName": target_class,
            "restoreSize": ((pvc.get("status") or {}).get("capacity") or {}).get("storage")
            or pvc["spec"]["resources"]["requests"]["storage"],
            "sources": [{k: s[k] for k in ("name", "repo", "path")} for s in src_status.get("sources") or ()],
            "startedAt": started,
        }
        if origin.method == "Copy":
            return {**clone, "method": "Copy", "reason": "spec.workspace.from.method is Copy"}
        choice = await self._snapshot_class(source_class, target_class)
        if choice.name is None:
            if origin.method == "Snapshot":
                raise StepFailed(
                    "SnapshotUnsupported",
                    "SnapshotUnsupported",
                    f"cannot snapshot environment {name}'s volume: {choice.reason}; install a "
                    "VolumeSnapshotClass for its driver, or set spec.workspace.from.method to Auto to copy",
                    retry=RETRY_SECONDS,
                )
            return {**clone, "method": "Copy", "reason": f"{choice.reason}: copying through the runtimes"}
        return {
            **clone,
            "method": "Snapshot",
            "reason": choice.reason,
            "snapshot": naming.bounded(f"{env.name}-fork"),
            "snapshotClassName": choice.name,
            "restoreSize": None,
        }

    async def _snapshot_class(
        self, source_class: str | None, target_class: str | None
    ) -> snapshots.ClassChoice:
        storage_class = await self.client.get_live(STORAGE_CLASS, "", source_class) if source_class else None
        driver = snapshots.volume_driver(storage_class)
        if target_class != source_class:
            target = await self.client.get_live(STORAGE_CLASS, "", target_class) if target_class else None
            if snapshots.volume_driver(target) != driver:
                return snapshots.ClassChoice(
                    None, f"StorageClass {target_class} is served by another driver than the source volume"
                )
        try:
            classes = await self.client.kube.list(VOLUME_SNAPSHOT_CLASS.path())
        except ApiError as exc:
            if exc.not_found:
                return snapshots.choose_class(driver, (), api_installed=False)
            raise
        return snapshots.choose_class(driver, classes)

    async def _class_for_snapshot(self, snapshot: Body) -> str | None:
        """A StorageClass of the snapshot's driver (the default one if it is), to restore it into."""
        class_name = (snapshot.get("spec") or {}).get("volumeSnapshotClassName")
        klass = await self.client.get_live(VOLUME_SNAPSHOT_CLASS, "", class_name) if class_name else None
        driver = (klass or {}).get("driver")
        if not driver:
            return None
        candidates = [
            sc for sc in await self.client.kube.list(STORAGE_CLASS.path()) if sc.get("provisioner") == driver
        ]
        candidates.sort(
            key=lambda sc: (
                (sc["metadata"].get("annotations") or {}).get("storageclass.kubernetes.io/is-default-class")
                != "true",
                sc["metadata"]["name"],
            )
        )
        return str(candidates[0]["metadata"]["name"]) if candidates else None

    async def _take_snapshot(self, env: ShadowEnvironment, clone: dict[str, Any]) -> Body:
        """Flush the source workspace's writes to its volume, then snapshot the volume."""
        origin = env.spec.workspace.from_
        assert origin is not None and origin.environment
        source_name, ns = origin.environment, env.namespace
        source = self.cache.store(SHADOW_ENVIRONMENT).get(ns, source_name) or {}
        sandbox = self.cache.store(SANDBOX).get(ns, source_name)
        # A suspended workspace has no Pod and nothing to flush; a running one must flush first.
        if conds.is_true(((sandbox or {}).get("status") or {}).get("conditions"), c.COND_READY):
            try:
                async with self._runtime_for(
                    ns, source_name, (source.get("status") or {}).get("runtimeURL")
                ) as rt:
                    await rt.flush()
            except RuntimeUnavailable as exc:
                raise StepFailed(
                    None, "WaitingForSource", f"flushing environment {source_name}'s workspace: {exc}"
                ) from None
        manifest = snapshots.build_volume_snapshot(
            name=clone["snapshot"],
            namespace=ns,
            pvc=naming.pvc_name(c.WORKSPACE_VOLUME, source_name),
            class_name=clone["snapshotClassName"],
            environment=env.name,
            snapshot_of=source_name,
            sources=clone.get("sources") or (),
        )
        if origin.retain_snapshot:
            try:
                created = await self.client.create(VOLUME_SNAPSHOT, manifest)
            except ApiError as exc:
                if not exc.already_exists:
                    raise
                created = await self.client.get_live(VOLUME_SNAPSHOT, ns, clone["snapshot"]) or manifest
        else:
            created = await self._apply(VOLUME_SNAPSHOT, manifest, env)
        self.recorder.info(
            env.body,
            reason="SnapshotCreated",
            message=f"VolumeSnapshot {clone['snapshot']} of environment {source_name}'s workspace "
            f"(class {clone['snapshotClassName']})",
        )
        return created

    async def _finish_clone(self, env: ShadowEnvironment, state: _Status) -> None:
        """The workspace Pod is up on its new volume: a snapshot is restored; a copy is streamed in now."""
        clone = dict(state.status.get("clone") or {})
        if clone.get("completedAt"):
            return
        origin = env.spec.workspace.from_
        assert origin is not None
        if clone["method"] == "Copy":
            clone["copiedBytes"] = await self._copy_workspace(env, state, clone, origin.timeout_seconds)
            reason, message = (
                "Copied",
                f"copied from {clone['source']} through the runtimes ({clone['reason']})",
            )
        else:
            reason, message = "SnapshotRestored", f"restored from VolumeSnapshot {clone['snapshot']}"
        clone["completedAt"] = conds.now_rfc3339()
        state.status["clone"] = clone
        state.set(c.COND_CLONED, True, reason, message)
        self.recorder.info(env.body, reason="Cloned", message=message)

    async def _copy_workspace(
        self, env: ShadowEnvironment, state: _Status, clone: dict[str, Any], timeout: int
    ) -> int:
        source_name = clone["source"].partition("/")[2]
        source = self.cache.store(SHADOW_ENVIRONMENT).get(env.namespace, source_name)
        if source is None:
            raise StepFailed(
                "CloneSourceNotFound",
                "CloneSourceNotFound",
                f"environment {source_name!r} was deleted before its workspace was copied",
                retry=None,
            )
        started = conds.parse_time(clone.get("startedAt")) or datetime.now(UTC)
        remaining = timeout - (datetime.now(UTC) - started).total_seconds()
        if remaining <= 0:
            raise StepFailed(
                "CopyFailed",
                "CopyFailed",
                f"environment {source_name}'s workspace was not copied within {timeout}s; is it running "
                "(not suspended)? Raise spec.workspace.from.timeoutSeconds for large workspaces",
                retry=None,
            )
        url = (source.get("status") or {}).get("runtimeURL")
        try:
            async with (
                self._runtime_for(env.namespace, source_name, url) as origin,
                self._runtime(env, state) as target,
            ):
                async with asyncio.timeout(remaining):
                    copied = await origin.copy_tree_to(target, "", timeout=remaining)
                    if await origin.has_baseline():
                        # The diff baseline comes along, so the fork diffs (and promotes) against the sources
                        # as they were copied in, like a snapshot's clone.
                        copied += await origin.copy_tree_to(target, BASELINE_DIR, timeout=remaining)
        except TimeoutError:
            raise StepFailed(
                "CopyFailed",
                "CopyFailed",
                f"copying environment {source_name}'s workspace took longer than {timeout}s; raise "
                "spec.workspace.from.timeoutSeconds for large workspaces",
                retry=None,
            ) from None
        except RuntimeRefused as exc:
            raise StepFailed(
                "CopyFailed", "CopyFailed", f"copying the workspace: {exc}", retry=RETRY_SECONDS
            ) from None
        except RuntimeUnavailable as exc:
            message = f"copying from environment {source_name} (it must be running): {exc}"
            state.set(c.COND_CLONED, False, "Copying", message)
            raise StepFailed(None, "Copying", message) from None
        return copied

    # ------------------------------------------------------------------------------------------- Gitea
    async def _ensure_gitea_secret(self, env: ShadowEnvironment) -> dict[str, str]:
        """The admin credentials, generated once; the API token is added by the bootstrap."""
        name = res.gitea_secret_name(env.name)
        secret = self.cache.store(SECRET).get(env.namespace, name)
        if secret is None:
            manifest = res.build_gitea_secret(env.body, ADMIN_USERNAME, secrets.token_urlsafe(24))
            secret = await self._apply(SECRET, manifest, env)
        return _secret_data(secret)

    async def _gitea(self, env: ShadowEnvironment, state: _Status, sts: Body, creds: dict[str, str]) -> bool:
        key = (env.namespace, env.name)
        if (sts.get("status") or {}).get("readyReplicas", 0) < 1:
            pod = await self.client.get_live(POD, env.namespace, f"{sts['metadata']['name']}-0")
            failure = res.pod_failure(pod, "Gitea Pod", datetime.now(UTC))
            if failure:
                raise StepFailed(failure[0], failure[0], failure[1])
            state.set(c.COND_GITEA_READY, False, "GiteaStarting", "waiting for the Gitea Pod")
            return False
        done = conds.find(state.conditions, c.COND_GITEA_READY)
        if (
            done
            and done.get("status") == "True"
            and done.get("observedGeneration") == env.metadata.generation
            and creds.get(c.GITEA_SECRET_TOKEN)
        ):
            return True
        try:
            created = await self._bootstrap(env, creds, self._plans(env, state.status))
        except GiteaError as exc:
            failures = self._bootstrap_failures.get(key, 0) + 1
            self._bootstrap_failures[key] = failures
            message = copyin.redact(str(exc), creds.values())
            if failures >= BOOTSTRAP_ATTEMPTS:
                raise StepFailed(
                    "GiteaBootstrapFailed",
                    "GiteaBootstrapFailed",
                    f"Gitea is running but could not be set up after {failures} attempts: {message}",
                    retry=RETRY_SECONDS,
                ) from None
            raise StepFailed(None, "GiteaBootstrapRetrying", f"setting up Gitea: {message}") from None
        self._bootstrap_failures.pop(key, None)
        state.set(c.COND_GITEA_READY, True, "GiteaReady", "Gitea is up; organizations and repositories exist")
        if created:
            self.recorder.info(
                env.body, reason="GiteaBootstrapped", message=f"Created in Gitea: {', '.join(created)}"
            )
        return True

    def _gitea_api_url(self, env: ShadowEnvironment) -> str:
        return self.config.gitea_api_url or res.gitea_url(env.body, self.config.cluster_domain)

    async def _bootstrap(
        self, env: ShadowEnvironment, creds: dict[str, str], plans: list[res.SourcePlan]
    ) -> list[str]:
        """Token, organizations, repositories: each created only when missing. Returns what was created."""
        url = self._gitea_api_url(env)
        username = creds[c.GITEA_SECRET_USERNAME]
        token = creds.get(c.GITEA_SECRET_TOKEN)
        if token:
            async with Gitea(url, username=username, token=token) as probe:
                try:
                    await probe.whoami()
                except GiteaError as exc:
                    if exc.status != 401:
                        raise
                    token = None  # Gitea's data was lost (volume recreated): make a new token
        if not token:
            async with Gitea(url, username=username, password=creds[c.GITEA_SECRET_PASSWORD]) as admin:
                token = await admin.create_token()
            name = res.gitea_secret_name(env.name)
            await self.client.patch(
                SECRET, env.namespace, name, {"stringData": {c.GITEA_SECRET_TOKEN: token}}
            )
            creds[c.GITEA_SECRET_TOKEN] = token
        created: list[str] = []
        orgs = {p.org for p in plans} | {r.to for r in env.spec.git_rewrites or ()}
        async with Gitea(url, username=username, token=token) as gitea:
            for org in sorted(orgs):
                if await gitea.ensure_org(org):
                    created.append(org)
            for plan in plans:
                _, new = await gitea.ensure_repo(plan.org, plan.repo)
                if new:
                    created.append(plan.full_repo)
        return created

    # ------------------------------------------------------------------------------------------ copy-in
    def _runtime(self, env: ShadowEnvironment, state: _Status) -> Runtime:
        return self._runtime_for(env.namespace, env.name, state.status.get("runtimeURL"))

    def _runtime_for(self, namespace: str, name: str, url: str | None) -> Runtime:
        """The runtime of the workspace Sandbox `name` (an environment's, named like it)."""
        url = self.config.runtime_api_url or url
        if not url:
            raise StepFailed(None, "RuntimeUnknown", f"the workspace {name} has no runtime URL yet")
        secret = self.cache.store(SECRET).get(namespace, naming.token_secret_name(name))
        token = _secret_data(secret).get(c.RUNTIME_TOKEN_KEY) if secret else None
        return Runtime(url, token, max_answer_bytes=self.config.runtime_max_answer_bytes)

    def _plans(self, env: ShadowEnvironment, status: dict[str, Any]) -> list[res.SourcePlan]:
        return res.plan_sources(env.body, (status.get("clone") or {}).get("sources"))

    async def _copy_in(self, env: ShadowEnvironment, state: _Status, token: str | None) -> None:
        plans = self._plans(env, state.status)
        forked = env.spec.workspace.from_ is not None
        done = {s["name"]: s for s in state.status.get("sources") or ()}
        base_url = state.status.get("giteaURL")
        rewrites = [r.model_dump(by_alias=True) for r in env.spec.git_rewrites or ()]
        annotations = env.metadata.annotations
        waiting = []
        async with contextlib.AsyncExitStack() as stack:
            runtime = await stack.enter_async_context(self._runtime(env, state))
            gitea = None
            if base_url and token:
                gitea = await stack.enter_async_context(
                    Gitea(self._gitea_api_url(env), username="", token=token)
                )
            for plan in plans:
                if plan.name in done:
                    continue
                # A fork's sources came with its clone; others are uploaded by the client.
                if plan.upload and not forked and (c.ANNOTATION_UPLOAD_PREFIX + plan.name) not in annotations:
                    waiting.append(plan.name)
                    continue
                push_url = f"{base_url}/{plan.full_repo}.git" if base_url else None
                target = None
                if push_url and token:
                    push_base = self._gitea_api_url(env)
                    target = pushes.Target(f"{push_base}/{plan.full_repo}.git", push_url, token)
                try:
                    commit, branch = await pushes.snapshot_and_push(
                        runtime, plan, target, self._push_settings
                    )
                except RuntimeUnavailable as exc:
                    raise StepFailed(None, "RuntimeUnreachable", str(exc)) from None
                except (pushes.SnapshotFailed, gitpush.PushFailed) as exc:
                    what = f"cloning {plan.git_url}" if plan.git_url else "snapshotting the upload"
                    if isinstance(exc, gitpush.PushFailed):
                        what = f"pushing the snapshot to Gitea {plan.full_repo}"
                    raise StepFailed(
                        "SourceFetchFailed",
                        "SourceFetchFailed",
                        f"source {plan.name!r}: {what} failed: {copyin.redact(str(exc), [token or ''])}",
                        retry=RETRY_SECONDS,
                    ) from None
                if gitea is not None:
                    try:
                        await gitea.set_default_branch(plan.org, plan.repo, branch)
                    except GiteaError as exc:
                        raise StepFailed(None, "GiteaBootstrapRetrying", str(exc)) from None
                entry: dict[str, Any] = {
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
                done[plan.name] = entry
                state.status["sources"] = [done[p.name] for p in plans if p.name in done]
                self.recorder.info(
                    env.body,
                    reason="SourceCopied",
                    message=f"{plan.name}: {plan.full_repo}@{commit[:12]} ({branch})",
                )
            state.status["sourcesReady"] = f"{len(done)}/{len(plans)}"
            if waiting:
                state.set(
                    c.COND_SOURCES_READY,
                    False,
                    "WaitingForUpload",
                    f"waiting for the upload of {', '.join(waiting)} (shadowctl create --local, or "
                    "shadow_operator.sdk.upload_source)",
                )
                return
            baseline = "baseline captured"
            if not conds.is_true(state.conditions, c.COND_SOURCES_READY):
                try:
                    # A fork keeps the baseline its clone brought: it diffs against the original copy-in.
                    if forked and await runtime.has_baseline():
                        baseline = "the diff baseline came with the clone"
                    else:
                        await runtime.capture_baseline(BASELINE_EXCLUDE)
                except RuntimeUnavailable as exc:
                    raise StepFailed(None, "RuntimeUnreachable", str(exc)) from None
                state.set(
                    c.COND_SOURCES_READY,
                    True,
                    "SourcesCopied",
                    f"{len(plans)} source(s) copied in; {baseline}",
                )

    async def _push_request(self, env: ShadowEnvironment, state: _Status, token: str | None) -> None:
        """Answer the client's shadow.dev/push-request (controllers/pushes.py) in status.lastPush."""
        request = pushes.pending_request(env.metadata.annotations, state.status.get("lastPush"))
        if isinstance(request, dict):  # not a valid request: answered with the reason
            state.status["lastPush"] = request
            return
        if request is None or not token:
            return
        copied = {s["name"] for s in state.status.get("sources") or ()}
        try:
            async with (
                self._runtime(env, state) as runtime,
                Gitea(self._gitea_api_url(env), username="", token=token) as gitea,
            ):
                state.status["lastPush"] = await pushes.perform(
                    request,
                    runtime,
                    gitea,
                    self._plans(env, state.status),
                    copied,
                    push_base=self._gitea_api_url(env),
                    clone_base=str(state.status.get("giteaURL")),
                    token=token,
                    settings=self._push_settings,
                )
        except RuntimeUnavailable as exc:
            raise StepFailed(None, "RuntimeUnreachable", str(exc)) from None
        last = state.status["lastPush"]
        outcome = f"failed: {last['error']}" if last.get("error") else f"{last['repo']}@{last['commit'][:12]}"
        self.recorder.info(
            env.body, reason="Pushed", message=f"push {request.id} ({last.get('branch')}) {outcome}"[:1000]
        )

    # ------------------------------------------------------------------------------------------ verify
    async def _verify(self, env: ShadowEnvironment, state: _Status) -> None:
        verify = env.spec.verify
        trigger = env.metadata.annotations.get(c.ANNOTATION_VERIFY_REQUEST)
        verdict = state.status.get("verdict")
        if not verify.enabled and trigger is None:
            state.remove(c.COND_VERIFIED)
            return
        if (
            verdict
            and verdict.get("observedGeneration") == env.metadata.generation
            and verdict.get("trigger") == trigger
        ):
            return
        checks: dict[str, list[CheckResult]] = {
            SOURCE_VERIFICATION: [],
            INSTALLATION_HEALTH: [],
            CODE_EXECUTION: [],
        }
        sources = state.status.get("sources") or []
        async with self._runtime(env, state) as runtime:
            try:
                await self._check_sources(env, runtime, sources, checks[SOURCE_VERIFICATION])
                if verify.install:
                    await self._check_installs(runtime, sources, checks[INSTALLATION_HEALTH])
                for command in verify.commands or ():
                    try:
                        result = await runtime.sh(
                            command.command,
                            cwd=command.cwd or "",
                            timeout=float(command.timeout_seconds),
                            tag=f"shadow-operator: verify {command.name}",
                        )
                    except RuntimeAnswerTooLarge as exc:
                        checks[CODE_EXECUTION].append(CheckResult(command.name, False, str(exc)))
                        continue
                    detail = f"exit code {result.exit_code}" + (" (timed out)" if result.timed_out else "")
                    if result.output:
                        detail += ": " + _evidence(result, 400)
                    checks[CODE_EXECUTION].append(CheckResult(command.name, result.ok, detail))
            except RuntimeUnavailable as exc:
                raise StepFailed(None, "RuntimeUnreachable", str(exc)) from None
        new = score_verdict(
            checks,
            pass_threshold=verify.pass_threshold,
            verified_at=datetime.now(UTC),
            generation=env.metadata.generation,
        )
        if trigger is not None:
            new["trigger"] = trigger
        state.status["verdict"] = new
        passed = new["result"] == "PASS"
        message = (
            f"{new['result']}: score {new['score']}/{new['maxScore']} (threshold {new['passThreshold']})"
        )
        state.set(c.COND_VERIFIED, passed, "VerificationPassed" if passed else "VerificationFailed", message)
        if passed:
            self.recorder.info(env.body, reason="VerificationPassed", message=message)
        else:
            self.recorder.warn(
                env.body, reason="VerificationFailed", message=message + "; " + "; ".join(new["issues"])[:600]
            )

    async def _check_sources(
        self, env: ShadowEnvironment, runtime: Runtime, sources: list[dict[str, Any]], out: list[CheckResult]
    ) -> None:
        async with contextlib.AsyncExitStack() as stack:
            gitea = None
            if env.spec.gitea.enabled:
                gitea = await stack.enter_async_context(Gitea(self._gitea_api_url(env), username=""))
            for src in sources:
                check = f"{src['name']}: workspace has {src['commit'][:12]}"
                try:
                    result = await runtime.sh(
                        copyin.VERIFY_SOURCE,
                        env={"SHADOW_PATH": src["path"], "SHADOW_COMMIT": src["commit"]},
                        timeout=60.0,
                        tag="shadow-operator: verify source",
                    )
                except RuntimeAnswerTooLarge as exc:
                    out.append(CheckResult(check, False, str(exc)))
                else:
                    out.append(CheckResult(check, result.ok, "" if result.ok else _evidence(result, 300)))
                if gitea is not None:
                    out.append(await _gitea_holds_snapshot(gitea, src))

    async def _check_installs(
        self, runtime: Runtime, sources: list[dict[str, Any]], out: list[CheckResult]
    ) -> None:
        for src in sources:
            detected = await runtime.sh(
                copyin.DETECT_PROJECT,
                env={"SHADOW_PATH": src["path"]},
                timeout=30.0,
                tag="shadow-operator: detect",
            )
            kind = (copyin.parse_result(detected.stdout) or ["other"])[0]
            if kind not in ("python", "node"):
                continue
            # Python installs go through the public URL that the rewrites redirect (the fidelity this is
            # about); npm turns GitHub URLs into tarball downloads that bypass git, so it uses Gitea's URL.
            url = str(src.get("publicURL") if kind == "python" and src.get("publicURL") else src["cloneURL"])
            script = copyin.INSTALL_PYTHON if kind == "python" else copyin.INSTALL_NODE
            check = f"{src['name']}: installs from git"
            try:
                result = await runtime.sh(
                    script,
                    env={"SHADOW_URL": url, "SHADOW_BRANCH": src["branch"], **copyin.author_env()},
                    timeout=600.0,
                    tag="shadow-operator: verify install",
                )
            except RuntimeAnswerTooLarge as exc:
                out.append(CheckResult(check, False, str(exc)))
                continue
            detail = f"{'pip' if kind == 'python' else 'npm'} install from {url}@{src['branch']}: exit code {result.exit_code}"
            if not result.ok and result.output:
                detail += ": " + _evidence(result, 400)
            out.append(CheckResult(check, result.ok, detail))

    # ------------------------------------------------------------------------------------------ status
    async def _write_status(self, env: ShadowEnvironment, state: _Status) -> None:
        new = state.finish()
        old = env.body.get("status") or {}
        unchanged = all(old.get(k) == v for k, v in new.items() if k != "conditions")
        if unchanged and conds.same(old.get("conditions"), new.get("conditions")):
            return
        failure, old_failure = new.get("failure"), old.get("failure")
        if failure and failure != old_failure:
            self.recorder.warn(env.body, reason=failure["code"], message=failure["message"][:1000])
        await self.client.patch_status(SHADOW_ENVIRONMENT, env.body, new)


def _evidence(result: ExecResult, limit: int) -> str:
    """The tail of a command's output for a verdict, saying when the output was longer than what was kept."""
    tail = copyin.tail(result.output, limit)
    return f"(output truncated) {tail}" if result.truncated else tail


async def _gitea_holds_snapshot(gitea: Gitea, src: dict[str, Any]) -> CheckResult:
    org, _, repo = src["repo"].partition("/")
    try:
        head, error = await gitea.branch_commit(org, repo, src["branch"]), ""
    except GiteaError as exc:
        head, error = None, str(exc)
    ok = head == src["commit"]
    detail = error or ("" if ok else f"branch {src['branch']} is at {head or 'nothing'}")
    return CheckResult(f"{src['name']}: Gitea {src['repo']}@{src['branch']} is the snapshot", ok, detail)


def _secret_data(secret: Body | None) -> dict[str, str]:
    data: dict[str, str] = {}
    for key, value in ((secret or {}).get("data") or {}).items():
        data[key] = base64.b64decode(value).decode()
    for key, value in ((secret or {}).get("stringData") or {}).items():
        data[key] = value
    return data


class _Status:
    """The status being built in one pass: conditions merged with the old ones, other fields replaced."""

    def __init__(self, env: ShadowEnvironment) -> None:
        self.env = env
        old = env.body.get("status") or {}
        self.generation = env.metadata.generation
        self.conditions: list[dict[str, Any]] = [dict(x) for x in old.get("conditions") or ()]
        self.status: dict[str, Any] = {
            k: old[k]
            for k in (
                "sources",
                "sourcesReady",
                "verdict",
                "runtimeURL",
                "sandbox",
                "idle",
                "clone",
                "cloneMethod",
                "lastPush",
            )
            if k in old
        }
        self.failure: dict[str, str] | None = None
        self.stopped_at: str | None = None  # reason of the step that could not complete in this pass

    def set(self, type_: str, status: bool, reason: str, message: str) -> None:
        self.conditions = conds.merge(
            self.conditions, [conds.make_condition(type_, status, reason, message, self.generation)]
        )

    def remove(self, type_: str) -> None:
        self.conditions = [x for x in self.conditions if x["type"] != type_]

    def fail(self, failed: StepFailed) -> None:
        if failed.code is not None:
            self.failure = {"code": failed.code, "message": failed.message}
        self.stopped_at = failed.reason
        self.set(c.COND_READY, False, failed.reason, failed.message)

    @property
    def ready(self) -> bool:
        needed = [c.COND_WORKSPACE_READY, c.COND_SOURCES_READY]
        if self.env.spec.gitea.enabled:
            needed.append(c.COND_GITEA_READY)
        return all(conds.is_true(self.conditions, t) for t in needed)

    def waiting_for(self) -> str:
        needed = [c.COND_WORKSPACE_READY, c.COND_GITEA_READY, c.COND_SOURCES_READY]
        missing = [t for t in needed if not conds.is_true(self.conditions, t)]
        if not self.env.spec.gitea.enabled and c.COND_GITEA_READY in missing:
            missing.remove(c.COND_GITEA_READY)
        return ", ".join(missing) or "nothing"

    def finish(self) -> dict[str, Any]:
        if self.failure is not None:
            self.set(c.COND_READY, False, self.failure["code"], self.failure["message"])
        elif self.ready:
            self.set(c.COND_READY, True, "EnvironmentReady", "workspace, Gitea and sources are ready")
        elif self.stopped_at is None:
            self.set(c.COND_READY, False, "Progressing", f"waiting for {self.waiting_for()}")
        out: dict[str, Any] = {
            **{k: v for k, v in self.status.items() if v is not None},
            "conditions": self.conditions,
            "observedGeneration": self.generation,
            "failure": self.failure,  # None clears it (merge patch)
        }
        return out
