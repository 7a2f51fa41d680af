"""ShadowEnvironment operations (sans-I/O, see `kube.run`): create, read, wait, delete, upload, verify.

`ShadowGateway` and `AsyncShadowGateway` (gateway.py) and shadowctl are made of these.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.environment import (
    PushRequest,
    PushStatus,
    ShadowEnvironment,
    ShadowEnvironmentStatus,
    Verdict,
)
from shadow_operator.api.kinds import SHADOW_ENVIRONMENT, SHADOW_ENVIRONMENT_POOL
from shadow_operator.api.pool import pool_fields
from shadow_operator.common import egress
from shadow_operator.common.sources import SourcePlan, plan_sources
from shadow_operator.sdk import discovery, kube, localdirs, runtime
from shadow_operator.sdk.errors import (
    EnvironmentFailed,
    EnvironmentNotFound,
    NotAnUploadSource,
    NotFound,
    OperatorNotRunning,
    SandboxNotReadyError,
    ShadowError,
    SourceNotFound,
    WaitTimeout,
)
from shadow_operator.sdk.kube import Body, Call, Op
from shadow_operator.sdk.runtime import ImportResult, RuntimeEndpoint
from shadow_operator.sdk.upload import UploadResult, stream_worktree

T = TypeVar("T")

# Where shadowctl records the local directory a source was uploaded from, so `promote` knows where to go.
ANNOTATION_LOCAL_PREFIX = f"local.{c.OPERATOR_PREFIX}/"
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class LocalSource:
    """A local directory to upload (uncommitted and untracked-but-not-ignored files included)."""

    path: Path
    repo: str = ""  # org/name in the environment's Gitea; default shadow/<directory name>
    name: str = ""  # source name; default from the directory name

    @property
    def source_name(self) -> str:
        """The source's name in the environment (a DNS label)."""
        return self.name or source_name(self.path.name)

    @property
    def repo_name(self) -> str:
        """Its Gitea repository, org/name."""
        return self.repo or f"shadow/{self.path.name}"


@dataclass(frozen=True)
class GitSource:
    url: str
    ref: str | None = None
    repo: str = ""
    name: str = ""

    @property
    def source_name(self) -> str:
        """The source's name in the environment (a DNS label)."""
        base = self.url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") or "src"
        return self.name or source_name(base)

    @property
    def repo_name(self) -> str:
        """Its Gitea repository, org/name."""
        return self.repo or f"shadow/{self.url.rstrip('/').rsplit('/', 1)[-1].removesuffix('.git')}"


@dataclass(frozen=True)
class EnvironmentSpec:
    """What `start()` / `shadowctl create` asks for; everything else keeps the API's defaults."""

    local: Sequence[LocalSource] = ()
    git: Sequence[GitSource] = ()
    rewrites: dict[str, str] = field(default_factory=dict)  # URL prefix -> Gitea organization
    template: str | None = None
    runtime_class: str | None = (
        None  # RuntimeClass of the workspace Pod, e.g. "gvisor"; default: the template's
    )
    mount_path: str | None = None
    storage_class: str | None = None  # of the workspace volume; forks by snapshot need one that supports it
    verify_commands: Sequence[str] = ()
    # Egress rules narrowing the template's spec.egress ([METHOD,...] HOST[:PORT][/PATH] each); None: the
    # template's as they are.
    allow: Sequence[str] | None = None
    # Resource requests and limits of the workspace, e.g. {"cpu": "500m"}: laid over the template's, so a
    # request given alone keeps the template's limits.
    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)
    # A ShadowEnvironmentPool to take a started workspace and Gitea from: the environment starts from the
    # pool's values (template, workspace, rewrites, ...), and the fields set here override them.
    pool: str | None = None


def source_name(text: str) -> str:
    """A source name (a DNS label) from a directory or repository name."""
    cleaned = "".join(ch if ch.isalnum() else "-" for ch in text.lower())
    return "-".join(p for p in cleaned.split("-") if p)[:63] or "src"


