"""Snapshots pushed to an environment's Gitea, by the operator: copy-in, promote to a branch, publish.

The workspace commits its tree and writes a bundle (no credential in it); clients/gitpush.py fetches, verifies
and pushes that bundle. Push requests come from the client as the annotation shadow.dev/push-request and are
answered in status.lastPush, so `shadowctl promote --to-branch` and `shadowctl publish` never need the token
either.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import ValidationError

from shadow_operator.api import constants as c
from shadow_operator.api.environment import PushRequest, PushStatus
from shadow_operator.clients import gitpush
from shadow_operator.clients.gitea import Gitea, GiteaError
from shadow_operator.clients.runtime import ExecutionResult, Runtime, RuntimeRefused, RuntimeStalled
from shadow_operator.common.sources import SourcePlan
from shadow_operator.resources import copyin

# Where the workspace writes its bundles (the runtime's state directory, outside the diff baseline).
BUNDLE_DIR = ".sandbox-runtime/push"
SNAPSHOT_TIMEOUT = 900.0
POLL_SECONDS = 2.0  # between looks at a copy-in's snapshot running in the workspace
MAX_BRANCH = 255
_COMMIT = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


class SnapshotFailed(Exception):
    """The workspace could not snapshot the source (its output, trimmed, is the message)."""


@dataclass(frozen=True)
class Target:
    """A Gitea repository to push to: `push_url` for the operator, `clone_url` as status shows it."""

    push_url: str
    clone_url: str
    token: str
    tenant: str  # the environment's namespace, whose share of the push slots the push takes


async def snapshot_and_push(
    runtime: Runtime,
    plan: SourcePlan,
    target: Target | None,
    settings: gitpush.PushSettings,
    *,
    path: str | None = None,
    message: str | None = None,
    branch: str | None = None,
) -> tuple[str, str]:
    """Snapshot a source (or the directory `path`) in the workspace and push it to `target`.

    Without `message`: the copy-in snapshot, pushed with the repository's branches and tags to its current
    branch. With `message`: a new commit on HEAD, pushed alone to `branch`. Returns (commit, branch).
    """
    bundle = f"{BUNDLE_DIR}/{secrets.token_hex(8)}.bundle" if target else None
    result = await runtime.sh(
        copyin.SNAPSHOT,
        env=copyin.snapshot_env(plan, bundle=bundle, path=path, message=message),
        timeout=SNAPSHOT_TIMEOUT,
        tag="shadow-operator: snapshot",
    )
    return await _push(runtime, result, bundle, target, settings, branch=branch, everything=message is None)


async def start_snapshot(runtime: Runtime, plan: SourcePlan, bundle: str | None) -> str:
    """Start a source's copy-in snapshot (with its bundle at `bundle`, None: none) as a background process of
    the workspace's runtime, which runs on whether or not anyone waits: its id (`finish_snapshot`)."""
    return await runtime.start(
        copyin.SNAPSHOT,
        env=copyin.snapshot_env(plan, bundle=bundle),
        timeout=SNAPSHOT_TIMEOUT,
        tag="shadow-operator: snapshot",
    )


async def finish_snapshot(
    runtime: Runtime,
    plan: SourcePlan,
    process: str,
    bundle: str | None,
    target: Target | None,
    settings: gitpush.PushSettings,
) -> tuple[str, str]:
    """Wait for the snapshot `process` (`start_snapshot`) to end and push its bundle to `target`; (commit,
    branch). A process the runtime no longer knows (it restarted), or one that wrote no bundle where one is
    needed now, is followed by a snapshot here (of the same tree: the same commit)."""
    while running := await runtime.running(process):
        await asyncio.sleep(POLL_SECONDS)
    result = await runtime.result(process) if running is not None else None
    if running is not None:
        await runtime.remove(process)
    if result is None or (target is not None and bundle is None):
        return await snapshot_and_push(runtime, plan, target, settings)
    return await _push(runtime, result, bundle, target, settings, branch=None, everything=True)


