"""What a reconciler is: its primary kind, the kinds it owns, the watches that map other objects to its keys.

The shape of controller-runtime's builder (`For`, `Owns`, `Watches`), declared as class attributes:

    class PoolReconciler(Reconciler[SandboxWarmPool]):
        kind = SANDBOX_WARM_POOL                                 # For
        owns = (SANDBOX,)                                        # mapped back through controller refs
        watches = (Watch(SANDBOX_TEMPLATE, pools_of_template),)  # any object -> keys of our kind
        indexes = (Index(SANDBOX, "pool", pool_of_sandbox),)     # cache lookups it needs

        async def reconcile(self, pool: SandboxWarmPool) -> float | None: ...

The engine caches every kind named there, validates the primary object into its model before calling
`reconcile` (an object being deleted gets `deleted` instead), and hands the reconciler what it needs (`Deps`)
instead of module globals. Reconcilers never import one another: what one must learn from another's objects,
it declares as a watch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from shadow_operator.api.kinds import ResourceKind
from shadow_operator.api.models import Resource
from shadow_operator.engine.cache import Body, Cache, IndexFunc, Key
from shadow_operator.engine.client import Client
from shadow_operator.engine.events import EventRecorder
from shadow_operator.engine.operations import Operations

M = TypeVar("M", bound=Resource)
MapFunc = Callable[[Body, Cache], Iterable[Key]]


@dataclass(frozen=True)
class Watch:
    """Objects of `kind` wake the reconciler for the keys `map(obj, cache)` returns."""

    kind: ResourceKind
    map: MapFunc


@dataclass(frozen=True)
class Index:
    """A secondary index on the cache of `kind`: `func(obj)` yields the values the object is found by."""

    kind: ResourceKind
    name: str
    func: IndexFunc


@dataclass(frozen=True)
class Cached:
    """A kind to cache, optionally only the objects matching a server-side label selector."""

    kind: ResourceKind
    label_selector: str | None = None
    # True: objects matching `label_selector` in addition to those the kind is cached (and kopf-watched) by;
    # the engine lists and watches them itself (engine/feeds.py).
    additional: bool = False


@dataclass
class Deps:
    """What the engine injects into every reconciler."""

    client: Client
    cache: Cache
    recorder: EventRecorder
    config: Any
    # Wake a key of the reconciler's own kind, now or later (the work queue's `add`).
    enqueue: Callable[[Key, float], None]
    # Long work of its objects, off the workers (operations.py); None: one with the reconciler's own caps.
    operations: Operations | None = None


def controller_keys(owner_kind: ResourceKind) -> MapFunc:
    """The `Owns` mapping: an object -> its controller owner's key, when that owner is of `owner_kind`."""
    group = owner_kind.group + "/"

    def mapper(body: Body, _: Cache) -> Iterable[Key]:
        meta = body["metadata"]
        for ref in meta.get("ownerReferences") or ():
            if (
                ref.get("controller")
                and ref.get("kind") == owner_kind.kind
                and ref.get("apiVersion", "").startswith(group)
            ):
                yield meta.get("namespace") or "", ref["name"]

    return mapper


class Reconciler(Generic[M]):
    kind: ClassVar[ResourceKind]
    owns: ClassVar[tuple[ResourceKind, ...]] = ()
    watches: ClassVar[tuple[Watch, ...]] = ()
    indexes: ClassVar[tuple[Index, ...]] = ()
    # Extra kinds to cache (read but neither owned nor watched), and label selectors for cached kinds.
    cached: ClassVar[tuple[Cached, ...]] = ()
    workers: ClassVar[int] = 4
    # The most workers one namespace may hold at once (None: all but one), so one tenant cannot stall the rest.
    namespace_share: ClassVar[int | None] = None
    # Changes of owned objects wake the owner this much later, so a burst of them (a pool's members turning
    # Ready one by one) becomes one pass instead of one pass and one status write each.
    owns_delay: ClassVar[float] = 0.0

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.client = deps.client
        self.cache = deps.cache
        self.recorder = deps.recorder
        self.config = deps.config
        self.operations = (
            deps.operations
            if deps.operations is not None
            else Operations(
                deps.enqueue,
                total=self.workers,
                per_namespace=self.namespace_share or max(1, self.workers - 1),
            )
        )

    async def reconcile(self, obj: M) -> float | None:
        """Bring the world in line with `obj`; return seconds until the next wanted pass, or None. Never
        called for an object being deleted (`deleted` is)."""
        raise NotImplementedError

    async def deleted(self, key: Key) -> None:
        """The primary object is being deleted or gone (its children go by garbage collection); drop
        per-object state. May be called more than once for one object."""

    @classmethod
    def name(cls) -> str:
        return cls.kind.kind