def build_environment(
    name: str, namespace: str, spec: EnvironmentSpec, pool_spec: Body | None = None
) -> Body:
    """The ShadowEnvironment manifest; local directories are recorded in annotations for `promote`.

    With `pool_spec` (the spec of the pool `spec.pool` names), the pool's values come first, so that the
    environment can take one of its instances; what `spec` sets explicitly overrides them."""
    sources: list[Body] = [{"name": s.source_name, "repo": s.repo_name, "upload": {}} for s in spec.local] + [
        {
            "name": s.source_name,
            "repo": s.repo_name,
            "git": {"url": s.url, **({"ref": s.ref} if s.ref else {})},
        }
        for s in spec.git
    ]
    names = [s["name"] for s in sources]
    if not sources:
        raise ShadowError("nothing to copy in", hint="give a local directory or a git URL")
    if len(set(names)) != len(names):
        raise ShadowError(
            f"two sources would have the same name ({', '.join(sorted(names))})",
            hint="name them apart (LocalSource(name=...)), or rename a directory",
        )
    body_spec: Body = {**pool_fields(dict(pool_spec or {})), "sources": sources}
    if spec.pool:
        body_spec["pool"] = spec.pool
    if spec.rewrites:
        body_spec["gitRewrites"] = [{"from": k, "to": v} for k, v in spec.rewrites.items()]
    if spec.template:
        body_spec["template"] = spec.template
    if spec.runtime_class:
        body_spec["runtimeClassName"] = spec.runtime_class
    workspace = {
        **body_spec.get("workspace", {}),
        **{k: v for k, v in (("mountPath", spec.mount_path), ("storageClassName", spec.storage_class)) if v},
    }
    if workspace:
        body_spec["workspace"] = workspace
    resources = {k: dict(v) for k, v in (("requests", spec.requests), ("limits", spec.limits)) if v}
    if resources:
        body_spec["resources"] = resources
    if spec.verify_commands:
        body_spec["verify"] = {
            "commands": [
                {"name": f"check-{i}", "command": cmd} for i, cmd in enumerate(spec.verify_commands, 1)
            ]
        }
    if spec.allow is not None:
        try:
            body_spec["egress"] = {"rules": [egress.parse_allow(item) for item in spec.allow]}
        except ValueError as error:
            raise ShadowError(
                str(error), hint="see `kubectl explain shadowenvironment.spec.egress`"
            ) from None
    annotations = {ANNOTATION_LOCAL_PREFIX + s.source_name: str(s.path.resolve()) for s in spec.local}
    return {
        "apiVersion": SHADOW_ENVIRONMENT.api_version,
        "kind": SHADOW_ENVIRONMENT.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            **({"annotations": annotations} if annotations else {}),
        },
        "spec": body_spec,
    }


# ------------------------------------------------------------------------------------------- reading
def _what(namespace: str, name: str) -> str:
    return f"ShadowEnvironment {namespace}/{name}"


def get(namespace: str, name: str) -> Op[ShadowEnvironment]:
    try:
        body = yield from kube.get(SHADOW_ENVIRONMENT.path(namespace, name), _what(namespace, name))
    except NotFound:
        raise EnvironmentNotFound(f"{_what(namespace, name)} does not exist") from None
    return ShadowEnvironment.from_body(body)


def list_(namespace: str | None) -> Op[list[ShadowEnvironment]]:
    """The environments of `namespace`, or of every namespace (None)."""
    where = f"in {namespace}" if namespace else "in all namespaces"
    body = yield from kube.get(SHADOW_ENVIRONMENT.path(namespace), f"list ShadowEnvironments {where}")
    return [ShadowEnvironment.from_body({**item, "kind": SHADOW_ENVIRONMENT.kind}) for item in body["items"]]


def get_pool_spec(namespace: str, name: str) -> Op[Body]:
    """The spec of a ShadowEnvironmentPool (what an environment taking its instances must match)."""
    what = f"ShadowEnvironmentPool {namespace}/{name}"
    try:
        body = yield from kube.get(SHADOW_ENVIRONMENT_POOL.path(namespace, name), what)
    except NotFound:
        raise ShadowError(
            f"{what} does not exist",
            hint=f"list the pools: kubectl get shadowenvironmentpools -n {namespace}",
        ) from None
    spec: Body = body.get("spec") or {}
    return spec


def create(body: Body) -> Op[ShadowEnvironment]:
    meta = body["metadata"]
    created = yield from kube.send(
        Call(
            "POST",
            SHADOW_ENVIRONMENT.path(meta["namespace"]),
            f"create {_what(meta['namespace'], meta['name'])}",
            body=body,
        )
    )
    return ShadowEnvironment.from_body(created)


