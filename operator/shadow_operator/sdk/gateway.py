"""ShadowGateway: drive one ShadowEnvironment from code (seed 000's Python API), sync and async twins.

    with ShadowGateway("my-change", workspace_path="~/src/core") as shadow:
        shadow.start()                      # create, upload the working tree, wait for Ready and the verdict
        print(shadow.exec("pytest -q").stdout)
        print(shadow.diff().patch)
        shadow.promote()                    # changed files back into ~/src/core (never .git)
        shadow.stop()

Both twins run the same operations (`sdk.environment`, `sdk.runtime`, `sdk.promote`); only the driver differs.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypedDict, TypeVar, Unpack

import httpx
from pydantic import ValidationError

from shadow_operator.api.environment import PushRequest, ShadowEnvironment, Verdict
from shadow_operator.common.sources import SourcePlan
from shadow_operator.sdk import confine, hostonly, kube, localdirs, promote, runtime
from shadow_operator.sdk import environment as envops
from shadow_operator.sdk import fork as forkops
from shadow_operator.sdk import manifest as manifestops
from shadow_operator.sdk import race as raceops
from shadow_operator.sdk import sync as syncops
from shadow_operator.sdk.environment import ANNOTATION_LOCAL_PREFIX, EnvironmentSpec, LocalSource
from shadow_operator.sdk.errors import (
    ClusterUnreachable,
    PromoteError,
    RuntimeRefused,
    RuntimeUnreachable,
    ShadowError,
)
from shadow_operator.sdk.kube import Body, Op
from shadow_operator.sdk.manifest import HandoffManifest
from shadow_operator.sdk.promote import PromotePlan
from shadow_operator.sdk.race import RaceResult
from shadow_operator.sdk.runtime import Diff, ExecOptions, ExecutionResult, ImportResult, JournalEntry
from shadow_operator.sdk.upload import check_source, stream_worktree

T = TypeVar("T")

Progress = Callable[[int, int], None]
PUBLISH_DIR = ".sandbox-runtime/publish"
PUSH_TIMEOUT = 900.0  # seconds the operator gets to snapshot and push (a large repository's first push)


def _push_request(error: type[ShadowError], **fields: str) -> PushRequest:
    """A push request with a fresh id; a field the operator would refuse is a one-line error here."""
    try:
        return PushRequest(id=secrets.token_hex(8), **fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise error(f"invalid {where or 'request'}: {first['msg']}") from None


@dataclass(frozen=True)
class HostOnly:
    """An environment that cannot be had, to check on this machine instead: the error (None for a failure
    code the environment names), the reason, and the environment when the cluster still answers for it."""

    exc: ShadowError | None
    reason: str
    env: ShadowEnvironment | None


class StartOptions(TypedDict, total=False):
    """How `start` starts (sync and async alike); all optional."""

    wait: bool  # wait for Ready and a verdict (default True)
    timeout: float  # seconds for each upload and for the wait (default 600)
    progress: Callable[[str, int, int], None] | None  # called with (source, bytes sent, bytes in all)


class ForkOptions(TypedDict, total=False):
    """How `fork` forks (sync and async alike); all optional."""

    count: int | None  # this many forks, named NAME-fork-1..N (when no names are given)
    method: str  # Auto (snapshot where the storage can, else copy), Snapshot or Copy
    verify: bool | None  # run the smoke test again in each fork (default: as the source)
    wait: bool  # wait until each fork is Ready with a verdict (default True)
    timeout: float  # seconds for all that (default 600)


class PromoteOptions(TypedDict, total=False):
    """Where `promote` puts the changes (sync and async alike); all optional."""

    source: str | None  # one source (default: every source that came from a local directory)
    to: str | Path | None  # the local directory (default: the one the source came from)
    paths: Sequence[str]  # only these paths (default: all the changed ones)
    to_branch: str | None  # push a commit to this branch of the source's Gitea repository instead
    message: str  # that commit's message (default "shadow: promoted changes")
    max_bytes: int  # the most promote writes in all (default confine.DEFAULT_MAX_BYTES)


# ------------------------------------------------------------------------------- operations (shared)
class GatewayOps:
    """Every gateway operation, written once; the twins drive them."""

    def __init__(
        self,
        name: str,
        namespace: str,
        workspace_path: str | Path | None,
        cluster: str,
        pool: str | None = None,
    ) -> None:
        self.name = name
        self.namespace = namespace
        self.pool = pool  # the ShadowEnvironmentPool `start()` takes a started workspace and Gitea from
        self.cluster = cluster  # the API server's URL: the key of this machine's record of local directories
        self.workspace_path = Path(workspace_path).expanduser() if workspace_path else None
        # The runtime's endpoint (pod proxy path and token) read once, not twice per call; dropped when the
        # runtime cannot be reached or refuses the token (the workspace was suspended or recreated).
        self._endpoint: runtime.RuntimeEndpoint | None = None

    def sibling(self, name: str) -> GatewayOps:
        """The operations of another environment of the same namespace (a fork of this one)."""
        return GatewayOps(name, self.namespace, self.workspace_path, self.cluster)

    def spec(self, spec: EnvironmentSpec | None) -> EnvironmentSpec:
        if spec is not None:
            return spec
        if self.workspace_path is None:
            raise ShadowError("nothing to copy in", hint="pass workspace_path=... or an EnvironmentSpec")
        return EnvironmentSpec(local=[LocalSource(self.workspace_path)], pool=self.pool)

    def create(self, spec: EnvironmentSpec) -> Op[ShadowEnvironment]:
        self._endpoint = None  # a new environment: a new runtime token
        for source in spec.local:  # every local check before anything is created in the cluster
            check_source(source.path)
        pool = (yield from envops.get_pool_spec(self.namespace, spec.pool)) if spec.pool else None
        env = yield from envops.create(envops.build_environment(self.name, self.namespace, spec, pool))
        self.forget()
        localdirs.record(self.cluster, self.namespace, self.name, {s.source_name: s.path for s in spec.local})
        return env

    def start(
        self,
        spec: EnvironmentSpec | None,
        *,
        wait: bool = True,
        timeout: float = 600.0,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> Op[ShadowEnvironment]:
        """Create the environment, upload its local sources, and wait for Ready and a verdict if asked: start's
        operation for both twins, with its options' defaults (`StartOptions` types them for the caller)."""
        spec = self.spec(spec)
        env = yield from self.create(spec)
        for source in spec.local:
            report = (lambda d, t, s=source.source_name: progress(s, d, t)) if progress else None
            yield from self.upload(source, timeout, report)
        return (yield from self.wait_ready(timeout)) if wait else env

    def upload(self, source: LocalSource, timeout: float, progress: Progress | None) -> Op[ImportResult]:
        # What the upload carries, stamped before it is read: the first `sync` sends what changed since.
        sent = syncops.SyncPlan(source.source_name, source.path, "", stamps=syncops.stamps(source.path))
        result, _ = yield from envops.upload(
            self.namespace, self.name, source.source_name, source.path, timeout, progress
        )
        localdirs.record(self.cluster, self.namespace, self.name, {source.source_name: source.path})
        syncops.record(self.cluster, self.namespace, self.name, sent)
        return result

    def sync(self, source: str | None) -> Op[list[syncops.SyncPlan]]:
        """Push each source's local edits (changed files, deletions) into the workspace."""
        env = yield from envops.get(self.namespace, self.name)
        recorded = self.recorded()
        plans = [envops.source_plan(env, source)] if source else envops.source_plans(env)
        pushed = []
        for plan in plans:
            annotated = env.metadata.annotations.get(ANNOTATION_LOCAL_PREFIX + plan.name)
            local = localdirs.trusted_dir(recorded.get(plan.name), annotated)
            if local is None and len(plans) == 1 and self.workspace_path is not None:
                local = str(self.workspace_path)
            if local is None:
                continue  # a cloned source, or one this machine did not upload
            before = syncops.previous(self.cluster, self.namespace, self.name, plan.name)
            todo = syncops.plan(plan.name, Path(local), plan.path, before)
            if not todo.empty:
                yield from self.on_runtime(functools.partial(syncops.push, sync=todo))
                syncops.record(self.cluster, self.namespace, self.name, todo)
            pushed.append(todo)
        if not pushed:
            raise ShadowError(
                f"no source of {self.name} came from a local directory this machine recorded",
                hint="sync pushes the directories the environment was created or uploaded from, on this machine",
            )
        return pushed

    def forget(self) -> None:
        localdirs.forget(self.cluster, self.namespace, self.name)

    def recorded(self) -> dict[str, str]:
        """source -> the local directory this machine recorded for it (the cluster's annotations are not)."""
        return localdirs.recorded(self.cluster, self.namespace, self.name)

    def wait_ready(
        self, timeout: float, on_change: Callable[[ShadowEnvironment], None] | None = None
    ) -> Op[ShadowEnvironment]:
        return envops.wait(
            self.namespace,
            self.name,
            envops.ready_with_verdict,
            "Ready and a verdict",
            timeout,
            on_change=on_change,
        )

    def endpoint(self) -> Op[runtime.RuntimeEndpoint]:
        if self._endpoint is None:
            env = yield from envops.get(self.namespace, self.name)
            self._endpoint = yield from envops.runtime_endpoint(env)
        return self._endpoint

    def forget_endpoint(self) -> None:
        self._endpoint = None

    def on_runtime(self, make: Callable[[runtime.RuntimeEndpoint], Op[T]]) -> Op[T]:
        """Run a runtime operation on the cached endpoint. When the runtime is gone or refuses the token, the
        endpoint is read again, so a workspace that is not ready says so (SandboxNotReadyError) and the next
        call uses the new one; the operation itself is not repeated (it may have run)."""
        cached = self._endpoint is not None
        ep = yield from self.endpoint()
        try:
            return (yield from make(ep))
        except (RuntimeUnreachable, RuntimeRefused) as exc:
            if not cached or (isinstance(exc, RuntimeRefused) and exc.status != 401):
                raise
            self._endpoint = None
            yield from self.endpoint()
            raise

    def exec(self, command: str | Sequence[str], **kw: Any) -> Op[ExecutionResult]:
        argv = command if isinstance(command, str) else list(command)
        return self.on_runtime(lambda ep: runtime.run_command(ep, argv, **kw))

    def read_file(self, path: str) -> Op[bytes]:
        return self.on_runtime(lambda ep: runtime.read_file(ep, path))

    def write_file(self, path: str, data: bytes | str) -> Op[None]:
        content = data.encode() if isinstance(data, str) else data
        return self.on_runtime(lambda ep: runtime.write_file(ep, path, content))

    def diff(self, paths_only: bool) -> Op[Diff]:
        return self.on_runtime(lambda ep: runtime.diff(ep, paths_only=paths_only))

    def plan_promote(
        self, source: str | None, to: str | Path | None, paths: Sequence[str]
    ) -> Op[list[PromotePlan]]:
        env = yield from envops.get(self.namespace, self.name)
        diff = yield from self.on_runtime(lambda ep: runtime.diff(ep, paths_only=True))
        return [
            promote.plan_promote(diff, plan.name, plan.path, local, paths)
            for plan, local in self._promote_targets(env, source, to)
        ]

    def _promote_targets(
        self, env: ShadowEnvironment, source: str | None, to: str | Path | None
    ) -> list[tuple[SourcePlan, Path]]:
        plans = envops.source_plans(env)
        if source is not None:
            plans = [envops.source_plan(env, source)]
        annotations = env.metadata.annotations
        recorded = self.recorded()
        targets = []
        for plan in plans:
            # The annotation is the cluster's word, which anyone who may patch the object can change: it
            # counts only where it matches this machine's own record (localdirs).
            annotated = annotations.get(ANNOTATION_LOCAL_PREFIX + plan.name)
            local: str | Path | None = to or localdirs.trusted_dir(recorded.get(plan.name), annotated)
            if local is None and len(plans) == 1 and self.workspace_path is not None:
                local = self.workspace_path
            if local is None:
                if annotated is not None:
                    raise PromoteError(
                        f"source {plan.name!r} says it came from {annotated}, which this machine has no "
                        "record of (it records the directories it creates, uploads and forks from)",
                        hint="say where it goes: --to PATH (or to_branch=... to push it to Gitea)",
                    )
                if source is None and len(plans) > 1:
                    continue  # a cloned source has no local directory; promote it with --to-branch
                raise PromoteError(
                    f"source {plan.name!r} has no local directory on record",
                    hint="say where it goes: --to PATH (or to_branch=... to push it to Gitea)",
                )
            targets.append((plan, Path(local).expanduser()))
        if len(targets) > 1 and to is not None:
            raise PromoteError("--to needs --source when the environment has several sources")
        if not targets:
            raise PromoteError(
                "no source of this environment came from a local directory",
                hint="promote one with --source NAME --to PATH, or push it with --to-branch",
            )
        return targets

    def apply_promote(self, plans: Sequence[PromotePlan], max_bytes: int) -> Op[list[PromotePlan]]:
        budget = confine.Budget(max_bytes, option="--max-bytes (max_bytes=)")

        def apply(ep: runtime.RuntimeEndpoint) -> Op[list[PromotePlan]]:
            for plan in plans:
                yield from promote.apply(ep, plan, budget)
            return list(plans)

        return self.on_runtime(apply)

    def push_branch(self, source: str | None, branch: str, message: str) -> Op[dict[str, str]]:
        """Snapshot a source's working tree in the workspace and have the operator push it to a branch of its
        Gitea repository (the Gitea token never leaves the operator)."""
        env = yield from envops.get(self.namespace, self.name)
        statuses = {s.name: s for s in (env.status.sources if env.status else None) or []}
        if source is None:
            if len(statuses) != 1:
                raise PromoteError(
                    f"{self.name} has {len(statuses)} sources", hint="name one with --source NAME"
                )
            source = next(iter(statuses))
        envops.source_plan(env, source)
        if source not in statuses:
            raise ShadowError(f"source {source!r} is not in Gitea yet", hint=f"shadowctl status {self.name}")
        request = _push_request(PromoteError, source=source, branch=branch, message=message)
        done = yield from envops.push(self.namespace, self.name, request, PUSH_TIMEOUT)
        if done.error:
            raise PromoteError(f"pushing {source} to branch {branch} failed: {done.error}")
        return {
            "source": source,
            "repo": done.repo or "",
            "branch": done.branch or branch,
            "commit": done.commit or "",
        }

    def publish(self, path: Path, repo: str | None, progress: Progress | None) -> Op[dict[str, str]]:
        """Push a local repository (uncommitted work included) into the environment's Gitea: the client
        uploads it into the workspace, the operator snapshots and pushes it."""
        env = yield from envops.get(self.namespace, self.name)
        ep = yield from self.endpoint()
        gitea = env.status.gitea_url if env.status else None
        if not gitea:
            raise ShadowError(f"{self.name} has no Gitea", hint="spec.gitea.enabled must be true")
        org, _, name = (repo or f"shadow/{path.name}").rpartition("/")
        full = f"{org or 'shadow'}/{name}"
        tmp = f"{PUBLISH_DIR}/{secrets.token_hex(6)}"
        request = _push_request(ShadowError, path=tmp, repo=full)
        try:
            yield from runtime.import_archive(ep, tmp, stream_worktree(path, progress=progress))
            done = yield from envops.push(self.namespace, self.name, request, PUSH_TIMEOUT)
        finally:
            yield from runtime.delete_path(ep, tmp, recursive=True)
        if done.error:
            raise ShadowError(f"publishing {path} as {full} failed: {done.error}")
        return {
            "repo": full,
            "commit": done.commit or "",
            "branch": done.branch or "",
            "cloneURL": done.clone_url or f"{gitea}/{full}.git",
        }

    def verify(self, timeout: float) -> Op[Verdict]:
        return envops.verify(self.namespace, self.name, timeout)

    def promote(
        self,
        *,
        source: str | None = None,
        to: str | Path | None = None,
        paths: Sequence[str] = (),
        to_branch: str | None = None,
        message: str = "shadow: promoted changes",
        max_bytes: int = confine.DEFAULT_MAX_BYTES,
    ) -> Op[list[PromotePlan] | dict[str, str]]:
        """promote's operation for both twins: its options' defaults, and the refusal of a name that is not
        one of them (`PromoteOptions` types them for the caller)."""
        if to_branch:
            return (yield from self.push_branch(source, to_branch, message))
        plans = yield from self.plan_promote(source, to, paths)
        return (yield from self.apply_promote(plans, max_bytes))

    def verify_or_host(self, timeout: float, fallback: str | None) -> Op[Verdict | HostOnly]:
        """verify's operation for both twins: the new verdict, or (fallback="host-only") what the check on
        this machine needs when the environment cannot be had."""
        host = hostonly.check_fallback(fallback)
        return (yield from self._or_host(self.verify(timeout), host))

    def manifest_or_host(self, fallback: str | None) -> Op[HandoffManifest | HostOnly]:
        """manifest's operation for both twins: the manifest from the cluster, or (fallback="host-only") what
        the check on this machine needs when the environment cannot be had or names a failure code."""
        host = hostonly.check_fallback(fallback)
        found = yield from self._or_host(
            manifestops.manifest(self.namespace, self.name, self.recorded()), host
        )
        if host and isinstance(found, HandoffManifest) and found.failure_reason:
            return (yield from self._host_only(None, found.failure_reason))
        return found

    def _or_host(self, op: Op[T], host: bool) -> Op[T | HostOnly]:
        try:
            return (yield from op)
        except manifestops.UNAVAILABLE as exc:
            if not host:
                raise
            return (yield from self._host_only(exc, exc.code))

    def _host_only(self, exc: ShadowError | None, reason: str) -> Op[HostOnly]:
        # The environment is looked up for its sources unless the cluster itself is out of reach.
        env = None
        if not isinstance(exc, ClusterUnreachable):
            env = yield from manifestops.known_environment(self.namespace, self.name)
        return HostOnly(exc, reason, env)

    def on_host(self, host: HostOnly, spec: EnvironmentSpec | None) -> HandoffManifest:
        """The host-only manifest (`manifest.fallback_for`). It blocks (copies, subprocesses): the async twin
        runs it off the event loop."""
        return manifestops.fallback_for(
            host.exc, host.reason, lambda: host.env, self.recorded(), self.workspace_path, spec, self.name
        )

    def verdict_on_host(self, host: HostOnly, spec: EnvironmentSpec | None) -> Verdict:
        verdict = self.on_host(host, spec).verdict
        assert verdict is not None
        return verdict

    def journal(self, since: int, significant: bool) -> Op[list[JournalEntry]]:
        return self.on_runtime(lambda ep: runtime.journal(ep, since=since, significant=significant))

    def handoff(self) -> Op[str | None]:
        return self.on_runtime(runtime.handoff)

    def decide(self, text: str, author: str | None) -> Op[JournalEntry]:
        return self.on_runtime(lambda ep: runtime.decide(ep, text, author))

    def fork_names(self, names: Sequence[str], count: int | None) -> list[str]:
        return [*names, *(f"{self.name}-fork-{i}" for i in range(1, (count or 0) + 1))] or [
            f"{self.name}-fork-1"
        ]

    def fork_as_asked(
        self,
        names: Sequence[str],
        *,
        count: int | None = None,
        method: str = "Auto",
        verify: bool | None = None,
        wait: bool = True,
        timeout: float = 600.0,
    ) -> Op[list[str]]:
        """fork's operation for both twins: its options' defaults, and the refusal of a name that is not one
        of them (`ForkOptions` types them for the caller). The forks' names."""
        targets = self.fork_names(names, count)
        return (yield from self.fork(targets, wait, timeout, method=method, verify=verify))

    def fork(self, names: Sequence[str], wait: bool, timeout: float, **options: Any) -> Op[list[str]]:
        yield from forkops.fork(self.namespace, self.name, names, **options)
        localdirs.copy(self.cluster, self.namespace, self.name, names)
        deadline = time.monotonic() + timeout
        for name in names if wait else ():
            left = max(1.0, deadline - time.monotonic())
            yield from envops.wait(self.namespace, name, envops.ready_with_verdict, "Ready", left)
        return list(names)


