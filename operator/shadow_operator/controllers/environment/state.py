"""What every step shares: the typed status of one pass, the step outcome, and the ports a step talks through.

The base layer of the package (see pyproject.toml's contract): steps import this module and `pushes`, never one
another nor the reconciler. The status is `ShadowEnvironmentStatus`, validated once by the engine at the
boundary; a step changes its fields and the reconciler writes the model back (by alias, only the fields set).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from shadow_operator.api import constants as c
from shadow_operator.api import naming
from shadow_operator.api.environment import (
    Failure,
    PhaseTimings,
    ShadowEnvironment,
    ShadowEnvironmentStatus,
)
from shadow_operator.api.kinds import SECRET, ResourceKind
from shadow_operator.api.models import Secret
from shadow_operator.clients.gitea import Gitea
from shadow_operator.clients.gitpush import PushSettings
from shadow_operator.clients.runtime import Runtime
from shadow_operator.common.sources import SourcePlan, plan_sources
from shadow_operator.controllers.config import Config
from shadow_operator.engine import NotOwned, Operations
from shadow_operator.engine.cache import Body, Cache
from shadow_operator.engine.status import StatusPass
from shadow_operator.resources import environment as res

POLL_SECONDS = 3.0  # while Pods start: start-up failures must show quickly
RETRY_SECONDS = 30.0  # after a failure that may heal (a source that could not be fetched, a missing class)
# VolumeSnapshots are not watched (their API is optional): one is read this often while it is being cut, and
# more often in its first seconds, when a copy-on-write snapshot is ready (it holds back the fork's volume).
SNAPSHOT_POLL_SECONDS = 0.5
SNAPSHOT_EARLY_POLL_SECONDS = 0.2
SNAPSHOT_EARLY_SECONDS = 5.0


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


# ------------------------------------------------------------------------------------------------ ports
class Children(Protocol):
    """The engine's client, as far as the steps use it (engine.Client is one)."""

    async def apply(
        self, kind: ResourceKind, desired: Mapping[str, Any], *, owner: Mapping[str, Any]
    ) -> Body: ...

    async def get_live(self, kind: ResourceKind, namespace: str, name: str) -> Body | None: ...

    async def list_live(self, kind: ResourceKind) -> list[Body]: ...

    async def create(self, kind: ResourceKind, body: Mapping[str, Any]) -> Body: ...

    async def patch(
        self, kind: ResourceKind, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Body: ...

    async def delete(
        self, kind: ResourceKind, namespace: str, name: str, *, uid: str | None = None
    ) -> bool: ...


class Recorder(Protocol):
    def info(self, obj: Mapping[str, Any], reason: str, message: str) -> None: ...

    def warn(self, obj: Mapping[str, Any], reason: str, message: str) -> None: ...


# (url, token, the operator's settings) -> a runtime client; (url, username, token, password) -> a Gitea client.
OpenRuntime = Callable[[str, str | None, Config], Runtime]
OpenGitea = Callable[..., Gitea]


@dataclass
class Ports:
    """What the steps are given: the engine's client and cache, events, settings, and the two API clients."""

    client: Children
    cache: Cache
    recorder: Recorder
    config: Config
    push_settings: PushSettings
    # Long work (copy-in, a fork's copy) runs here, off the reconcile workers (engine/operations.py).
    operations: Operations = field(default_factory=lambda: Operations(lambda key, delay: None))
    open_runtime: OpenRuntime = field(
        default=lambda url, token, config: Runtime(
            url, token, max_answer_bytes=config.runtime_max_answer_bytes, pace=config.transfer_pace
        )
    )
    open_gitea: OpenGitea = Gitea

    def runtime_for(self, namespace: str, name: str, url: str | None) -> Runtime:
        """The runtime of the workspace Sandbox `name` (an environment's, named like it)."""
        url = self.config.runtime_api_url or url
        if not url:
            raise StepFailed(None, "RuntimeUnknown", f"the workspace {name} has no runtime URL yet")
        secret = self.cache.store(SECRET).get(namespace, naming.token_secret_name(name))
        token = secret_data(secret).get(c.RUNTIME_TOKEN_KEY) if secret else None
        return self.open_runtime(url, token, self.config)

    def gitea_api_url(self, named: Body) -> str:
        """Gitea's API, of the environment's instance (`Pass.named`)."""
        return self.config.gitea_api_url or res.gitea_url(named, self.config.cluster_domain)

    async def apply(self, kind: ResourceKind, manifest: dict[str, Any], env: ShadowEnvironment) -> Body:
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


def secret_data(secret: Body | None) -> dict[str, str]:
    """A Secret's values as text (none when there is no Secret)."""
    return Secret.model_validate(secret).values() if secret is not None else {}


# ------------------------------------------------------------------------------------------- the pass
class Pass(StatusPass[ShadowEnvironmentStatus]):
    """The status being built in one pass: the typed status of the environment, changed by the steps.

    Conditions are merged with the old ones (their transition times kept); every other field is replaced by
    what the steps set. `timings` records when each phase first finished (never moved once set).
    """

    def __init__(self, env: ShadowEnvironment, now: Callable[[], datetime] | None = None) -> None:
        self.now = now or (lambda: datetime.now(UTC))
        super().__init__(env, ShadowEnvironmentStatus, now=self.now)
        self.env = env
        self.generation = env.metadata.generation
        self.failure: Failure | None = None
        self.stopped_at: str | None = None  # reason of the step that could not complete in this pass

    # ---------------------------------------------------------------------------------------- instance
    @property
    def instance(self) -> str:
        """What the workspace Sandbox and Gitea's objects are named after: the environment's own name, or
        the pool instance it took (status.sandbox, set once by the pool step)."""
        return self.status.sandbox or self.env.name

    @property
    def named(self) -> dict[str, Any]:
        """The environment's body under its instance's name: what the builders make its children from."""
        body = dict(self.env.body)
        body["metadata"] = {**self.env.body["metadata"], "name": self.instance}
        return body

    # ------------------------------------------------------------------------------------- conditions
    def set(self, type_: str, status: bool, reason: str, message: str) -> None:
        self.conditions.set(type_, status, reason, message)

    def remove(self, type_: str) -> None:
        self.conditions.remove(type_)

    def is_true(self, type_: str) -> bool:
        return self.conditions.is_true(type_)

    def fail(self, failed: StepFailed) -> None:
        if failed.code is not None:
            self.failure = Failure.model_validate({"code": failed.code, "message": failed.message})
        self.stopped_at = failed.reason
        self.set(c.COND_READY, False, failed.reason, failed.message)

    # ---------------------------------------------------------------------------------------- timings
    def mark(self, phase: str) -> None:
        """Record that `phase` (a PhaseTimings field) finished now, unless it already had."""
        timings = self.status.timings or PhaseTimings()
        if getattr(timings, phase) is None:
            setattr(timings, phase, self.now())
            self.status.timings = timings

    # ----------------------------------------------------------------------------------------- verdict
    @property
    def ready(self) -> bool:
        return all(self.is_true(t) for t in self._needed())

    def _needed(self) -> list[str]:
        needed = [c.COND_WORKSPACE_READY, c.COND_GITEA_READY, c.COND_SOURCES_READY]
        if not self.env.spec.gitea.enabled:
            needed.remove(c.COND_GITEA_READY)
        return needed

    def waiting_for(self) -> str:
        return ", ".join(t for t in self._needed() if not self.is_true(t)) or "nothing"

    def finish(self) -> ShadowEnvironmentStatus:
        """The status to write: Ready derived from the other conditions, the failure (None clears it)."""
        if self.failure is not None:
            self.set(c.COND_READY, False, self.failure.code, self.failure.message)
        elif self.ready:
            self.set(c.COND_READY, True, "EnvironmentReady", "workspace, Gitea and sources are ready")
            self.mark("ready")
        elif self.stopped_at is None:
            self.set(c.COND_READY, False, "Progressing", f"waiting for {self.waiting_for()}")
        self.status.observed_generation = self.generation
        self.status.failure = self.failure
        return super().finish()


def plans(state: Pass) -> list[SourcePlan]:
    """Where each source goes; a fork's inherited sources (status.clone.sources) when spec.sources is unset."""
    clone = state.status.clone
    inherited = None
    if clone is not None and clone.sources is not None:
        inherited = [s.model_dump(by_alias=True) for s in clone.sources]
    return plan_sources(state.env.body, inherited)