def delete(namespace: str, name: str, *, wait: bool = False, timeout: float = 120.0) -> Op[None]:
    """Delete an environment (its workspace, Gitea, Secrets and volumes go with it, by owner references)."""
    what = _what(namespace, name)
    try:
        yield Call(
            "DELETE",
            SHADOW_ENVIRONMENT.path(namespace, name),
            f"delete {what}",
            body={"propagationPolicy": "Foreground"},
        )
    except NotFound:
        raise EnvironmentNotFound(f"{what} does not exist") from None
    if wait:
        try:
            current = yield from kube.get(SHADOW_ENVIRONMENT.path(namespace, name), what)
        except NotFound:
            return

        try:
            yield from kube.wait_for(
                SHADOW_ENVIRONMENT.path(namespace),
                name,
                what,
                current,
                lambda _: None,
                time.monotonic() + timeout,
                time.monotonic,
                lambda _: WaitTimeout(f"{what} is still being deleted after {timeout:g}s"),
                lambda: StopWaiting(what),
            )
        except StopWaiting:
            return


class StopWaiting(ShadowError):
    """The object a wait follows went away, which is what a deletion waits for."""


def conditions(env: ShadowEnvironment) -> dict[str, Any]:
    return {x.type: x for x in (env.status.conditions if env.status else None) or []}


def is_true(env: ShadowEnvironment, type_: str) -> bool:
    cond = conditions(env).get(type_)
    return cond is not None and cond.status == "True"


# --------------------------------------------------------------------------------------------- waits
class _NoStatusYet(ShadowError):
    pass


STATUS_GRACE = 15.0  # seconds an operator gets to write a first status before its Lease is looked at


def wait(
    namespace: str,
    name: str,
    until: Callable[[ShadowEnvironment], bool],
    waiting_for: str,
    timeout: float,
    *,
    on_change: Callable[[ShadowEnvironment], None] | None = None,
    status_grace: float = STATUS_GRACE,
) -> Op[ShadowEnvironment]:
    """Follow the environment (watching) until `until(env)`; its status failure raises EnvironmentFailed.

    An environment that gets no status at all within `status_grace` seconds while no operator holds a fresh
    leader Lease raises OperatorNotRunning instead of waiting out the whole timeout.
    """
    what = _what(namespace, name)
    collection = SHADOW_ENVIRONMENT.path(namespace)
    deadline = time.monotonic() + timeout
    current = yield from kube.get(SHADOW_ENVIRONMENT.path(namespace, name), what)

    def deleted() -> ShadowError:
        return EnvironmentNotFound(f"{what} was deleted while waiting")

    if not current.get("status"):
        try:
            current = yield from kube.wait_for(
                collection,
                name,
                what,
                current,
                lambda body: body if body.get("status") else None,
                min(deadline, time.monotonic() + status_grace),
                time.monotonic,
                lambda body: _NoStatusYet(what),
                deleted,
            )
        except _NoStatusYet:
            state = yield from discovery.operator_state(namespace)
            if state.alive is False:
                where = state.location
                raise OperatorNotRunning(
                    f"{what} has no status after {status_grace:g}s and the operator is {state.detail}",
                    hint=f"start the operator (kubectl -n {where.namespace} get deploy/{where.deployment}), "
                    "then `shadowctl doctor`",
                ) from None
            current = yield from kube.get(SHADOW_ENVIRONMENT.path(namespace, name), what)

    def check(body: Body) -> ShadowEnvironment | None:
        env = ShadowEnvironment.from_body(body)
        if on_change is not None:
            on_change(env)
        failure = env.status.failure if env.status else None
        if failure is not None:
            raise EnvironmentFailed(
                f"{what}: {failure.code}: {failure.message}",
                code=failure.code,
                hint=f"kubectl -n {namespace} describe shadowenvironment {name}",
            )
        return env if until(env) else None

    def timed_out(body: Body) -> ShadowError:
        env = ShadowEnvironment.from_body(body)
        ready = conditions(env).get(c.COND_READY)
        now = (
            f"Ready is {ready.status} ({ready.reason}): {ready.message}" if ready else "it has no status yet"
        )
        return WaitTimeout(
            f"timed out after {timeout:g}s waiting for {waiting_for} of {what}; {now}",
            hint=f"shadowctl status {name} -n {namespace}",
        )

    return (
        yield from kube.wait_for(
            collection, name, what, current, check, deadline, time.monotonic, timed_out, deleted
        )
    )


def phase_seconds(env: ShadowEnvironment) -> dict[str, float]:
    """Seconds from the environment's creation to the end of each phase that finished (status.timings), in
    the order they finished: scheduled, workspaceReady, giteaReady, uploaded, copiedIn, ready, verified..."""
    timings = env.status.timings if env.status else None
    created = env.metadata.creation_timestamp
    if timings is None or created is None:
        return {}
    finished = timings.model_dump(by_alias=True, exclude_none=True).items()
    seconds = {phase: round((at - created).total_seconds(), 3) for phase, at in finished}
    return dict(sorted(seconds.items(), key=lambda item: item[1]))