# ------------------------------------------------------------------------------------------- twins
class GatewayHolder(kube.Holder[kube.C]):
    """What both twins are made of: one environment's operations (GatewayOps) on one httpx client."""

    def __init__(
        self,
        name: str,
        workspace_path: str | Path | None = None,
        *,
        namespace: str | None = None,
        pool: str | None = None,
        client: kube.C | None = None,
    ) -> None:
        super().__init__(client)
        # As kubectl: the kubeconfig context's namespace unless one is named.
        namespace = namespace or kube.context_namespace()
        self._ops = GatewayOps(name, namespace, workspace_path, str(self._http.base_url), pool)

    name = property(lambda self: self._ops.name, doc="The environment's name.")
    namespace = property(
        lambda self: self._ops.namespace,
        doc="The environment's namespace (the kubeconfig context's unless one was named).",
    )

    @property
    def client(self) -> kube.C:
        """The httpx client on the API server (for calls the gateway does not wrap)."""
        return self._http

    def _gateways(self, names: Sequence[str]) -> list[Self]:
        """A gateway of this kind per environment (forks of this one), on the same client."""
        return [
            type(self)(n, self._ops.workspace_path, namespace=self.namespace, client=self._http)
            for n in names
        ]


# --------------------------------------------------------------------------------------------- sync
class ShadowGateway(GatewayHolder[httpx.Client], kube.ClientHolder):
    """One ShadowEnvironment, from code. Methods block; see AsyncShadowGateway for the async twin."""

    def _run(self, op: Op[T]) -> T:
        return kube.run(self._http, op)

    # lifecycle
    def start(
        self, spec: EnvironmentSpec | None = None, **options: Unpack[StartOptions]
    ) -> ShadowEnvironment:
        """Create the environment, upload its local sources, and (by default) wait for Ready and a verdict;
        options as `StartOptions`: wait, timeout, progress."""
        return self._run(self._ops.start(spec, **options))

    def create(self, spec: EnvironmentSpec) -> ShadowEnvironment:
        """Only create the object (start() also uploads and waits)."""
        return self._run(self._ops.create(spec))

    def runtime_endpoint(self) -> runtime.RuntimeEndpoint:
        """The workspace runtime through the API server's pod proxy (base path and token header)."""
        return self._run(self._ops.endpoint())

    def stop(self, *, wait: bool = True, timeout: float = 120.0) -> None:
        """Delete the environment (workspace, Gitea, volumes); by default wait until it is gone."""
        self._ops.forget_endpoint()
        self._run(envops.delete(self.namespace, self.name, wait=wait, timeout=timeout))
        self._ops.forget()

    def suspend(self, *, wait: bool = True, timeout: float = 300.0) -> ShadowEnvironment:
        """Stop the workspace and keep it: its Pod goes, its volume (uncommitted work included) and Gitea
        stay (`shadowctl stop`); by default wait until the operator has stopped it."""
        self._ops.forget_endpoint()
        return self._run(envops.set_stopped(self.namespace, self.name, True, timeout, wait))

    def resume(self, *, wait: bool = True, timeout: float = 600.0) -> ShadowEnvironment:
        """Start a stopped (or idle-suspended) workspace again, as it was (`shadowctl start`); by default wait
        until it is Ready."""
        self._ops.forget_endpoint()
        return self._run(envops.set_stopped(self.namespace, self.name, False, timeout, wait))

    def status(self) -> ShadowEnvironment:
        """The ShadowEnvironment as the API server has it now (spec, status, conditions)."""
        return self._run(envops.get(self.namespace, self.name))

    def wait_ready(
        self, timeout: float = 600.0, *, on_change: Callable[[ShadowEnvironment], None] | None = None
    ) -> ShadowEnvironment:
        """Wait (watching) for Ready and a verdict; a failure in status raises EnvironmentFailed."""
        return self._run(self._ops.wait_ready(timeout, on_change))

    def upload(
        self, source: LocalSource, *, timeout: float = 300.0, progress: Progress | None = None
    ) -> ImportResult:
        """Upload one local source's working tree into the workspace and tell the operator to snapshot it."""
        return self._run(self._ops.upload(source, timeout, progress))

    # work in the workspace
    def exec(
        self, command: str | Sequence[str], timeout: float = 300.0, **options: Unpack[ExecOptions]
    ) -> ExecutionResult:
        """Run a command in the workspace (a string under `sh -c`, a list without a shell); `cwd` and `env`
        as `runtime.ExecOptions`."""
        return self._run(self._ops.exec(command, timeout=timeout, **options))

    def exec_stream(
        self, command: str | Sequence[str], timeout: float = 300.0, *, cwd: str = ""
    ) -> Iterator[dict[str, Any]]:
        """Output events as they come: {type: start|stdout|stderr|exit, ...}."""
        ep = self.runtime_endpoint()
        argv = command if isinstance(command, str) else list(command)
        yield from runtime.stream_events(
            self._http, runtime.exec_call(ep, argv, cwd=cwd, timeout=timeout, stream=True)
        )

    def read_file(self, path: str) -> bytes:
        """The bytes of a file of the workspace (a path relative to it)."""
        return self._run(self._ops.read_file(path))

    def write_file(self, path: str, data: bytes | str) -> None:
        """Write a file of the workspace (its directories are made); a str is written as UTF-8."""
        self._run(self._ops.write_file(path, data))

    def diff(self, *, paths_only: bool = False) -> Diff:
        """What changed in the workspace since the copy-in: the paths, and unless `paths_only` the patch."""
        return self._run(self._ops.diff(paths_only))

    def git(self, command: str, cwd: str = ".") -> ExecutionResult:
        """Run `git COMMAND` (a shell command line) in a directory of the workspace."""
        return self.exec(f"git {command}", cwd=cwd)

    # results
    def plan_promote(
        self, *, source: str | None = None, to: str | Path | None = None, paths: Sequence[str] = ()
    ) -> list[PromotePlan]:
        """What promote would write and delete, per source (nothing is changed)."""
        return self._run(self._ops.plan_promote(source, to, paths))

    def promote(self, **options: Unpack[PromoteOptions]) -> list[PromotePlan] | dict[str, str]:
        """Changed files back into the local directory (never .git, never through a link, at most `max_bytes`
        in all), or, with to_branch, a commit pushed to that branch of the source's Gitea repository; options
        as `PromoteOptions`: source, to, paths, to_branch, message, max_bytes."""
        return self._run(self._ops.promote(**options))

    def apply_promote(
        self, plans: Sequence[PromotePlan], *, max_bytes: int = confine.DEFAULT_MAX_BYTES
    ) -> list[PromotePlan]:
        """Carry out plans made by plan_promote (never .git, never through a link, within `max_bytes`)."""
        return self._run(self._ops.apply_promote(plans, max_bytes))

    def publish_module(
        self, module_path: str | Path, repo: str | None = None, *, progress: Progress | None = None
    ) -> dict[str, str]:
        """Push a local repository into the environment's Gitea (created if missing), so the workspace can
        install it from its rewritten URL."""
        return self._run(self._ops.publish(Path(module_path).expanduser().resolve(), repo, progress))

    def sync(self, *, source: str | None = None) -> list[syncops.SyncPlan]:
        """Push local edits into the running workspace: the files changed in each source's local directory
        since the last push from this machine are sent (with the upload's rules), and the ones deleted here
        are deleted there (only inside the source, never in .git). Returns what each source sent."""
        return self._run(self._ops.sync(source))

    def verify(
        self, timeout: float = 600.0, *, fallback: str | None = None, spec: EnvironmentSpec | None = None
    ) -> Verdict:
        """Run the smoke checks again and return the new verdict. With fallback="host-only", an environment
        that cannot be had is verified on the host instead (see `manifest`): the verdict says mode host-only."""
        found = self._run(self._ops.verify_or_host(timeout, fallback))
        return self._ops.verdict_on_host(found, spec) if isinstance(found, HostOnly) else found

    def manifest(
        self, *, fallback: str | None = None, spec: EnvironmentSpec | None = None
    ) -> HandoffManifest:
        """Seed 001's handoff manifest, from the environment's status and diff. With fallback="host-only",
        when the environment cannot be had (no cluster, no operator, a failure code) its verification runs
        on the host in a temporary copy of the local sources (`spec`'s, or workspace_path) and the manifest
        says so: fallback_mode true, failure_reason the code, verdict mode host-only (out of 50)."""
        found = self._run(self._ops.manifest_or_host(fallback))
        return self._ops.on_host(found, spec) if isinstance(found, HostOnly) else found

    def race(self, commands: str | Sequence[str], **options: Any) -> RaceResult:
        """Fork this environment once per candidate (one shared snapshot), run each candidate's command in
        its fork, verify each, and rank them (sdk.race); options as `race.RaceOptions`: count, promote, to,
        to_branch, keep, prefix, method, timeout, command_timeout, verify_timeout, on_update."""
        cmds = [commands] if isinstance(commands, str) else list(commands)
        return raceops.run(self._http, raceops.race(self._ops, cmds, raceops.RaceOptions(**options)))

    def journal(self, since: int = 0, *, significant: bool = False) -> list[JournalEntry]:
        """The workspace's command journal after `since` (only the significant entries if asked)."""
        return self._run(self._ops.journal(since, significant))

    def follow_journal(self, since: int = 0, *, significant: bool = False) -> Iterator[JournalEntry]:
        """Journal entries after `since` as they are recorded (an endless stream; stop iterating to end it)."""
        ep = self.runtime_endpoint()
        call = runtime.journal_follow_call(ep, since=since, significant=significant)
        for entry in runtime.stream_events(self._http, call):
            yield JournalEntry.model_validate(entry)

    def handoff(self) -> str | None:
        """The workspace's HANDOFF.md (None when the runtime keeps none)."""
        return self._run(self._ops.handoff())

    def decide(self, text: str, *, author: str | None = None) -> JournalEntry:
        """Record a decision (what was chosen and why) in the journal, and so in HANDOFF.md's Decision Log:
        the next agent or person reads it there."""
        return self._run(self._ops.decide(text, author))

    # copy-on-write workspaces
    def fork(self, *names: str, **options: Unpack[ForkOptions]) -> list[ShadowGateway]:
        """Fork this environment (names, or `count` forks named NAME-fork-1..N): independent copies of its
        workspace, uncommitted work included. Several at once restore one shared snapshot where the storage
        can snapshot; else each is copied (`status.cloneMethod` says which). Returns a gateway per fork;
        options as `ForkOptions`: count, method, verify, wait, timeout."""
        return self._gateways(self._run(self._ops.fork_as_asked(names, **options)))

    def snapshot(self, name: str | None = None, *, retain: bool = False, timeout: float = 300.0) -> Body:
        """A VolumeSnapshot of the workspace (flushed first), ready to use; start environments from it with
        spec.workspace.from.snapshot. Deleted with this environment unless `retain`."""
        return self._run(forkops.snapshot(self.namespace, self.name, name, retain=retain, timeout=timeout))