async def _push(
    runtime: Runtime,
    result: ExecutionResult,
    bundle: str | None,
    target: Target | None,
    settings: gitpush.PushSettings,
    *,
    branch: str | None,
    everything: bool,
) -> tuple[str, str]:
    """Read a snapshot's answer and push its bundle to `target` (None: nowhere); (commit, branch)."""
    fields = copyin.parse_result(result.stdout)
    # The workspace's output is the tenant's: a commit id and a branch name of sane length, or nothing.
    if (
        not result.ok
        or fields is None
        or len(fields) != 2
        or not _COMMIT.match(fields[0])
        or len(fields[1]) > MAX_BRANCH
    ):
        if bundle is not None:
            await runtime.delete(bundle)
        raise SnapshotFailed(copyin.tail(result.output) or f"exit code {result.exit_code}")
    commit, current = fields
    pushed = branch or current
    if target is not None and bundle is not None:
        await gitpush.push_snapshot(
            runtime,
            bundle,
            remote_url=target.push_url,
            token=target.token,
            branch=pushed,
            everything=everything,
            settings=settings,
            tenant=target.tenant,
        )
    return commit, pushed


def pending_request(annotations: dict[str, str], last: PushStatus | None) -> PushRequest | PushStatus | None:
    """The push request to act on: None when there is none or it was answered; a ready answer (with the
    error) when the annotation is not a valid request."""
    raw = annotations.get(c.ANNOTATION_PUSH_REQUEST)
    if not raw:
        return None
    try:
        request = PushRequest.model_validate_json(raw)
    except ValidationError as exc:
        try:
            ident = json.loads(raw)["id"]
        except (ValueError, KeyError, TypeError):
            ident = None
        ident = ident if isinstance(ident, str) else ""
        if last is not None and last.id == ident:
            return None
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'request'}: {e['msg']}" for e in exc.errors()[:3]
        )
        return answer(ident, error=f"invalid {c.ANNOTATION_PUSH_REQUEST} annotation: {problems}")
    if last is not None and last.id == request.id:
        return None
    return request


def answer(
    ident: str,
    *,
    error: str | None = None,
    repo: str | None = None,
    branch: str | None = None,
    commit: str | None = None,
    clone_url: str | None = None,
) -> PushStatus:
    """status.lastPush for a request."""
    finished = datetime.now(UTC).replace(microsecond=0)
    return PushStatus(
        id=ident,
        repo=repo,
        branch=branch,
        commit=commit,
        cloneURL=clone_url,
        error=error,
        finished_at=finished,
    )


async def perform(
    request: PushRequest,
    runtime: Runtime,
    gitea: Gitea,
    plans: list[SourcePlan],
    copied: set[str],
    *,
    push_base: str,
    clone_base: str,
    token: str,
    settings: gitpush.PushSettings,
    tenant: str,
) -> PushStatus:
    """Carry out a push request; its answer for status.lastPush. Raises RuntimeUnavailable when the
    workspace cannot be reached (try again later); a runtime that stalls the transfer fails the request."""
    try:
        if request.source is not None:
            plan = next((p for p in plans if p.name == request.source), None)
            if plan is None or plan.name not in copied:
                return answer(request.id, error=f"source {request.source!r} is not copied in (yet)")
            path, message = None, request.message
        else:
            assert request.repo is not None and request.path is not None
            org, name = request.repo.split("/")
            await gitea.ensure_org(org)
            await gitea.ensure_repo(org, name)
            plan = SourcePlan(name, request.path, org, name, None, None, upload=True)
            path, message = request.path, None
        target = Target(
            f"{push_base}/{plan.full_repo}.git", f"{clone_base}/{plan.full_repo}.git", token, tenant
        )
        commit, branch = await snapshot_and_push(
            runtime, plan, target, settings, path=path, message=message, branch=request.branch
        )
        if request.path is not None:
            await gitea.set_default_branch(plan.org, plan.repo, branch)
    except (SnapshotFailed, gitpush.PushFailed, GiteaError, RuntimeRefused, RuntimeStalled) as exc:
        return answer(request.id, error=copyin.redact(str(exc), [token]))
    return answer(request.id, repo=plan.full_repo, branch=branch, commit=commit, clone_url=target.clone_url)