def ready_with_verdict(env: ShadowEnvironment) -> bool:
    verify_enabled = env.spec.verify is None or env.spec.verify.enabled
    has_verdict = env.status is not None and env.status.verdict is not None
    return is_true(env, c.COND_READY) and (has_verdict or not verify_enabled)


# -------------------------------------------------------------------------------------------- runtime
def runtime_endpoint(env: ShadowEnvironment) -> Op[RuntimeEndpoint]:
    """The workspace's runtime through the API server's pod proxy (no port-forward, no Ingress)."""
    if not is_true(env, c.COND_WORKSPACE_READY):
        cond = conditions(env).get(c.COND_WORKSPACE_READY)
        why = f" ({cond.reason}: {cond.message})" if cond else ""
        raise runtime_not_ready(env, why)
    status = env.status or ShadowEnvironmentStatus()
    pod = status.sandbox or env.name
    port = (urlsplit(status.runtime_url).port if status.runtime_url else None) or c.RUNTIME_DEFAULT_PORT
    secret = status.runtime_token_secret or naming.token_secret_name(env.name)
    token = yield from runtime.read_token(env.namespace, secret)
    return runtime.endpoint(env.namespace, pod, port, token)


def runtime_not_ready(env: ShadowEnvironment, why: str = "") -> ShadowError:
    return SandboxNotReadyError(
        f"{_what(env.namespace, env.name)}: the workspace is not ready{why}",
        hint=f"wait for it: shadowctl status {env.name} -n {env.namespace}",
    )


def source_plans(env: ShadowEnvironment) -> list[SourcePlan]:
    """The environment's sources; a fork without spec.sources has those its clone brought."""
    clone = env.status.clone if env.status else None
    inherited = [s.model_dump() for s in clone.sources or ()] if clone else None
    return plan_sources(env.body, inherited)


def source_plan(env: ShadowEnvironment, source: str) -> SourcePlan:
    plans = {p.name: p for p in source_plans(env)}
    plan = plans.get(source)
    if plan is None:
        raise SourceNotFound(
            f"{_what(env.namespace, env.name)} has no source {source!r} (its sources: {', '.join(plans)})"
        )
    return plan


def upload(
    namespace: str,
    name: str,
    source: str,
    path: str | PathLike[str],
    timeout: float,
    progress: Progress | None = None,
) -> Op[tuple[ImportResult, str]]:
    """Wait for the workspace, stream the working tree at `path` (what `git add --all` would snapshot, and
    `.git`) into the source's directory, then set the annotation `uploads.shadow.dev/<source>` (the archive's
    sha256) that tells the operator to snapshot the directory. Returns the runtime's answer and the sha256."""
    env = yield from get(namespace, name)
    plan = source_plan(env, source)
    if not plan.upload:
        raise NotAnUploadSource(
            f"source {source!r} of {_what(namespace, name)} is cloned from {plan.git_url}; only `upload: {{}}` "
            "sources are uploaded"
        )
    env = yield from wait(
        namespace,
        name,
        lambda e: is_true(e, c.COND_WORKSPACE_READY),
        "condition WorkspaceReady=True",
        timeout,
    )
    ep = yield from runtime_endpoint(env)
    digest = hashlib.sha256()

    def chunks() -> Iterator[bytes]:
        for piece in stream_worktree(path, progress=progress):
            digest.update(piece)
            yield piece

    result = yield from runtime.import_archive(ep, plan.path, chunks())
    patch = {"metadata": {"annotations": {c.ANNOTATION_UPLOAD_PREFIX + plan.name: digest.hexdigest()}}}
    yield Call(
        "PATCH",
        SHADOW_ENVIRONMENT.path(namespace, name),
        f"mark source {source} uploaded",
        body=patch,
        content_type=kube.MERGE_PATCH,
    )
    return result, digest.hexdigest()


