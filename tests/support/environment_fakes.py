"""Fakes of the small ports the environment's steps talk through (controllers/environment/state.py: Deps), for
their unit tests: a child client that records writes, an event recorder, a runtime and a Gitea that answer
from what the test put in them. The cache is the real one (an in-memory store)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

from shadow_operator.api.environment import ShadowEnvironment
from shadow_operator.api.kinds import ResourceKind
from shadow_operator.clients.gitea import Gitea, GiteaError
from shadow_operator.clients.gitpush import PushSettings
from shadow_operator.clients.kube import ApiError
from shadow_operator.clients.runtime import ExecResult, Runtime, RuntimeUnavailable
from shadow_operator.controllers.config import Config
from shadow_operator.controllers.environment.state import Deps, Pass
from shadow_operator.engine import NotOwned
from shadow_operator.engine.cache import Body, Cache

NAMESPACE = "team"


def environment(
    name: str = "demo",
    *,
    spec: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    generation: int = 1,
) -> ShadowEnvironment:
    body: dict[str, Any] = {
        "apiVersion": "shadow.dev/v1alpha1",
        "kind": "ShadowEnvironment",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "generation": generation,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": annotations or {},
        },
        "spec": spec
        if spec is not None
        else {"sources": [{"name": "app", "repo": "acme/app", "upload": {}}]},
    }
    if status is not None:
        body["status"] = status
    return ShadowEnvironment.from_body(body)


class FakeClient:
    """The engine client's surface the steps use; objects live in a dict, writes are recorded."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Body] = {}
        self.writes: list[tuple[str, str, str]] = []
        self.missing_kinds: set[str] = set()  # list_live answers 404 for these (an API not installed)

    def put(self, kind: ResourceKind, body: Body) -> None:
        meta = body["metadata"]
        self.objects[(kind.kind, meta.get("namespace") or "", meta["name"])] = body

    async def apply(
        self, kind: ResourceKind, desired: Mapping[str, Any], *, owner: Mapping[str, Any]
    ) -> Body:
        meta = desired["metadata"]
        key = (kind.kind, meta.get("namespace") or "", meta["name"])
        current = self.objects.get(key)
        owner_uid = owner["metadata"]["uid"]
        if current is not None and current["metadata"].get("ownerUid") != owner_uid:
            raise NotOwned(current, f"{kind} {meta['name']} is not ours")
        body = copy.deepcopy(dict(desired))
        body["metadata"]["ownerUid"] = owner_uid
        body["metadata"].setdefault("uid", f"uid-{kind.kind.lower()}-{meta['name']}")
        if current is not None and "status" in current:
            body["status"] = current["status"]
        self.objects[key] = body
        self.writes.append(("apply", kind.kind, meta["name"]))
        return body

    async def get_live(self, kind: ResourceKind, namespace: str, name: str) -> Body | None:
        return self.objects.get((kind.kind, namespace, name))

    async def list_live(self, kind: ResourceKind) -> list[Body]:
        if kind.kind in self.missing_kinds:
            raise ApiError(404, "NotFound", f"{kind} is not installed")
        return [body for (k, _, _), body in self.objects.items() if k == kind.kind]

    async def create(self, kind: ResourceKind, body: Mapping[str, Any]) -> Body:
        self.put(kind, copy.deepcopy(dict(body)))
        self.writes.append(("create", kind.kind, body["metadata"]["name"]))
        return dict(body)

    async def patch(self, kind: ResourceKind, namespace: str, name: str, patch: Mapping[str, Any]) -> Body:
        body = self.objects.setdefault((kind.kind, namespace, name), {"metadata": {"name": name}})
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != body["metadata"].get("resourceVersion"):
            # As the API server: a merge patch naming a resourceVersion applies only to that version.
            raise ApiError(409, "Conflict", f"{kind} {name} has been modified")
        for field, value in patch.items():
            body.setdefault(field, {}).update(value)
        self.writes.append(("patch", kind.kind, name))
        return body

    async def delete(self, kind: ResourceKind, namespace: str, name: str, *, uid: str | None = None) -> bool:
        self.writes.append(("delete", kind.kind, name))
        return self.objects.pop((kind.kind, namespace, name), None) is not None


class FakeRecorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def info(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self.events.append(("Normal", reason, message))

    def warn(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        self.events.append(("Warning", reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]


class FakeRuntime:
    """A workspace's runtime: `sh` answers from `answers` (first script fragment that matches), else exit 0."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url, self.token = url, token
        self.answers: list[tuple[str, ExecResult]] = []
        self.calls: list[str] = []
        self.idle = 0.0
        self.baseline = False
        self.unavailable: str | None = None
        self.tree_bytes = 0

    async def __aenter__(self) -> FakeRuntime:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    def _reach(self, call: str) -> None:
        self.calls.append(call)
        if self.unavailable:
            raise RuntimeUnavailable(self.unavailable)

    async def sh(
        self,
        script: str,
        *,
        env: dict[str, str] | None = None,
        cwd: str = "",
        timeout: float = 60.0,
        tag: str = "",
    ) -> ExecResult:
        self._reach(f"sh {tag}")
        for fragment, result in self.answers:
            if fragment in script:
                return result
        return ExecResult(exit_code=0, stdout="", stderr="", timed_out=False)

    async def idle_seconds(self) -> float:
        self._reach("idle")
        return self.idle

    async def capture_baseline(self, exclude: list[str] | None = None) -> dict[str, Any]:
        self._reach("capture_baseline")
        self.baseline = True
        return {}

    async def has_baseline(self) -> bool:
        self._reach("has_baseline")
        return self.baseline

    async def flush(self) -> None:
        self._reach("flush")

    async def copy_tree_to(self, target: Any, path: str = "", *, timeout: float = 600.0) -> int:
        self._reach(f"copy {path or '/'} -> {target.url}")
        if path:
            target.baseline = True
        return self.tree_bytes


class FakeGitea:
    """One Gitea server's state, shared by every client the step opens on it."""

    def __init__(self) -> None:
        self.orgs: set[str] = set()
        self.repos: set[str] = set()
        self.branches: dict[str, str] = {}  # "org/repo@branch" -> commit
        self.tokens: list[str] = []
        self.fail_with: GiteaError | None = None
        self.opened: list[dict[str, Any]] = []

    def open(
        self, url: str, username: str = "", token: str | None = None, password: str | None = None
    ) -> Gitea:
        self.opened.append({"url": url, "username": username, "token": token, "password": password})
        return cast(Gitea, _GiteaClient(self, token))


class _GiteaClient:
    def __init__(self, server: FakeGitea, token: str | None) -> None:
        self.server, self.token = server, token

    async def __aenter__(self) -> _GiteaClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    def _check(self) -> None:
        if self.server.fail_with is not None:
            raise self.server.fail_with

    async def whoami(self) -> dict[str, Any]:
        self._check()
        if self.token not in self.server.tokens:
            raise GiteaError("whoami", 401, "unauthorized")
        return {"login": "shadow-admin"}

    async def create_token(self) -> str:
        self._check()
        token = f"token-{len(self.server.tokens) + 1}"
        self.server.tokens.append(token)
        return token

    async def ensure_org(self, org: str) -> bool:
        self._check()
        new = org not in self.server.orgs
        self.server.orgs.add(org)
        return new

    async def ensure_repo(self, org: str, repo: str) -> tuple[dict[str, Any], bool]:
        self._check()
        new = f"{org}/{repo}" not in self.server.repos
        self.server.repos.add(f"{org}/{repo}")
        return {}, new

    async def set_default_branch(self, org: str, repo: str, branch: str) -> None:
        self._check()

    async def branch_commit(self, org: str, repo: str, branch: str) -> str | None:
        self._check()
        return self.server.branches.get(f"{org}/{repo}@{branch}")


class World:
    """Deps wired to fakes, and the runtimes and Gitea behind them."""

    def __init__(self, config: Config | None = None) -> None:
        self.client = FakeClient()
        self.cache = Cache()
        self.recorder = FakeRecorder()
        self.gitea = FakeGitea()
        self.runtimes: dict[str, FakeRuntime] = {}
        self.deps = Deps(
            client=self.client,
            cache=self.cache,
            recorder=self.recorder,
            config=config or Config(),
            push_settings=PushSettings(work_dir=None, max_bundle_bytes=1 << 20, slots=asyncio.Semaphore(1)),
            open_runtime=self._open_runtime,
            open_gitea=self.gitea.open,
        )

    def runtime(self, url: str) -> FakeRuntime:
        return self.runtimes.setdefault(url, FakeRuntime(url))

    def _open_runtime(self, url: str, token: str | None, limit: int) -> Runtime:
        runtime = self.runtime(url)
        runtime.token = token
        return cast(Runtime, runtime)


FIXED_NOW = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)


def new_pass(env: ShadowEnvironment, now: datetime = FIXED_NOW) -> Pass:
    return Pass(env, now=lambda: now)
