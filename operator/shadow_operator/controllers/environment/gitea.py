"""The Gitea step: its Secret (credentials generated once), Service, NetworkPolicies and StatefulSet, then the
bootstrap once its Pod is Ready: the operator's API token, one organization per owner, one repository per
source.

Gitea's data is on an emptyDir unless spec.gitea.persistence.enabled, so a new Gitea Pod may start empty: the
bootstrap runs again for every new Pod (status.giteaPodUID), and a copied-in source whose snapshot branch
Gitea no longer has is dropped from status.sources, for the copy-in step to push it again.

The bootstrap is an operation (engine/operations.py), recorded in status.giteaOperation: each environment's
Gitea runs in its tenant's namespace, where the tenant can reach it and may slow it to a trickle, so no worker
awaits it. It has a deadline in total (the chart's gitea.setupTimeoutSeconds) and no slot; past the deadline,
or when a call gets no answer in time, the environment fails with GiteaStalled and it is tried again. An
operator that takes over (a restart, a leader change) carries it on under the same id: its steps leave alone
what exists."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from shadow_operator.api import constants as c
from shadow_operator.api.environment import OperationRun
from shadow_operator.api.kinds import POD, SECRET, STATEFUL_SET
from shadow_operator.api.models import ObjectMeta
from shadow_operator.clients.gitea import GiteaError, GiteaTimedOut
from shadow_operator.common.sources import SourcePlan
from shadow_operator.controllers.environment.state import (
    RETRY_SECONDS,
    Pass,
    Ports,
    StepFailed,
    plans,
    secret_data,
)
from shadow_operator.engine import Outcome, Running
from shadow_operator.engine.cache import Body, Key
from shadow_operator.resources import copyin, gitea_policy
from shadow_operator.resources import environment as res
from shadow_operator.resources.metadata import controller_uid

GITEA_SETUP: Final = "GiteaSetup"
BOOTSTRAP_ATTEMPTS = 20  # consecutive failures of a ready Gitea before GiteaBootstrapFailed
STICKY = ("GiteaStalled", "GiteaBootstrapFailed")  # failures that stand while the setup is tried again


@dataclass(frozen=True)
class Setup:
    """What a setup of Gitea did, for the pass that reads it: for which generation and Gitea Pod, the token,
    what it created, and the copied-in sources whose snapshot branch Gitea lost."""

    generation: int | None
    pod_uid: str | None
    token: str
    created: list[str]
    lost: list[str]


class GiteaStep:
    """Keeps, per environment, how often the bootstrap of a running Gitea failed in a row, and how the last
    failed (and until when the next setup waits: config.gitea_setup_retry)."""

    def __init__(self, deps: Ports) -> None:
        self.deps = deps
        self._failures: dict[Key, int] = {}
        self._paused: dict[Key, tuple[float, StepFailed]] = {}

    def forget(self, key: Key) -> None:
        self._failures.pop(key, None)
        self._paused.pop(key, None)

    async def children(self, state: Pass) -> tuple[Body, dict[str, str]]:
        """Apply Gitea's objects (named after the environment's instance); returns its StatefulSet and the
        admin credentials."""
        env, named, deps = state.env, state.named, self.deps
        creds = await self._ensure_secret(state)
        current = deps.cache.store(STATEFUL_SET).get(env.namespace, res.gitea_name(state.instance))
        sts: Body = {}
        for kind, manifest in gitea_policy.build_gitea_children(named, deps.config.gitea, current):
            sts = await deps.apply(kind, manifest, env)
        return sts, creds

    async def _ensure_secret(self, state: Pass) -> dict[str, str]:
        """The admin credentials, generated once; the API token is added by the bootstrap."""
        env = state.env
        name = res.gitea_secret_name(state.instance)
        secret = self.deps.cache.store(SECRET).get(env.namespace, name)
        if secret is None:
            manifest = res.build_gitea_secret(state.named, c.GITEA_ADMIN_USERNAME, secrets.token_urlsafe(24))
            secret = await self.deps.apply(SECRET, manifest, env)
        return secret_data(secret)

    async def ready(self, state: Pass, sts: Body, creds: dict[str, str]) -> bool:
        """Whether Gitea is up and set up for this generation and Pod. Once its Pod is Ready the setup is started
        as an operation; while it is under way this raises StepFailed without a code (GiteaSettingUp), and the
        pass its end wakes reads how it ended."""
        env = state.env
        key = (env.namespace, env.name)
        pod = self.deps.cache.store(POD).get(env.namespace, f"{sts['metadata']['name']}-0")
        if pod is not None and controller_uid(pod) != ObjectMeta.model_validate(sts["metadata"]).uid:
            pod = None  # not the StatefulSet's: nothing to learn from it
        if not res.gitea_ready(sts):
            failure = res.pod_failure(pod, "Gitea Pod", datetime.now(UTC))
            if failure:
                raise StepFailed(failure[0], failure[0], failure[1])
            state.set(c.COND_GITEA_READY, False, "GiteaStarting", "waiting for the Gitea Pod")
            return False
        # The Pod whose data the bootstrap saw (None while the cache has not seen it: nothing to compare).
        pod_uid = (ObjectMeta.model_validate(pod["metadata"]).uid or None) if pod is not None else None
        done = state.conditions.find(c.COND_GITEA_READY)
        if (
            done
            and done.status == "True"
            and done.observed_generation == env.metadata.generation
            and creds.get(c.GITEA_SECRET_TOKEN)
            and (pod_uid is None or pod_uid == state.status.gitea_pod_uid)
        ):
            return True
        run = state.status.gitea_operation
        if run is not None:
            seen = self.deps.operations.look(key, GITEA_SETUP, run.id)
            if isinstance(seen, Running):
                raise self._setting_up(state)
            if isinstance(seen, Outcome):
                state.status.gitea_operation = None  # set explicitly: the status patch clears it
                try:
                    setup = self._outcome(state, seen, creds)
                except StepFailed as failed:
                    self._paused[key] = (time.monotonic() + self.deps.config.gitea_setup_retry, failed)
                    raise
                if setup.generation == env.metadata.generation and setup.pod_uid == pod_uid:
                    self._conclude(state, setup, creds)
                    return True
                run = None  # it set up a spec or a Pod since replaced: again, for these
            # None: an operator before this one started it; carried on under its id (each step is idempotent).
        if run is None and key in self._paused:
            until, last = self._paused[key]
            if (left := until - time.monotonic()) > 0:  # the last setup failed: the same failure until then
                raise StepFailed(last.code, last.reason, last.message, retry=left)
            del self._paused[key]
        self._start(state, creds, pod_uid, taken_over=run)
        raise self._setting_up(state)

    def _setting_up(self, state: Pass) -> StepFailed:
        """The setup is under way (its end wakes the pass): not a failure, and the workspace side goes on; but
        a setup that failed stays failed while it is tried again (a code that comes and goes helps no one).
        Nothing here asks to be polled: the setup's end (or its deadline) wakes the pass. At a thousand
        environments, polls every few seconds of those waiting for their setup kept every namespace's queue
        full, and the work queue's round robin gave a busy namespace one pass in twenty for its new
        environments (BENCHMARKS.md, "Many tenants"); a workspace that is starting is polled by the
        reconciler."""
        message = "setting up Gitea: the operator's token, organizations and repositories"
        state.set(c.COND_GITEA_READY, False, "GiteaSettingUp", message)
        failed = state.old.failure
        if failed is not None and failed.code in STICKY:
            return StepFailed(failed.code, failed.code, failed.message)
        return StepFailed(None, "GiteaSettingUp", message, retry=None)

    def _start(
        self, state: Pass, creds: dict[str, str], pod_uid: str | None, *, taken_over: OperationRun | None
    ) -> None:
        """Run the setup as an operation (engine/operations.py), recorded in status.giteaOperation. It takes no
        slot: it is a few small calls to this environment's own Gitea, bounded in total by its deadline, so a
        Gitea that stalls (its tenant can reach it) holds no worker or slot that anyone else needs."""
        env, deps = state.env, self.deps
        generation = env.metadata.generation
        copied = {s.name: s.branch for s in state.status.sources or ()}
        planned = plans(state)
        given = dict(creds)

        async def work() -> Setup:
            created, lost, token = await self._bootstrap(state, given, planned, copied)
            return Setup(generation, pod_uid, token, created, lost)

        timeout = deps.config.gitea_setup_timeout
        now = state.now()
        state.status.gitea_operation = OperationRun(
            kind=GITEA_SETUP,
            id=deps.operations.start(
                (env.namespace, env.name),
                GITEA_SETUP,
                work,
                timeout=timeout,
                operation_id=taken_over.id if taken_over is not None else None,
                slot=False,
            ),
            # One taken over keeps its id and when it started; its deadline is this operator's.
            started_at=taken_over.started_at if taken_over is not None else now.replace(microsecond=0),
            deadline=(now + timedelta(seconds=timeout)).replace(microsecond=0),
            taken_over=(taken_over.taken_over or 0) + 1 if taken_over is not None else None,
        )

    def _outcome(self, state: Pass, seen: Outcome, creds: dict[str, str]) -> Setup:
        """The setup that ended, or its failure as a StepFailed: a stall (its deadline, or a call Gitea did not
        answer in time) at once with GiteaStalled; other errors of a ready Gitea as GiteaBootstrapFailed once
        they happened BOOTSTRAP_ATTEMPTS times in a row."""
        key = (state.env.namespace, state.env.name)
        try:
            setup: Setup = seen.result()
        except (TimeoutError, GiteaTimedOut) as exc:
            why = (
                f"did not finish within {self.deps.config.gitea_setup_timeout:g}s in total"
                if isinstance(exc, TimeoutError)
                else f"stopped answering ({copyin.redact(str(exc), creds.values())})"
            )
            raise StepFailed(
                "GiteaStalled",
                "GiteaStalled",
                f"the setup of Gitea {why}: its Pod is Ready but its API stalls; the operator tries again "
                f"every {RETRY_SECONDS:g}s",
                retry=RETRY_SECONDS,
            ) from None
        except GiteaError as exc:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            message = copyin.redact(str(exc), creds.values())
            if failures >= BOOTSTRAP_ATTEMPTS:
                raise StepFailed(
                    "GiteaBootstrapFailed",
                    "GiteaBootstrapFailed",
                    f"Gitea is running but could not be set up after {failures} attempts: {message}",
                    retry=RETRY_SECONDS,
                ) from None
            raise StepFailed(None, "GiteaBootstrapRetrying", f"setting up Gitea: {message}") from None
        self._failures.pop(key, None)
        return setup

    def _conclude(self, state: Pass, setup: Setup, creds: dict[str, str]) -> None:
        """Gitea is set up: its Pod and token noted, the sources whose snapshots it lost left for the copy-in."""
        env = state.env
        creds[c.GITEA_SECRET_TOKEN] = setup.token  # the Secret in the cache may not have it yet
        if setup.pod_uid is not None:
            state.status.gitea_pod_uid = setup.pod_uid
        message = "Gitea is up; organizations and repositories exist"
        lost = setup.lost
        if lost:
            # Pushed again by the copy-in step, from the workspace as it is now.
            state.status.sources = [s for s in state.status.sources or () if s.name not in lost]
            what = (
                f"Gitea lost its data (its Pod was replaced and its storage is an emptyDir, "
                f"spec.gitea.persistence.enabled: false): the snapshots of {', '.join(lost)} are pushed again "
                "from the workspace as it is now; branches pushed by promote or publish are gone"
            )
            self.deps.recorder.warn(env.body, reason="GiteaDataLost", message=what)
            message = f"{message}; {what}"
        state.set(c.COND_GITEA_READY, True, "GiteaReady", message)
        state.mark("gitea_ready")
        if setup.created:
            self.deps.recorder.info(
                env.body, reason="GiteaBootstrapped", message=f"Created in Gitea: {', '.join(setup.created)}"
            )

    async def _bootstrap(
        self,
        state: Pass,
        creds: dict[str, str],
        plans: list[SourcePlan],
        copied: dict[str, str],
    ) -> tuple[list[str], list[str], str]:
        """Token, organizations, repositories: each created only when missing. Returns what was created, the
        copied-in sources (`copied`: name -> snapshot branch) whose branch Gitea does not have, and the token."""
        env, open_gitea = state.env, self.deps.open_gitea
        url = self.deps.gitea_api_url(state.named)
        username = creds[c.GITEA_SECRET_USERNAME]
        token = creds.get(c.GITEA_SECRET_TOKEN)
        if token:
            async with open_gitea(url, username=username, token=token) as probe:
                try:
                    await probe.whoami()
                except GiteaError as exc:
                    if exc.status != 401:
                        raise
                    token = None  # Gitea's data was lost (volume recreated): make a new token
        if not token:
            async with open_gitea(url, username=username, password=creds[c.GITEA_SECRET_PASSWORD]) as admin:
                token = await admin.create_token()
            name = res.gitea_secret_name(state.instance)
            await self.deps.client.patch(
                SECRET, env.namespace, name, {"stringData": {c.GITEA_SECRET_TOKEN: token}}
            )
            creds[c.GITEA_SECRET_TOKEN] = token
        created: list[str] = []
        lost: list[str] = []
        orgs = {p.org for p in plans} | {r.to for r in env.spec.git_rewrites or ()}
        async with open_gitea(url, username=username, token=token) as gitea:
            for org in sorted(orgs):
                if await gitea.ensure_org(org):
                    created.append(org)
            for plan in plans:
                _, new = await gitea.ensure_repo(plan.org, plan.repo)
                if new:
                    created.append(plan.full_repo)
                branch = copied.get(plan.name)
                if branch is not None and await gitea.branch_commit(plan.org, plan.repo, branch) is None:
                    lost.append(plan.name)
        return created, lost, token