def set_stopped(
    namespace: str, name: str, stop: bool, timeout: float, wait_for_it: bool
) -> Op[ShadowEnvironment]:
    """Stop the workspace (spec.suspend: its Pod goes, its volume and Gitea stay) or start it again as it
    was; a start also resumes a workspace suspended for idleness. By default waits until the operator has
    acted: WorkspaceReady False (Stopped), or Ready again."""
    patch: Body = {"spec": {"suspend": stop}}
    if not stop:
        patch["metadata"] = {"annotations": {c.ANNOTATION_RESUME_REQUEST: secrets.token_hex(8)}}
    verb = "stop" if stop else "start"
    body = yield from _patch(namespace, name, patch, f"{verb} {_what(namespace, name)}")
    if not wait_for_it:
        return ShadowEnvironment.from_body(kube.decoded(body, verb))

    def stopped(env: ShadowEnvironment) -> bool:
        cond = conditions(env).get(c.COND_WORKSPACE_READY)
        return cond is not None and cond.status == "False" and cond.reason == "Stopped"

    if stop:
        return (yield from wait(namespace, name, stopped, "the workspace stopped", timeout))
    return (
        yield from wait(namespace, name, lambda e: is_true(e, c.COND_READY), "condition Ready=True", timeout)
    )


def request(
    namespace: str,
    name: str,
    annotation: str,
    value: str,
    what: str,
    answer: Callable[[ShadowEnvironmentStatus], T | None],
    waiting_for: str,
    timeout: float,
) -> Op[T]:
    """Ask the operator for something by setting one annotation to a new value, then wait (watching) for
    the status that answers it: `answer(status)`, None until it is there."""
    patch = {"metadata": {"annotations": {annotation: value}}}
    yield from _patch(namespace, name, patch, f"{what} of {_what(namespace, name)}")

    def answered(env: ShadowEnvironment) -> T | None:
        return answer(env.status) if env.status is not None else None

    env = yield from wait(namespace, name, lambda env: answered(env) is not None, waiting_for, timeout)
    found = answered(env)
    assert found is not None  # wait() returned because it is there
    return found


def _patch(namespace: str, name: str, patch: Body, what: str) -> Op[Any]:
    """A merge patch of the environment; its answer."""
    try:
        return (
            yield Call(
                "PATCH",
                SHADOW_ENVIRONMENT.path(namespace, name),
                what,
                body=patch,
                content_type=kube.MERGE_PATCH,
            )
        )
    except NotFound:
        raise EnvironmentNotFound(f"{_what(namespace, name)} does not exist") from None


def verify(namespace: str, name: str, timeout: float) -> Op[Verdict]:
    """Run the smoke checks again (a new `shadow.dev/verify-requested` value) and wait for their verdict."""
    trigger = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def answer(status: ShadowEnvironmentStatus) -> Verdict | None:
        verdict = status.verdict
        return verdict if verdict is not None and verdict.trigger == trigger else None

    return (
        yield from request(
            namespace,
            name,
            c.ANNOTATION_VERIFY_REQUEST,
            trigger,
            "request verification",
            answer,
            "a new verdict",
            timeout,
        )
    )


def push(namespace: str, name: str, push_request: PushRequest, timeout: float) -> Op[PushStatus]:
    """Ask the operator to push into the environment's Gitea (the annotation shadow.dev/push-request) and
    wait for its answer in status.lastPush. The operator pushes, so the client never needs Gitea's token (and
    never reaches Gitea, which only its workspace and the operator can)."""
    body = push_request.model_dump_json(by_alias=True, exclude_none=True)

    def answer(status: ShadowEnvironmentStatus) -> PushStatus | None:
        last = status.last_push
        return last if last is not None and last.id == push_request.id else None

    return (
        yield from request(
            namespace,
            name,
            c.ANNOTATION_PUSH_REQUEST,
            body,
            "request a push into the Gitea",
            answer,
            "the operator's push",
            timeout,
        )
    )


def upload_source(
    environment: str,
    source: str,
    path: str | PathLike[str],
    *,
    namespace: str | None = None,
    timeout: float = 300.0,
    progress: Progress | None = None,
) -> UploadResult:
    """Upload the working tree at `path` as source `source` of a ShadowEnvironment, and tell the operator.

    Waits (watching, up to `timeout` seconds) for the workspace to be Ready, streams the tree through the API
    server's pod proxy into the source's directory, then sets `uploads.shadow.dev/<source>` to the archive's
    sha256: the operator snapshots the directory once that annotation is there. Uploading again overwrites
    files but removes none, and the operator snapshots a source only once.
    """
    namespace = namespace or kube.context_namespace()  # as kubectl: the context's unless one is named
    with kube.connect() as http:
        result, digest = kube.run(http, upload(namespace, environment, source, path, timeout, progress))
        localdirs.record(str(http.base_url), namespace, environment, {source: path})
    return UploadResult(path=result.path, files=result.files, bytes=result.bytes, sha256=digest)
