"""Fakes for the unit tests of the reconcilers and of the environment's steps.

- `FakeApiServer`: the API server as the engine's `Client` talks to it (clients/kube.py `Kube`), objects in
  memory by REST path; a reconciler's test runs the real engine client and cache over it (`reconciler_deps`).
- The small ports the environment's steps talk through (controllers/environment/state.py: Ports): a child
  client that records writes, a runtime and a Gitea that answer from what the test put in them.
- An event recorder both use. The cache is always the real one (an in-memory store)."""

from __future__ import annotations

import asyncio
import copy
import itertools
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from shadow_operator.api.environment import ShadowEnvironment, ShadowEnvironmentStatus
from shadow_operator.api.kinds import ResourceKind
from shadow_operator.clients.gitea import Gitea, GiteaError
from shadow_operator.clients.gitpush import PushSettings
from shadow_operator.clients.kube import ApiError
from shadow_operator.clients.pacing import Slots
from shadow_operator.clients.runtime import ExecutionResult, Runtime, RuntimeStalled, RuntimeUnavailable
from shadow_operator.controllers.config import Config
from shadow_operator.controllers.environment.state import Pass, Ports, StepFailed
from shadow_operator.engine import Client, Deps, NotOwned, Reconciler
from shadow_operator.engine.cache import Body, Cache

NAMESPACE = "team"
T = TypeVar("T")


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
        self.status_patches: list[tuple[str, str, dict[str, Any]]] = []

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

    async def patch_status(
        self, kind: ResourceKind, obj: Mapping[str, Any], status: Mapping[str, Any]
    ) -> Body | None:
        self.status_patches.append((kind.kind, obj["metadata"]["name"], copy.deepcopy(dict(status))))
        return dict(obj)


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
        self.answers: list[tuple[str, ExecutionResult]] = []
        self.calls: list[str] = []
        self.idle = 0.0
        self.baseline = False
        self.unavailable: str | None = None
        self.stalled: str | None = None  # a real runtime's stall: tests/runtime/test_transfer_pace.py
        self.tree_bytes = 0
        self.processes: dict[str, ExecutionResult] = {}  # background processes, by id
        self.removed: list[str] = []

    async def __aenter__(self) -> FakeRuntime:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    def _reach(self, call: str) -> None:
        self.calls.append(call)
        if self.unavailable:
            raise RuntimeUnavailable(self.unavailable)
        if self.stalled:
            raise RuntimeStalled(self.stalled)

    async def sh(
        self,
        script: str,
        *,
        env: dict[str, str] | None = None,
        cwd: str = "",
        timeout: float = 60.0,
        tag: str = "",
    ) -> ExecutionResult:
        self._reach(f"sh {tag}")
        return self._answer(script)

    def _answer(self, script: str) -> ExecutionResult:
        for fragment, result in self.answers:
            if fragment in script:
                return result
        return ExecutionResult(exit_code=0, stdout="", stderr="", timed_out=False)

    async def start(
        self, script: str, *, env: dict[str, str] | None = None, cwd: str = "", timeout: float, tag: str
    ) -> str:
        """A background process, ended at once with the answer `sh` would give."""
        self._reach(f"start {tag}")
        process_id = f"p{len(self.processes) + 1}"
        self.processes[process_id] = self._answer(script)
        return process_id

    async def running(self, process_id: str) -> bool | None:
        self._reach("running")
        return False if process_id in self.processes else None

    async def result(self, process_id: str) -> ExecutionResult | None:
        self._reach("result")
        return self.processes.get(process_id)

    async def remove(self, process_id: str) -> None:
        self._reach("remove")
        self.removed.append(process_id)

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
        self.stalled = False  # every call waits for ever (a real one: tests/integration, StallingServer)
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

    async def _check(self) -> None:
        if self.server.stalled:
            await asyncio.Event().wait()
        if self.server.fail_with is not None:
            raise self.server.fail_with

    async def whoami(self) -> dict[str, Any]:
        await self._check()
        if self.token not in self.server.tokens:
            raise GiteaError("whoami", 401, "unauthorized")
        return {"login": "shadow-admin"}

    async def create_token(self) -> str:
        await self._check()
        token = f"token-{len(self.server.tokens) + 1}"
        self.server.tokens.append(token)
        return token

    async def ensure_org(self, org: str) -> bool:
        await self._check()
        new = org not in self.server.orgs
        self.server.orgs.add(org)
        return new

    async def ensure_repo(self, org: str, repo: str) -> tuple[dict[str, Any], bool]:
        await self._check()
        new = f"{org}/{repo}" not in self.server.repos
        self.server.repos.add(f"{org}/{repo}")
        return {}, new

    async def set_default_branch(self, org: str, repo: str, branch: str) -> None:
        await self._check()

    async def branch_commit(self, org: str, repo: str, branch: str) -> str | None:
        await self._check()
        return self.server.branches.get(f"{org}/{repo}@{branch}")