# -------------------------------------------------------------------------------------------- async
@kube.documented_as(ShadowGateway)
class AsyncShadowGateway(GatewayHolder[httpx.AsyncClient], kube.AsyncClientHolder):
    """The async twin of ShadowGateway: the same operations, awaited."""

    async def _run(self, op: Op[T]) -> T:
        return await kube.arun(self._http, op)

    async def start(
        self, spec: EnvironmentSpec | None = None, **options: Unpack[StartOptions]
    ) -> ShadowEnvironment:
        return await self._run(self._ops.start(spec, **options))

    async def create(self, spec: EnvironmentSpec) -> ShadowEnvironment:
        return await self._run(self._ops.create(spec))

    async def runtime_endpoint(self) -> runtime.RuntimeEndpoint:
        return await self._run(self._ops.endpoint())

    async def upload(
        self, source: LocalSource, *, timeout: float = 300.0, progress: Progress | None = None
    ) -> ImportResult:
        return await self._run(self._ops.upload(source, timeout, progress))

    async def stop(self, *, wait: bool = True, timeout: float = 120.0) -> None:
        self._ops.forget_endpoint()
        await self._run(envops.delete(self.namespace, self.name, wait=wait, timeout=timeout))
        self._ops.forget()

    async def suspend(self, *, wait: bool = True, timeout: float = 300.0) -> ShadowEnvironment:
        self._ops.forget_endpoint()
        return await self._run(envops.set_stopped(self.namespace, self.name, True, timeout, wait))

    async def resume(self, *, wait: bool = True, timeout: float = 600.0) -> ShadowEnvironment:
        self._ops.forget_endpoint()
        return await self._run(envops.set_stopped(self.namespace, self.name, False, timeout, wait))

    async def status(self) -> ShadowEnvironment:
        return await self._run(envops.get(self.namespace, self.name))

    async def wait_ready(
        self, timeout: float = 600.0, *, on_change: Callable[[ShadowEnvironment], None] | None = None
    ) -> ShadowEnvironment:
        return await self._run(self._ops.wait_ready(timeout, on_change))

    async def exec(
        self, command: str | Sequence[str], timeout: float = 300.0, **options: Unpack[ExecOptions]
    ) -> ExecutionResult:
        return await self._run(self._ops.exec(command, timeout=timeout, **options))

    async def exec_stream(
        self, command: str | Sequence[str], timeout: float = 300.0, *, cwd: str = ""
    ) -> AsyncIterator[dict[str, Any]]:
        ep = await self._run(self._ops.endpoint())
        argv = command if isinstance(command, str) else list(command)
        call = runtime.exec_call(ep, argv, cwd=cwd, timeout=timeout, stream=True)
        async for event in runtime.astream_events(self._http, call):
            yield event

    async def read_file(self, path: str) -> bytes:
        return await self._run(self._ops.read_file(path))

    async def write_file(self, path: str, data: bytes | str) -> None:
        await self._run(self._ops.write_file(path, data))

    async def diff(self, *, paths_only: bool = False) -> Diff:
        return await self._run(self._ops.diff(paths_only))

    async def git(self, command: str, cwd: str = ".") -> ExecutionResult:
        return await self.exec(f"git {command}", cwd=cwd)

    async def plan_promote(
        self, *, source: str | None = None, to: str | Path | None = None, paths: Sequence[str] = ()
    ) -> list[PromotePlan]:
        return await self._run(self._ops.plan_promote(source, to, paths))

    async def promote(self, **options: Unpack[PromoteOptions]) -> list[PromotePlan] | dict[str, str]:
        return await self._run(self._ops.promote(**options))

    async def apply_promote(
        self, plans: Sequence[PromotePlan], *, max_bytes: int = confine.DEFAULT_MAX_BYTES
    ) -> list[PromotePlan]:
        return await self._run(self._ops.apply_promote(plans, max_bytes))

    async def publish_module(
        self, module_path: str | Path, repo: str | None = None, *, progress: Progress | None = None
    ) -> dict[str, str]:
        path = Path(module_path).expanduser().resolve()
        return await self._run(self._ops.publish(path, repo, progress))

    async def sync(self, *, source: str | None = None) -> list[syncops.SyncPlan]:
        # Listing the local files (git ls-files) blocks the loop briefly, as an upload's listing does.
        return await self._run(self._ops.sync(source))

    async def verify(
        self, timeout: float = 600.0, *, fallback: str | None = None, spec: EnvironmentSpec | None = None
    ) -> Verdict:
        found = await self._run(self._ops.verify_or_host(timeout, fallback))
        if isinstance(found, HostOnly):  # the host-side checks block (copies, subprocesses): off the loop
            return await asyncio.to_thread(self._ops.verdict_on_host, found, spec)
        return found

    async def manifest(
        self, *, fallback: str | None = None, spec: EnvironmentSpec | None = None
    ) -> HandoffManifest:
        found = await self._run(self._ops.manifest_or_host(fallback))
        if isinstance(found, HostOnly):
            return await asyncio.to_thread(self._ops.on_host, found, spec)
        return found

    async def race(self, commands: str | Sequence[str], **options: Any) -> RaceResult:
        cmds = [commands] if isinstance(commands, str) else list(commands)
        return await raceops.arun(self._http, raceops.race(self._ops, cmds, raceops.RaceOptions(**options)))

    async def journal(self, since: int = 0, *, significant: bool = False) -> list[JournalEntry]:
        return await self._run(self._ops.journal(since, significant))

    async def follow_journal(
        self, since: int = 0, *, significant: bool = False
    ) -> AsyncIterator[JournalEntry]:
        ep = await self.runtime_endpoint()
        call = runtime.journal_follow_call(ep, since=since, significant=significant)
        async for entry in runtime.astream_events(self._http, call):
            yield JournalEntry.model_validate(entry)

    async def handoff(self) -> str | None:
        return await self._run(self._ops.handoff())

    async def decide(self, text: str, *, author: str | None = None) -> JournalEntry:
        return await self._run(self._ops.decide(text, author))

    async def fork(self, *names: str, **options: Unpack[ForkOptions]) -> list[AsyncShadowGateway]:
        return self._gateways(await self._run(self._ops.fork_as_asked(names, **options)))

    async def snapshot(
        self, name: str | None = None, *, retain: bool = False, timeout: float = 300.0
    ) -> Body:
        op = forkops.snapshot(self.namespace, self.name, name, retain=retain, timeout=timeout)
        body: Body = await self._run(op)
        return body
