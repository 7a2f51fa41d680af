"""The Gitea step: its Secret (credentials generated once), Service, NetworkPolicies and StatefulSet, then the
bootstrap once its Pod is Ready: the operator's API token, one organization per owner, one repository per
source.

Gitea's data is on an emptyDir unless spec.gitea.persistence.enabled, so a new Gitea Pod may start empty: the
bootstrap runs again for every new Pod (status.giteaPodUID), and a copied-in source whose snapshot branch
Gitea no longer has is dropped from status.sources, for the copy-in step to push it again."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

from shadow_operator.api import constants as c
from shadow_operator.api.kinds import POD, SECRET, STATEFUL_SET
from shadow_operator.api.models import ObjectMeta
from shadow_operator.clients.gitea import GiteaError
from shadow_operator.common.sources import SourcePlan
from shadow_operator.controllers.environment.state import Pass, Ports, StepFailed, plans, secret_data
from shadow_operator.engine.cache import Body, Key
from shadow_operator.resources import copyin, gitea_policy
from shadow_operator.resources import environment as res
from shadow_operator.resources.metadata import controller_uid

RETRY_SECONDS = 30.0
BOOTSTRAP_ATTEMPTS = 20  # consecutive failures of a ready Gitea before GiteaBootstrapFailed


class GiteaStep:
    """Keeps, per environment, how often the bootstrap of a running Gitea failed in a row."""

    def __init__(self, deps: Ports) -> None:
        self.deps = deps
        self._failures: dict[Key, int] = {}

    def forget(self, key: Key) -> None:
        self._failures.pop(key, None)

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
        """Whether Gitea is up and bootstrapped for this generation; bootstraps it when it just came up."""
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
        copied = {s.name: s.branch for s in state.status.sources or ()}
        try:
            created, lost = await self._bootstrap(state, creds, plans(state), copied)
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
        if pod_uid is not None:
            state.status.gitea_pod_uid = pod_uid
        message = "Gitea is up; organizations and repositories exist"
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
        if created:
            self.deps.recorder.info(
                env.body, reason="GiteaBootstrapped", message=f"Created in Gitea: {', '.join(created)}"
            )
        return True

    async def _bootstrap(
        self,
        state: Pass,
        creds: dict[str, str],
        plans: list[SourcePlan],
        copied: dict[str, str],
    ) -> tuple[list[str], list[str]]:
        """Token, organizations, repositories: each created only when missing. Returns what was created, and
        the copied-in sources (`copied`: name -> snapshot branch) whose branch Gitea does not have."""
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
        return created, lost