class World:
    """Ports wired to fakes, and the runtimes and Gitea behind them."""

    def __init__(self, config: Config | None = None) -> None:
        self.client = FakeClient()
        self.cache = Cache()
        self.recorder = FakeRecorder()
        self.gitea = FakeGitea()
        self.runtimes: dict[str, FakeRuntime] = {}
        self.deps = Ports(
            client=self.client,
            cache=self.cache,
            recorder=self.recorder,
            config=config or Config(),
            push_settings=PushSettings(
                work_dir=None, max_bundle_bytes=1 << 20, slots=Slots(total=1, per_namespace=1)
            ),
            open_runtime=self._open_runtime,
            open_gitea=self.gitea.open,
        )

    def runtime(self, url: str) -> FakeRuntime:
        return self.runtimes.setdefault(url, FakeRuntime(url))

    def _open_runtime(self, url: str, token: str | None, config: Config) -> Runtime:
        runtime = self.runtime(url)
        runtime.token = token
        return cast(Runtime, runtime)


def to_patch(status: ShadowEnvironmentStatus) -> dict[str, Any]:
    """The status as the environment wrote it before engine/status.py (every field the old status or a step
    set; None clears a field): what a test reads a pass's status as, and builds the next pass's from."""
    patch = status.model_dump(by_alias=True, mode="json", exclude_unset=True)
    patch.setdefault("failure", None)
    return {k: _no_nulls_in_lists(v) for k, v in patch.items()}


def _no_nulls_in_lists(value: Any, in_list: bool = False) -> Any:
    """A null in an object deletes the field (merge patch); in a list's item it would be stored as null,
    which the schema refuses: list items carry only the fields that have a value."""
    if isinstance(value, list):
        return [_no_nulls_in_lists(v, True) for v in value]
    if isinstance(value, dict):
        return {k: _no_nulls_in_lists(v, in_list) for k, v in value.items() if not (in_list and v is None)}
    return value


FIXED_NOW = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)


def new_pass(env: ShadowEnvironment, now: datetime = FIXED_NOW) -> Pass:
    return Pass(env, now=lambda: now)


async def settle(world: World, state: Pass, step: Callable[[], Awaitable[T]]) -> T:
    """Run `step` on `state`, and again each time it left an operation under way in status.operation (or
    status.giteaOperation), once the operation ended (what the pass its end wakes does); its last answer."""
    while True:
        try:
            answer = await step()
        except StepFailed:
            if not _under_way(state):
                raise
        else:
            if not _under_way(state):
                return answer
        await world.deps.operations.settled()


def _under_way(state: Pass) -> bool:
    return state.status.operation is not None or state.status.gitea_operation is not None


# ---------------------------------------------------------------------------------------- the API server
def merge(target: Any, patch: Any) -> Any:
    """RFC 7386: what a JSON merge patch makes of `target`."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def _created(body: Body) -> Body:
    """What the API server adds to an object it creates (the resourceVersion: on every write)."""
    meta = body["metadata"]
    meta.setdefault("uid", f"uid-{meta['name']}")
    meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
    meta.setdefault("generation", 1)
    return body


class FakeApiServer:
    """Objects by REST path, with what the reconcilers rely on: uid and resourceVersion stamped on create,
    AlreadyExists, a merge patch naming a resourceVersion applied only to that version (409), delete
    preconditions, and the status subresource. No admission, no garbage collection: a test sees exactly the
    writes a pass made (`writes`: (verb, path))."""

    def __init__(self) -> None:
        self.objects: dict[str, Body] = {}
        self.writes: list[tuple[str, str]] = []
        self._versions = itertools.count(1)
        self._names = itertools.count(1)
        self.refuse: dict[str, ApiError] = {}  # path -> the error a write there answers with

    def put(self, kind: ResourceKind, body: Body) -> Body:
        """Store an object as if someone else had created it (no write recorded)."""
        meta = body["metadata"]
        stored = copy.deepcopy(body)
        stored.setdefault("apiVersion", kind.api_version)
        stored.setdefault("kind", kind.kind)
        return self._bump(kind.path(meta.get("namespace"), meta["name"]), _created(stored))

    def body(self, kind: ResourceKind, namespace: str, name: str) -> Body | None:
        return self.objects.get(kind.path(namespace, name))

    def _write(self, verb: str, path: str) -> None:
        self.writes.append((verb, path))
        if path in self.refuse:
            raise self.refuse[path]

    def _stored(self, path: str) -> Body:
        if path not in self.objects:
            raise ApiError(404, "NotFound", f"{path} not found")
        return self.objects[path]

    def _bump(self, path: str, body: Body) -> Body:
        body["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[path] = body
        return copy.deepcopy(body)

    async def get(self, path: str) -> Body | None:
        found = self.objects.get(path)
        return copy.deepcopy(found) if found is not None else None

    async def list(self, path: str, *, labels: str | None = None, fields: str | None = None) -> list[Body]:
        def collection(p: str) -> str:
            return p.rsplit("/", 1)[0]

        return [
            copy.deepcopy(body)
            for p, body in self.objects.items()
            if collection(p) == path or re.sub(r"/namespaces/[^/]+", "", collection(p)) == path
        ]

    async def create(self, path: str, body: Mapping[str, Any]) -> Body:
        stored = copy.deepcopy(dict(body))
        if "name" not in stored["metadata"]:  # generateName: a suffix of our own
            stored["metadata"]["name"] = f"{stored['metadata']['generateName']}{next(self._names):05d}"
        name = stored["metadata"]["name"]
        self._write("create", f"{path}/{name}")
        if f"{path}/{name}" in self.objects:
            raise ApiError(409, "AlreadyExists", f"{name} already exists")
        return self._bump(f"{path}/{name}", _created(stored))

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Body:
        subresource = path.endswith("/status")
        target = path.removesuffix("/status")
        self._write("status" if subresource else "patch", target)
        current = self._stored(target)
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f"{target} has been modified")
        if subresource:
            return self._bump(target, {**current, "status": merge(current.get("status"), patch["status"])})
        return self._bump(target, merge(current, patch))

    async def json_patch(self, path: str, ops: Sequence[Mapping[str, Any]]) -> Body:
        self._write("patch", path)
        current = copy.deepcopy(self._stored(path))
        for op in ops:
            assert op["op"] in ("add", "replace"), op
            *parents, leaf = op["path"].strip("/").split("/")
            node = current
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = copy.deepcopy(op["value"])
        return self._bump(path, current)

    async def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = True
    ) -> Body:
        self._write("apply", path)
        current = self._stored(path)
        return self._bump(path, merge(current, dict(body)))

    async def delete(
        self,
        path: str,
        *,
        propagation: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        grace_seconds: int | None = None,
    ) -> bool:
        self._write("delete", path)
        current = self.objects.get(path)
        if current is None:
            return False
        meta = current["metadata"]
        if (uid and uid != meta["uid"]) or (resource_version and resource_version != meta["resourceVersion"]):
            raise ApiError(409, "Conflict", f"{path}: precondition failed")
        del self.objects[path]
        return True


class Harness:
    """A reconciler over the real engine client and cache, the API server in memory, events recorded.

    `sync()` fills the cache from the API server, as the informers would (a reconciler reads its children
    from the cache); `run(obj)` validates the primary object, as the engine does, and runs one pass."""

    def __init__(
        self,
        reconciler: type[Reconciler[Any]],
        config: Config | None = None,
        api: FakeApiServer | None = None,  # another reconciler's: two controllers on one API server
    ) -> None:
        self.api = api or FakeApiServer()
        self.cache = Cache()
        self.recorder = FakeRecorder()
        self.client = Client(cast(Any, self.api), self.cache)
        self.woken: list[tuple[tuple[str, str], float]] = []
        kinds = {reconciler.kind, *reconciler.owns, *(w.kind for w in reconciler.watches)}
        kinds |= {cached.kind for cached in reconciler.cached}
        self.kinds = kinds
        for kind in kinds:
            self.cache.store(kind)
        for index in reconciler.indexes:
            self.cache.store(index.kind).add_index(index.name, index.func)
        deps = Deps(
            client=self.client,
            cache=self.cache,
            recorder=cast(Any, self.recorder),
            config=config or Config(),
            enqueue=lambda key, delay: self.woken.append((key, delay)),
        )
        self.reconciler = reconciler(deps)

    def put(self, kind: ResourceKind, body: Body) -> Body:
        stored = self.api.put(kind, body)
        if self.cache.has(kind):
            self.cache.store(kind).upsert(copy.deepcopy(stored))
        return stored

    def sync(self) -> None:
        """The cache as the informers would have it now: every object of a cached kind, none that is gone."""
        for kind in self.kinds:
            store = self.cache.store(kind)
            prefix = kind.path()
            live = {
                p: body
                for p, body in self.api.objects.items()
                if re.sub(r"/namespaces/[^/]+", "", p.rsplit("/", 1)[0]) == prefix
            }
            for body in store.list():
                meta = body["metadata"]
                if kind.path(meta.get("namespace"), meta["name"]) not in live:
                    store.remove(meta.get("namespace") or "", meta["name"])
            for body in live.values():
                store.upsert(copy.deepcopy(body))

    def get(self, kind: ResourceKind, namespace: str, name: str) -> Body:
        found = self.api.body(kind, namespace, name)
        assert found is not None, f"{kind} {namespace}/{name} does not exist"
        return found

    async def run(self, kind: ResourceKind, namespace: str, name: str) -> float | None:
        """One pass over the object as stored now (the cache synced first)."""
        self.sync()
        model = cast(Any, kind.model)
        obj = model.from_body(copy.deepcopy(self.get(kind, namespace, name)))
        return await self.reconciler.reconcile(obj)

    def writes(self, verb: str | None = None) -> list[str]:
        """The paths written since the last call, of one verb or all (as "verb path")."""
        found = [f"{v} {p}" if verb is None else p for v, p in self.api.writes if verb in (None, v)]
        self.api.writes.clear()
        return found


def template(name: str = "workspace") -> Body:
    """A SandboxTemplate whose sandboxes run one container with the runtime port."""
    container = {"name": "main", "image": "runtime", "ports": [{"name": "runtime", "containerPort": 8888}]}
    return {
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"podTemplate": {"spec": {"containers": [container]}}},
    }


def make_ready(harness: Harness, kind: ResourceKind, name: str, **status: Any) -> Body:
    """What the Sandbox controller would write of a sandbox whose Pod is Ready (and `status` besides)."""
    body = harness.get(kind, NAMESPACE, name)
    ready = {"type": "Ready", "status": "True", "reason": "DependenciesReady", "message": "Pod is Ready",
             "lastTransitionTime": "2026-01-01T00:00:05Z"}  # fmt: skip
    body["status"] = {**(body.get("status") or {}), "conditions": [ready], **status}
    return harness.api.put(kind, body)
